"""Dense (linear) layers for inference, with weights prepacked for oneDNN where that pays.

`torch.nn.functional.linear` on a bf16 CPU tensor hands the weight to oneDNN, which reorders it into its
blocked (AMX) layout on every call. For the small products of decoding (1 to 64 rows against a 576-wide
weight) that reorder costs as much as the product: the 120 matmuls of one SmolLM2 decode step take
18.5 ms with `linear` and 12.8 ms with the weights packed once (2 threads, docs/performance.md entry 10).
`Dense` packs a bf16 CPU weight once at construction and calls oneDNN's packed product: the same AMX
kernels without the reorder, bitwise equal to `linear` for the shapes of `tests/test_dense.py` and for
decoding, though not for every prefill length (o/down products of 373+ rows differ; docs/performance.md
entry 14).

In fp32 it packs too, and uses the packed product from `FP32_PACKED_FROM` rows on. On a 2-core Ice Lake
(no AMX, no AVX512-BF16, where `dtype="auto"` is fp32) `linear` is the faster of the two for 1-3 rows and
1.1-4.3x slower from 4 rows on: the 4 products of one SmolLM2 layer for 16 rows take 5.0 ms with `linear`
and 1.2 ms packed (2 threads; docs/performance.md entry 18). So plain decoding (1 row) runs as before and a
tree verification (4-64 rows) gets oneDNN's kernel, whose fp32 rounding differs from `linear`'s in the last
bits (greedy decoding stays the same but for ties: `tests/test_lossless_smollm.py`). Elsewhere (CUDA,
fp16, a torch build without oneDNN, bf16 on a CPU whose oneDNN refuses to pack it: `kernels.capability`)
`Dense` is a plain `linear`.

The packed copy is extra memory (one more copy of the packed weights); the unpacked weight stays, because
the Hugging Face module that owns it is still used (the `generate` peers, training).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from kernels import capability

FP32_PACKED_FROM = 4  # rows from which oneDNN's packed fp32 product beats `linear` (see above)
PACKABLE = (torch.bfloat16, torch.float32)


def packing_available(weight: torch.Tensor) -> bool:
    """True when `weight` is a bf16 or fp32 CPU tensor, this torch build has oneDNN's packed linear, and, for
    bf16, this CPU lets oneDNN pack it (`kernels.capability`: not on an AVX2-only CPU, where bf16 runs unpacked)."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE:
        return False
    if weight.dtype == torch.bfloat16:
        return capability.detect().bf16_packing
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class Dense:
    """y = x W^T + b with W: (out, in), b: (out,) or None; x: (T, in) -> (T, out).

    pack: None packs when `packing_available`; False never packs (the unpacked reference for A/B runs);
    True insists and raises when packing is not available. A packed fp32 Dense still runs `linear` below
    `FP32_PACKED_FROM` rows (`packed_from`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool | None = None):
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        can = packing_available(self.weight)
        if pack and not can:
            why = capability.detect().why_not_bf16() if self.weight.dtype == torch.bfloat16 else None
            raise ValueError(f"packed bf16 weights: {why}" if why and self.weight.is_cpu else
                             "packed weights need a bf16 or fp32 CPU tensor and a torch build with oneDNN")
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight) if (can if pack is None else pack) else None
        self.packed_from = FP32_PACKED_FROM if self.weight.dtype == torch.float32 else 1

    @classmethod
    def of(cls, *linears: nn.Linear, pack: bool | None = None) -> Dense | None:
        """One Dense for linears that share an input (their outputs concatenated in order), or None when
        only some of them have a bias (they cannot be fused)."""
        fused = fuse_linears(*linears)
        return None if fused is None else cls(*fused, pack=pack)

    def __deepcopy__(self, memo: dict) -> Dense:
        # oneDNN's packed tensor has no storage to copy: copy the weights and pack again
        return Dense(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo), self.packed is not None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.numel() < self.packed_from * x.shape[-1]:
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Concatenate the weights (and biases) of linears sharing an input into one (weight, bias), and rebind
    each module's parameters to views of it, so the fused copy costs no extra memory and the modules still
    compute exactly what they did. Returns None (no fusion) when only some of them have a bias."""
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        return None
    if len(linears) == 1:
        only = linears[0]
        return only.weight.detach(), None if only.bias is None else only.bias.detach()
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([lin.bias.detach() for lin in linears]) if all(has_bias) else None
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[row:row + n], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[row:row + n], requires_grad=False)
        row += n
    return weight, bias


class DenseModule(nn.Module):
    """A drop-in for an `nn.Linear` at inference: the same call, a `Dense` behind it (`weight` stays readable)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.dense = Dense(weight, bias, pack)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x)

    def __deepcopy__(self, memo: dict) -> DenseModule:
        return DenseModule(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo),
                           self.dense.packed is not None)


def for_inference(module: nn.Module, pack: bool | None = None) -> nn.Module:
    """A frozen copy of `module` whose `nn.Linear`s (and `DenseModule`s, re-made with this `pack`) are
    `DenseModule`s, packed where that pays. The original is untouched: a head still being trained keeps its
    own weights, and the copy is a snapshot."""
    frozen = copy.deepcopy(module).eval().requires_grad_(False)
    for parent in list(frozen.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (nn.Linear, DenseModule)):
                setattr(parent, name, DenseModule(child.weight, child.bias, pack))
    return frozen
