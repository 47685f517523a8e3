"""Linear layers that compute from the model file's own weight blocks (`kernels.quant_ops`).

The embedded SmolLM2 stores its linears in Q4_1 and its embedding (also its LM head) in Q8_0. Dequantized
to fp32 they are 538 MB that every decode step reads; the blocks are ~96 MB. `QuantDense` keeps a linear's
blocks (found exactly in its fp32 values by `eagleviz.models.packed`, or read from a packed directory) and
multiplies fp32 activations by them: the same values as fp32 `linear` on the dequantized weight up to the
order of the sums, and one fixed order per output element, so a token's products are bitwise the same in a
plain step and in a tree's verification (batch invariance, `kernels/quant_ops.c`).

`find_blocks` packs a state dict (seconds per hundred million weights), `save_blocks`/`load_blocks` keep the
result beside a model so that later loads skip the search.
"""

from __future__ import annotations

import torch
from torch import nn

from eagleviz.models import packed
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
