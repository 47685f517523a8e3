"""Tiny draft-head checkpoints written in the exact layouts of published heads (eagleviz/models/layouts.py):
the config fields, file names, dtypes and key names of each, with random weights shaped for a tiny target."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from eagleviz.models.draft import DraftConfig, DraftHead

LAYOUT_CASES = ("eagle1", "eagle3-bin", "eagle3-safetensors", "specforge-eagle3", "speculators-eagle3",
                "speculators-eagle3-two-layers", "speculators-eagle", "vllm-prefixed-eagle3")
DRAFT_VOCAB = 8  # EAGLE-3 heads here draft among 8 of the tiny target's 32 tokens, as published heads do among 32k


def random_source_head(target, arch: str, seed: int = 0, num_layers: int = 1, draft_vocab: int | None = None,
                       norm_before_residual: bool = False) -> DraftHead:
    """A head with random weights everywhere (norms and biases included, so a misplaced key shows), with a
    reduced draft vocabulary and consistent d2t/t2d maps for EAGLE-3."""
    cfg = DraftConfig.for_target(target, arch, num_layers, draft_vocab)
    cfg = DraftConfig(**(vars(cfg) | {"norm_before_residual": norm_before_residual}))
    head = DraftHead(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if "norm" in name else 0.3) + ("norm" in name))
        if arch == "eagle3" and cfg.draft_vocab_size < cfg.vocab_size:
            used = torch.randperm(cfg.vocab_size, generator=gen)[:cfg.draft_vocab_size].sort().values
            head.d2t.copy_(used - torch.arange(cfg.draft_vocab_size))
            head.t2d.zero_()
            head.t2d[used] = True
    return head.eval()


def llama_fields(head: DraftHead, **extra) -> dict:
    """The LlamaConfig fields published heads write (yuhuili/EAGLE-*: no head_dim, torch_dtype float16)."""
    c = head.config
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": c.hidden_size, "initializer_range": 0.02, "intermediate_size": c.intermediate_size,
            "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": c.num_heads,
            "num_hidden_layers": 1, "num_key_value_heads": c.num_kv_heads, "pad_token_id": 0,
            "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": False, "torch_dtype": "float16",
            "transformers_version": "4.28.1", "use_cache": True, "vocab_size": c.vocab_size} | extra


def write_layout(path: Path, case: str, target, seed: int = 0) -> DraftHead:
    """Write the checkpoint of `case` (one of LAYOUT_CASES) into `path`; return the head it holds, with its
    weights rounded through the file's dtype (what a faithful load must give back)."""
    path.mkdir(parents=True, exist_ok=True)
    arch = "eagle1" if case in ("eagle1", "speculators-eagle") else "eagle3"
    layers = 2 if case.endswith("two-layers") else 1
    head = random_source_head(target, arch, seed, layers, DRAFT_VOCAB if arch == "eagle3" else None,
                              norm_before_residual=case.startswith("speculators-eagle3"))
    dtype = {"eagle1": torch.float16, "eagle3-bin": torch.float16}.get(case, torch.bfloat16)
    state = {k: v.to(dtype) if v.is_floating_point() else v.clone() for k, v in head.state_dict().items()}
    embed = target.hf.model.embed_tokens.weight.detach().to(dtype).clone()
    config, keys, file = _layout(case, head, target)
    if case in ("eagle1", "specforge-eagle3", "speculators-eagle3", "speculators-eagle3-two-layers",
                "speculators-eagle"):
        state["embed_tokens.weight"] = embed  # the frozen copy some trainers save with the head
    if case.startswith("speculators-eagle3") or case == "vllm-prefixed-eagle3":
        prefix = "model." if case.startswith("vllm") else ""
        state = {_numbered_from_midlayer(k, prefix): v for k, v in state.items()}
    state = {_rename(k, keys): v for k, v in state.items()}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if file == "pytorch_model.bin":
        torch.save(state, path / file)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path / file))
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(dtype).float())
    return head


def _layout(case: str, head: DraftHead, target) -> tuple[dict, tuple, str]:
    """config.json, the key renaming (ours -> the file's) and the weights file of a layout."""
    c = head.config
    if case == "eagle1":
        return llama_fields(head, bias=True), (), "pytorch_model.bin"
    if case in ("eagle3-bin", "eagle3-safetensors"):  # yuhuili/EAGLE3-*: no rope_theta (the draft's base: 10000)
        file = "pytorch_model.bin" if case == "eagle3-bin" else "model.safetensors"
        return llama_fields(head, draft_vocab_size=c.draft_vocab_size), (), file
    if case == "specforge-eagle3":  # SpecForge names the layers whose outputs it reads, SGLang-style (one lower)
        aux = [i - 1 for i in target.eagle3_layers]
        return (llama_fields(head, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=c.draft_vocab_size,
                             head_dim=c.head_dim, rope_theta=c.rope_theta, torch_dtype="bfloat16",
                             eagle_config={"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True}),
                (), "model.safetensors")
    if case == "vllm-prefixed-eagle3":  # vLLM's naming: the midlayer is layers.0 and everything but lm_head is model.*
        return (llama_fields(head, draft_vocab_size=c.draft_vocab_size),
                (("fc.", "model.fc."), ("norm.", "model.norm."), ("d2t", "model.d2t"), ("t2d", "model.t2d")),
                "model.safetensors")
    layer = {"attention_bias": False, "head_dim": c.head_dim, "hidden_act": "silu", "hidden_size": c.hidden_size,
             "intermediate_size": c.intermediate_size, "max_position_embeddings": 2048, "mlp_bias": False,
             "model_type": "llama", "num_attention_heads": c.num_heads, "num_hidden_layers": c.num_layers,
             "num_key_value_heads": c.num_kv_heads, "rms_norm_eps": c.rms_norm_eps, "rope_scaling": None,
             "rope_theta": c.rope_theta, "vocab_size": c.vocab_size}
    verifier = {"architectures": ["LlamaForCausalLM"], "name_or_path": target.name}
    if case == "speculators-eagle":
        return ({"architectures": ["EagleSpeculator"], "speculators_model_type": "eagle", "fusion_bias": True,
                 "layernorms": False, "transformer_layer_config": layer,
                 "speculators_config": {"algorithm": "eagle", "verifier": verifier}},
                (("fc.", "fusion_fc."), ("layers.0.", "transformer.")), "model.safetensors")
    return ({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
             "draft_vocab_size": c.draft_vocab_size, "norm_before_residual": True, "target_hidden_size": None,
             "eagle_aux_hidden_state_layer_ids": list(target.eagle3_layers), "transformer_layer_config": layer,
             "speculators_config": {"algorithm": "eagle3", "verifier": verifier}},
            (), "model.safetensors")


def _rename(key: str, table: tuple) -> str:
    for ours, theirs in table:
        if key.startswith(ours):
            return theirs + key[len(ours):]
    return key


def _numbered_from_midlayer(key: str, prefix: str = "") -> str:
    """speculators' and vLLM's numbering: the midlayer is layers.0, our layers.i their layers.(i + 1)."""
    if key.startswith("midlayer."):
        return f"{prefix}layers.0." + key[len("midlayer."):]
    match = re.match(r"layers\.(\d+)\.", key)
    return f"{prefix}layers.{int(match[1]) + 1}." + key[match.end():] if match else key


def edit_config(path: Path, **changes) -> None:
    """Change (or, with value None, remove) top-level fields of a written config.json."""
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def edit_weights(path: Path, **tensors) -> None:
    """Replace (or, with value None, remove) tensors of a written model.safetensors."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    for key, value in tensors.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    save_file(state, str(path / "model.safetensors"))
