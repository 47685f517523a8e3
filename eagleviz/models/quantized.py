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
    """y = x W^T + b from W's blocks; x: (T, in) fp32 -> (T, out) fp32 (the call `Dense` has)."""

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None, ops: QuantOps):
        self.weight, self.ops = weight, ops
        self.bias = None if bias is None else bias.detach().float().contiguous()

    @classmethod
    def of(cls, blocks: dict[str, QuantWeight], names: list[str], linears: list[nn.Linear],
           ops: QuantOps) -> QuantDense | None:
        """One QuantDense for linears sharing an input (outputs concatenated in order), from `blocks` by weight
        name; None when a weight has no blocks, the formats differ or only some have a bias."""
        parts = [blocks.get(name) for name in names]
        biases = [lin.bias for lin in linears]
        if any(p is None for p in parts) or (any(b is not None for b in biases) and any(b is None for b in biases)):
            return None
        weight = QuantWeight.concat(parts)
        bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        return None if weight is None else cls(weight, bias, ops)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.matmul(x, self.weight, self.bias)

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
