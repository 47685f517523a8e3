"""Linear layers that compute from the model file's own weight blocks (`kernels.quant_ops`).

The embedded SmolLM2 stores its linears in Q4_1 and its embedding (also its LM head) in Q8_0. Dequantized
to fp32 they are 538 MB that every decode step reads; the blocks are ~96 MB. `QuantDense` keeps a linear's
blocks (found exactly in its fp32 values by `eagleviz.models.packed`, or read from a packed directory) and
multiplies fp32 activations by them: the same values as fp32 `linear` on the dequantized weight up to the
order of the sums, and one fixed order per output element, so a token's products are bitwise the same in a
plain step and in a tree's verification (batch invariance, `kernels/quant_ops.c`).

`find_blocks` packs a state dict (seconds per hundred million weights), `save_blocks`/`load_blocks` keep the
result beside a model so that later loads skip the search. `to_q8_0` rounds the products of a module the file
does not hold in blocks (a draft head beside a target that runs from blocks) to Q8_0, as GGUF would store them.
"""

from __future__ import annotations

import torch
from torch import nn

from eagleviz.models import packed
from eagleviz.models.dense import Dense, DenseModule
from kernels.quant_ops import QuantOps, QuantWeight


class QuantDense:
    """y = x W^T + b from W's blocks; x: (T, in) fp32 -> (T, out) fp32 (the call `Dense` has). Linears fused
    into one (q|k|v, gate|up) share one product when their formats match, else run one product each and
    concatenate (the same per-row results either way)."""

    def __init__(self, parts: list[tuple[QuantWeight, torch.Tensor | None]], ops: QuantOps, int8: bool = False):
        self.parts, self.ops, self.int8 = parts, ops, int8

    @classmethod
    def of(cls, blocks: dict[str, QuantWeight], names: list[str], linears: list[nn.Linear],
           ops: QuantOps, int8: bool = False) -> QuantDense | None:
        """One QuantDense for linears sharing an input (outputs concatenated in order), from `blocks` by weight
        name; None when a weight has no blocks. int8: activations quantized per block of 32 to int8 and
        multiplied in integers (`kernels.quant_ops.reference_int8`), else fp32 activations."""
        weights = [blocks.get(name) for name in names]
        if any(w is None for w in weights):
            return None
        biases = [None if lin.bias is None else lin.bias.detach().float().contiguous() for lin in linears]
        merged = QuantWeight.concat(weights)
        if merged is not None and all(b is None for b in biases):
            return cls([(merged, None)], ops, int8)
        if merged is not None and all(b is not None for b in biases):
            return cls([(merged, torch.cat(biases))], ops, int8)
        return cls(list(zip(weights, biases)), ops, int8)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [self.ops.matmul(x, w, b, int8=self.int8) for w, b in self.parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def __deepcopy__(self, memo: dict) -> QuantDense:
        return self  # read-only weights shared by every copy of a model


def find_blocks(state: dict[str, torch.Tensor]) -> dict[str, QuantWeight]:
    """The 2-D weights of `state` that are exactly Q4_1 or Q8_0 blocks, as `QuantWeight`s by name."""
    found, seen = {}, {}
    for name, x in state.items():
        if x.dim() == 2 and name.endswith("weight"):
            key = (x.data_ptr(), tuple(x.shape))  # a tied weight (the LM head) is searched once
            if key not in seen:
                fmt, parts = packed.pack_tensor(x)
                seen[key] = QuantWeight.from_blocks(fmt, parts, tuple(x.shape)) if fmt in ("q4_1", "q8_0") else None
            if seen[key] is not None:
                found[name] = seen[key]
    return found


def weight_names(model: nn.Module) -> dict[int, str]:
    """id(module) -> the state-dict name of its weight, for every module with a `weight`."""
    return {id(m): f"{name}.weight" for name, m in model.named_modules() if getattr(m, "weight", None) is not None}


def q8_0_product(dense: Dense, ops: QuantOps, int8: bool) -> QuantDense:
    """`dense`'s product from its weight rounded to Q8_0 blocks (`QuantWeight.quantize_q8_0`)."""
    bias = None if dense.bias is None else dense.bias.detach().float().contiguous()
    return QuantDense([(QuantWeight.quantize_q8_0(dense.weight), bias)], ops, int8)


def to_q8_0(module: nn.Module, ops: QuantOps, int8: bool = True) -> None:
    """Every product of a frozen inference copy (`eagleviz.models.dense.for_inference`: its `DenseModule`s and
    the `Dense` attributes of its modules, such as fused q|k|v) computed from Q8_0 blocks, in place. A decode
    step then reads about a quarter of the fp32 weights' bytes; the values move by Q8_0's rounding (at most
    half a step of 1/127 of each block's largest weight)."""
    def fits(dense) -> bool:  # a width that is not a multiple of 32 keeps its dense product
        return isinstance(dense, Dense) and dense.weight.shape[1] % 32 == 0

    for sub in module.modules():
        if isinstance(sub, DenseModule) and fits(sub.dense):
            sub.dense = q8_0_product(sub.dense, ops, int8)
        for name, value in list(vars(sub).items()):
            if fits(value):
                setattr(sub, name, q8_0_product(value, ops, int8))
