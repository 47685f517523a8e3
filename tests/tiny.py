"""Tiny random-weight targets and heads for fast, exact tests of the engine's invariants."""

from __future__ import annotations

import torch

from eagleviz.decoding.engine import Engine
from eagleviz.models.draft import random_head
from eagleviz.models.target import TargetModel


class TinyTokenizer:
    """Just enough of a tokenizer for the engine: token i decodes to a short distinct string."""

    chat_template = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 7 + 1 for c in text]}


def tiny_target(model_type: str = "llama", vocab: int = 32, seed: int = 0, layers: int = 4,
                dtype: torch.dtype = torch.float32, scale: float = 1.0, device: str = "cpu") -> TargetModel:
    """A randomly initialised Llama-family model (the same weights on any `device`). `scale` multiplies the LM
    head: larger = peakier outputs."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
                               eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(scale)
    hf.to(device)
    return TargetModel(hf, TinyTokenizer(), f"tiny-{model_type}")


def tiny_engine(model_type: str = "llama", arch: str = "eagle1", seed: int = 0, head_std: float = 0.5,
                **kwargs) -> Engine:
    target = tiny_target(model_type, seed=seed, **kwargs)
    return Engine(target, random_head(target, arch, seed=seed + 1, std=head_std), "random")
