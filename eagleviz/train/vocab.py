"""The reduced draft vocabulary of EAGLE-3 heads.

On a CPU the draft's LM head dominates a draft step (V x H multiply-adds per row); most of the vocabulary
never appears in answers. EAGLE-3 keeps the Vd most frequent answer tokens: the head predicts draft ids,
mapped back with target_id = draft_id + d2t[draft_id]; t2d marks the target ids that have a draft id.
"""

from __future__ import annotations

import torch


def token_counts(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) int64 frequency of each token among the masked (answer) positions."""
    return torch.bincount(ids[mask].long(), minlength=vocab_size)


def coverage(counts: torch.Tensor, size: int) -> float:
    """Fraction of the counted tokens covered by the `size` most frequent ids."""
    total = int(counts.sum())
    return float(counts.topk(min(size, counts.numel())).values.sum()) / total if total else 0.0


def smallest_covering(counts: torch.Tensor, sizes: tuple[int, ...], target: float) -> int:
    """The smallest of `sizes` whose coverage reaches `target` (the largest size if none does)."""
    for size in sorted(sizes):
        if coverage(counts, size) >= target:
            return size
    return max(sizes)


def draft_vocab(counts: torch.Tensor, size: int, always: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t (size,) int64, t2d (V,) bool) for the `size` most frequent ids, sorted ascending; ids in
    `always` (e.g. end-of-turn tokens) are included whatever their count."""
    score = counts.double().clone()
    score[list(always)] = float("inf")
    used = score.topk(size).indices.sort().values
    d2t = used - torch.arange(size)
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d
