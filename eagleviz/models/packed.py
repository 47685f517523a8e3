"""Model weights stored exactly, in the block formats they already fit: the portable bundle's target.

The embedded SmolLM2-135M ships as a GGUF file: its linear layers in Q4_1 (blocks of 32 values x = d * q + m,
q in 0..15, d and m fp16), its embedding in Q8_0 (x = d * q, q in -128..127), its norms in fp32. Dequantized
to fp32 it takes 538 MB, and neither bf16 nor fp16 holds those values exactly (21% and 58% of them). Stored back
in the block form each tensor already has, the same values take a fifth of that and load bit for bit.

`pack` finds, for each tensor, the smallest of these formats that reproduces it exactly (checked by
unpacking), else keeps it as it is:
    q4_1   <name>.q (B, 16) uint8, two 4-bit q per byte (low nibble first); <name>.d, <name>.m (B,) fp16
    q8_0   <name>.q (B, 32) int8; <name>.d (B,) fp16
    raw    <name> unchanged
Dequantization is d * q + m in fp32, the operations (and so the rounding) of gguf's own dequantizer. The
tensors go to `weights.safetensors`, their formats and shapes to `packing.json`, beside the model's
config.json and tokenizer files: `load_model` builds the Hugging Face model from them with no gguf package.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PACKING_FILE = "packing.json"
WEIGHTS_FILE = "weights.safetensors"
BLOCK = 32
FORMATS = ("q4_1", "q8_0", "raw")
_NEIGHBOURS = (0, 1, -1, 2, -2)  # fp16 scales tried around the estimate, in ulps


def _scale_candidates(estimate: torch.Tensor):
    """fp16 values at and next to each fp32 estimate (B, 1): the stored scale is one of them."""
    base = estimate.clamp(max=65504).half().view(torch.int16)
    for step in _NEIGHBOURS:
        yield (base + step).view(torch.float16).float()


def _find_q4_1(blocks: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """(B, 32) fp32 -> q, d, m with d * q + m == blocks exactly, or None. The minimum of a block is its m (q = 0)
    and its maximum is d * 15 + m, which pins d to a few fp16 candidates."""
    m = blocks.min(1, keepdim=True).values
    if not torch.equal(m.half().float(), m):
        return None
    top = blocks.max(1, keepdim=True).values
    found = torch.zeros(blocks.shape[0], dtype=torch.bool)
    q_all = torch.zeros_like(blocks, dtype=torch.uint8)
    d_all = torch.zeros_like(m)
    for d in _scale_candidates((top - m) / 15):
        safe = torch.where(d > 0, d, torch.ones_like(d))
        q = torch.where(d > 0, ((blocks - m) / safe).round(), torch.zeros_like(blocks)).clamp(0, 15)
        ok = ((d * q + m) == blocks).all(1) & ~found
        q_all[ok], d_all[ok], found = q[ok].to(torch.uint8), d[ok], found | ok
        if found.all():
            return {"q": q_all[:, 0::2] | (q_all[:, 1::2] << 4), "d": d_all[:, 0].half(), "m": m[:, 0].half()}
    return None


def _find_q8_0(blocks: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """(B, 32) fp32 -> q, d with d * q == blocks exactly, or None (d pinned by the block's largest magnitude)."""
    found = torch.zeros(blocks.shape[0], dtype=torch.bool)
    q_all = torch.zeros_like(blocks, dtype=torch.int8)
    d_all = torch.zeros(blocks.shape[0], 1)
    for d in _scale_candidates(blocks.abs().max(1, keepdim=True).values / 127):
        safe = torch.where(d > 0, d, torch.ones_like(d))
        q = torch.where(d > 0, (blocks / safe).round(), torch.zeros_like(blocks)).clamp(-128, 127)
        ok = ((d * q) == blocks).all(1) & ~found
        q_all[ok], d_all[ok], found = q[ok].to(torch.int8), d[ok], found | ok
        if found.all():
            return {"q": q_all, "d": d_all[:, 0].half()}
    return None


def _dequantize(fmt: str, parts: dict[str, torch.Tensor], shape: list[int]) -> torch.Tensor:
    """The fp32 tensor of `shape` that `parts` (one format's q, d, m) encode."""
    d = parts["d"].float()[:, None]
    if fmt == "q4_1":
        packed = parts["q"]
        q = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], BLOCK).float()
        return (d * q + parts["m"].float()[:, None]).reshape(shape)
    return (d * parts["q"].float()).reshape(shape)


