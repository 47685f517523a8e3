"""A draft level's children in one Triton kernel, for the GPU's captured drafting (`DeviceDrafter`).

After the head's logits, PyTorch's operations for a level's children are a log-softmax (a max, a subtraction, an
exponential, a sum, a logarithm, another subtraction), a top-k and the map from the draft vocabulary to the
target's (an index and an add): ~10 kernels a level on a GPU, each reading or writing the (k, V) rows. Here:

    log_softmax_topk(logits, k, d2t)   logits (R, V) fp32 -> the k best log-probabilities of each row (R, k) fp32,
                                       best first, ties to the lower index, and their target ids (R, k) int64
                                       (id + d2t[id]; d2t None: the draft ids themselves)

One program a row: a pass over the row for its maximum and the sum of exponentials (`(x - max) - log(sum)`, as
PyTorch's log-softmax rounds), then k passes that each pick the best not yet picked. `tests/test_draft_select.py`
compares it with `log_softmax_topk_torch` in Triton's interpreter.
"""

from __future__ import annotations

import torch

from kernels.tree_attention import tl, triton

BLOCK_V = 1024   # a row's values a pass reads at once


@triton.jit
def _log_softmax_topk_kernel(
    Logits,  # (R, V) fp32
    D2T,  # (V,) int64 draft id -> target id offset (unused without HAS_MAP)
    Values,  # (R, K) fp32 out
    Ids,  # (R, K) int64 out
    v, stride_l, stride_o,
    K: tl.constexpr, K_PAD: tl.constexpr, HAS_MAP: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    base = Logits + row * stride_l
    # the row's maximum, then the sum of exponentials below it (two passes: the max first, as PyTorch does)
    top = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    for v0 in range(0, v, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        top = tl.maximum(top, tl.load(base + cols, mask=cols < v, other=float("-inf")))
    m = tl.max(top, 0)
    acc = tl.zeros((BLOCK_V,), tl.float32)
    for v0 in range(0, v, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(base + cols, mask=cols < v, other=float("-inf"))
        acc += tl.exp(x - m)
    log_sum = tl.log(tl.sum(acc, 0))
    # k picks, each the best value not picked yet, the lower index first among equals
    slot = tl.arange(0, K_PAD)
    picked = tl.full((K_PAD,), -1, tl.int64)
    best_values = tl.full((K_PAD,), float("-inf"), tl.float32)
    for j in range(K):
        best = tl.max(tl.full((BLOCK_V,), float("-inf"), tl.float32), 0)   # scalars of the loop's types
        best_i = tl.min(tl.full((BLOCK_V,), v, tl.int32), 0)
        for v0 in range(0, v, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < v, other=float("-inf"))
            taken = tl.sum((cols[:, None].to(tl.int64) == picked[None, :]).to(tl.int32), 1) > 0
            x = tl.where(taken | (cols >= v), float("-inf"), x)
            block_best = tl.max(x, 0)
            block_i = tl.min(tl.where(x == block_best, cols, v), 0)   # the lowest index holding it
            better = block_best > best
            best_i = tl.where(better, block_i, best_i)
            best = tl.where(better, block_best, best)
        picked = tl.where(slot == j, best_i.to(tl.int64), picked)
        best_values = tl.where(slot == j, best, best_values)
    ok = slot < K
    ids = picked
    if HAS_MAP:
        ids = picked + tl.load(D2T + picked, mask=ok & (picked >= 0), other=0)
    tl.store(Values + row * stride_o + slot, (best_values - m) - log_sum, mask=ok)
    tl.store(Ids + row * stride_o + slot, ids, mask=ok)


def log_softmax_topk(logits: torch.Tensor, k: int, d2t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (R, V) fp32 -> (values (R, k) fp32, target ids (R, k) int64): `log_softmax_topk_torch` in one
    kernel."""
    r, v = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1 or not 1 <= k <= v:
        raise ValueError(f"expected fp32 rows (R, V) with unit column stride and 1 <= k <= V, got {logits.dtype}, "
                         f"{tuple(logits.shape)}, k = {k}")
    values = torch.empty(r, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(r, k, dtype=torch.int64, device=logits.device)
    _log_softmax_topk_kernel[(r,)](logits, logits if d2t is None else d2t, values, ids, v, logits.stride(0), k,
                                   K=k, K_PAD=triton.next_power_of_2(k), HAS_MAP=d2t is not None, BLOCK_V=BLOCK_V)
    return values, ids


def log_softmax_topk_torch(logits: torch.Tensor, k: int, d2t: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    values, draft_ids = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
    return values, draft_ids if d2t is None else draft_ids + d2t[draft_ids]
