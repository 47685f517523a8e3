"""Whether greedy EAGLE parting from plain greedy decoding in fp16 or bf16 is the dtype's rounding: a bound.

At the first position where the two runs differ, both computed the target's logits for the same prefix, plain
decoding in a one-token step and the verification among a tree's tokens; in exact arithmetic the two are equal, so
plain's token `a` and EAGLE's `b` would be the same. In a half-precision dtype each path's logits are the exact
ones, `r`, plus an error: `l_P = r + e_P`, `l_S = r + e_S`. Plain decoding chose `a`, so
`l_P(a) >= l_P(b)`, i.e. `r(a) - r(b) >= e_P(b) - e_P(a) >= -2 max|e_P|`; the verification chose `b`, so
`r(a) - r(b) <= 2 max|e_S|`. Whatever the order, a correct engine parts only where

    |r(a) - r(b)| <= 2 max(max|e_P|, max|e_S|).

Neither path's logits are kept, so the bound reads the dtype's error off a third computation of the same logits
with the same arithmetic: the target's causal forward over the prefix in that dtype (`race.logits_after`) against
the same forward in fp32 (`r`, the fp32 model), its largest difference over the vocabulary `E`; the verdict is
`|r(a) - r(b)| <= 2 E`. The one assumption: a path's error is no larger than that forward's (they run the same
products in the same dtype, over a different number of rows). A wrong engine (a stale cache row, a wrong mask)
moves a logit by far more than a rounding error and chooses a token that is not a near-tie in `r`, so the
verdict fails it; `tests/test_rounding.py` checks both sides on constructed logits. Where `a` and `b` are
`r`'s near-tie (closer than the dtype's own error) no check can tell rounding from a fault, and none is claimed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Parting:
    position: int            # index among the new tokens
    plain: int               # plain decoding's token there
    speculative: int         # EAGLE's
    reference_gap: float     # r(plain) - r(speculative), the fp32 model's logits
    dtype_error: float       # E: the dtype's forward against fp32's, the largest difference of a logit

    @property
    def bound(self) -> float:
        return 2.0 * self.dtype_error

    @property
    def explained(self) -> bool:
        """Whether the dtype's rounding can part the two runs here (the module's bound)."""
        return abs(self.reference_gap) <= self.bound

    def row(self) -> dict:
        """The report's fields."""
        return asdict(self) | {"bound": self.bound, "explained": self.explained}


def parting(position: int, plain: int, speculative: int, own: torch.Tensor, reference: torch.Tensor) -> Parting:
    """The parting at `position`: `own`, the dtype's logits for the common prefix, and `reference`, fp32's."""
    own, reference = own.double(), reference.double()
    return Parting(position=position, plain=int(plain), speculative=int(speculative),
                   reference_gap=float(reference[plain] - reference[speculative]),
                   dtype_error=float((own - reference).abs().max()))