def pack_tensor(x: torch.Tensor) -> tuple[str, dict[str, torch.Tensor]]:
    """(format, parts): the smallest exact block form of `x`, or ("raw", {"": x})."""
    if x.is_floating_point() and x.dim() >= 2 and x.shape[-1] % BLOCK == 0:
        blocks = x.detach().float().reshape(-1, BLOCK)
        for fmt, find in (("q4_1", _find_q4_1), ("q8_0", _find_q8_0)):
            parts = find(blocks)
            if parts is not None and torch.equal(_dequantize(fmt, parts, list(x.shape)), x.float()):
                return fmt, parts
    return "raw", {"": x.detach().contiguous()}


def save_packed(state: dict[str, torch.Tensor], out_dir: str | Path, source: str = "") -> dict[str, int]:
    """Write `state` packed (weights.safetensors + packing.json) into `out_dir`; returns the count per format."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors, formats = {}, {}
    for name, x in state.items():
        fmt, parts = pack_tensor(x)
        formats[name] = {"format": fmt, "shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
        for suffix, part in parts.items():
            tensors[f"{name}.{suffix}" if suffix else name] = part.contiguous()
    save_file(tensors, str(out / WEIGHTS_FILE))
    (out / PACKING_FILE).write_text(json.dumps({"source": source, "block": BLOCK, "tensors": formats}, indent=1) + "\n")
    return {f: sum(1 for v in formats.values() if v["format"] == f) for f in FORMATS}


def is_packed(model_dir: str | Path) -> bool:
    return (Path(model_dir) / PACKING_FILE).is_file()


def has_blocks(model_dir: str | Path) -> bool:
    """Whether a packed directory stores any tensor in Q4_1 or Q8_0 blocks."""
    tensors = json.loads((Path(model_dir) / PACKING_FILE).read_text())["tensors"]
    return any(info["format"] in ("q4_1", "q8_0") for info in tensors.values())


def source_name(model_dir: str | Path) -> str:
    """The name of the model the packed weights came from ("" when not recorded)."""
    return json.loads((Path(model_dir) / PACKING_FILE).read_text()).get("source", "")


def load_packed(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """The state dict `save_packed` wrote, every tensor exactly as it was given (packed ones in fp32)."""
    from safetensors.torch import load_file

    path = Path(model_dir)
    stored = load_file(str(path / WEIGHTS_FILE))
    state = {}
    for name, info in json.loads((path / PACKING_FILE).read_text())["tensors"].items():
        if info["format"] not in FORMATS:
            raise ValueError(f"{path / PACKING_FILE}: {name} has an unknown format {info['format']!r}")
        if info["format"] == "raw":
            state[name] = stored[name]
        else:
            parts = {k: stored[f"{name}.{k}"] for k in ("q", "d", "m") if f"{name}.{k}" in stored}
            state[name] = _dequantize(info["format"], parts, info["shape"])
    return state


def load_model(model_dir: str | Path, dtype: torch.dtype):
    """The Hugging Face causal LM of a packed directory (its config.json and packed weights), in `dtype`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    hf = AutoModelForCausalLM.from_config(config)
    missing, unexpected = hf.load_state_dict(load_packed(model_dir), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"{model_dir}: the packed weights do not fit its config.json (missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]})")
    hf.tie_weights()
    return hf.to(dtype).eval()
