"""Random-weight targets that need no files: `--model random` (the embedded model's shape) and the tests' tiny ones.

Greedy EAGLE equals plain greedy decoding for any weights, and what attention costs does not depend on what
the weights are, so a seeded random model proves the engine and times the kernel on a machine that holds no
model at all (docs/gpu-check.md). Its tokenizer is a stand-in that needs no files either: one token id per
character of the prompt, and every id decodes to "<id>" (outputs are ids, not text).
"""

from __future__ import annotations

import torch

from eagleviz.models.target import TargetModel

RANDOM_MODEL = "random"
# SmolLM2-135M-Instruct, the embedded model (its config.json): Llama, 30 layers, hidden 576, GQA 9/3, vocab 49,152
EMBEDDED_SHAPE = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                  "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                  "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                  "tie_word_embeddings": True}
RANDOM_ALPHABET = 255  # prompt characters map onto ids 1..255
RANDOM_INIT_STD = 0.03  # the weights' normal spread (Hugging Face's initializer_range; Llama's default 0.02)


class CharTokenizer:
    """Just enough of a tokenizer for the engine, with no files: character c is id ord(c) % alphabet + 1, id i
    decodes to "<i>". No chat template, no end-of-sequence token (runs stop at max_new_tokens)."""

    chat_template = None
    eos_token_id = None
    pad_token_id = None

    def __init__(self, alphabet: int = RANDOM_ALPHABET):
        self.alphabet = alphabet

    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(f"<{i}>" for i in ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % self.alphabet + 1 for c in text]}


def random_hf_model(shape: dict, seed: int = 0, dtype: torch.dtype = torch.float32, lm_head_scale: float = 1.0):
    """A Hugging Face causal LM of `shape` (config fields, model_type included) with weights from the seeded
    initialisation of its class, built on the CPU (the same weights whatever the device it moves to).
    lm_head_scale multiplies the LM head (untied first): larger = peakier next-token distributions."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(shape)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields, eos_token_id=None, bos_token_id=None,
                               pad_token_id=None)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    if lm_head_scale != 1.0:
        with torch.no_grad():
            if cfg.tie_word_embeddings:
                hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
                hf.config.tie_word_embeddings = False
            hf.lm_head.weight.mul_(lm_head_scale)
    return hf


def random_target(seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  kv_dtype: torch.dtype | None = None) -> TargetModel:
    """`--model random`: a seeded random-weight target of the embedded model's shape with the file-free
    `CharTokenizer`. Its LM head is its own, not tied to the embedding (tied, it predicts the token it reads,
    forever), and its weights spread a little wider than Llama's default (`RANDOM_INIT_STD`): at 0.02 a random
    30-layer model writes one to four tokens over and over, at 0.04 and beyond it is chaotic enough that fp16
    rounding moves its argmax by more than a near-tie. At 0.03 it falls into loops of a few to a dozen tokens,
    which even a random head's drafts follow now and then: accepted paths are committed, as with a trained
    head. (`gpu-check --model random` reports each run's distinct tokens and tau.)"""
    hf = random_hf_model(EMBEDDED_SHAPE | {"tie_word_embeddings": False, "initializer_range": RANDOM_INIT_STD}, seed,
                         dtype)
    hf.to(device)
    return TargetModel(hf, CharTokenizer(), f"random (seed {seed}, SmolLM2-135M's shape, untied LM head)",
                       kv_dtype=kv_dtype)
