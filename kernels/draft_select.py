"""A draft level's children, and the next level's frontier, each in one Triton kernel, for the GPU's captured
drafting (`DeviceDrafter`).

After the head's logits, PyTorch's operations for a level's children are a log-softmax (a max, a subtraction, an
exponential, a sum, a logarithm, another subtraction), a top-k and the map from the draft vocabulary to the
target's (an index and an add): ~10 kernels a level on a GPU, each reading or writing the (k, V) rows. Here:

    log_softmax_topk(logits, k, d2t)   logits (R, V) fp32 -> the k best log-probabilities of each row (R, k) fp32,
                                       best first, ties to the lower index, and their target ids (R, k) int64
                                       (id + d2t[id]; d2t None: the draft ids themselves)

One program a row: a pass over the row for its maximum and the sum of exponentials (`(x - max) - log(sum)`, as
PyTorch's log-softmax rounds), then k passes that each pick the best not yet picked.

Between two levels PyTorch's operations are ~20 more kernels: the k^2 children's float64 scores, a stable sort and
its first k, the parents' indices, the tokens, scores and rows gathered, the ancestry mask grown and packed for the
attention, the slots and positions. Here:

    frontier(lp, ids, score, hs, norm_w, words, k, level)
                                       the k best children by cumulative score (each child's rank counted against
                                       all the others: a stable descending sort's first k), their tokens and
                                       scores, their parents' rows (normed, where the head's residual is), and
                                       their ancestry packed as the attention reads it: one kernel, one program

`tests/test_draft_select.py` compares both with `log_softmax_topk_torch` and `frontier_torch` in Triton's
interpreter.
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


@triton.jit
def _frontier_kernel(
    LP, Ids,  # the level before's children, flat node by node: log-probabilities (n,) fp32, target ids (n,) int64
    Score,  # (n // K,) float64 their parents' cumulative scores (unused at FIRST: the root's children)
    HS, NW,  # (R, H) the level before's outputs (FIRST: one row, every node's parent), a norm's weight (NORM)
    WordsIn,  # (K, w_in) int32 the level before's nodes' packed ancestry (unused at FIRST)
    Order, FTok, FScore,  # out (K,): the frontier (indices into the n children), its tokens, its scores (float64)
    G,  # out (K, H): each frontier node's parent's row of HS (RMSNorm(row) * NW given NORM)
    WordsOut,  # out (K, w_out) int32: each frontier node's ancestry over the expansion slots, its own at `expand_at`
    n, h_dim, eps, w_in, w_out, expand_at,
    stride_hs, stride_g, stride_wi, stride_wo,
    K: tl.constexpr, N_PAD: tl.constexpr, K_PAD: tl.constexpr, FIRST: tl.constexpr, NORM: tl.constexpr,
    BLOCK_H: tl.constexpr, W_PAD: tl.constexpr,
):
    j = tl.arange(0, N_PAD)
    jok = j < n
    lp = tl.load(LP + j, mask=jok, other=0.0).to(tl.float64)
    if FIRST:
        score = lp
    else:
        score = tl.load(Score + j // K, mask=jok, other=0.0) + lp
    # a stable descending sort's first K: child i's rank is how many children beat it, the lower index first among
    # equals (`tree.select_frontier`'s order)
    a, b = score[:, None], score[None, :]
    beats = ((b > a) | ((b == a) & (j[None, :] < j[:, None]))) & jok[None, :]
    rank = tl.sum(beats.to(tl.int32), 1)
    r = tl.arange(0, K_PAD)
    rok = r < K
    hit = (rank[None, :] == r[:, None]) & jok[None, :]
    order = tl.sum(tl.where(hit, j[None, :], 0), 1)
    tl.store(Order + r, order.to(tl.int64), mask=rok)
    tl.store(FTok + r, tl.load(Ids + order, mask=rok, other=0), mask=rok)
    tl.store(FScore + r, tl.sum(tl.where(hit, score[None, :], 0.0), 1), mask=rok)
    parent = tl.zeros((K_PAD,), tl.int32) if FIRST else order // K
    # each node's parent's row (normed), in tiles of the row
    if NORM:
        sq = tl.zeros((K_PAD,), dtype=tl.float32)
        for h0 in range(0, h_dim, BLOCK_H):
            cols = h0 + tl.arange(0, BLOCK_H)
            x = tl.load(HS + parent[:, None] * stride_hs + cols[None, :], mask=rok[:, None] & (cols < h_dim)[None, :],
                        other=0.0).to(tl.float32)
            sq += tl.sum(x * x, 1)
        rstd = 1.0 / tl.sqrt(sq / h_dim + eps)
    for h0 in range(0, h_dim, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        ok = rok[:, None] & (cols < h_dim)[None, :]
        x = tl.load(HS + parent[:, None] * stride_hs + cols[None, :], mask=ok, other=0.0)
        if NORM:
            x = (x.to(tl.float32) * rstd[:, None]).to(HS.dtype.element_ty) * tl.load(NW + cols, mask=cols < h_dim,
                                                                                     other=0.0)[None, :]
        tl.store(G + r[:, None] * stride_g + cols[None, :], x.to(G.dtype.element_ty), mask=ok)
    # ancestry: the parent's words, and the node's own slot's bit
    words = tl.arange(0, W_PAD)
    own = expand_at + r
    one = tl.full((K_PAD,), 1, tl.int64)
    bit = tl.where(words[None, :] == (own // 32)[:, None], (one << (own % 32).to(tl.int64))[:, None], 0)
    if FIRST:
        inherited = tl.zeros((K_PAD, W_PAD), tl.int64)
    else:
        inherited = tl.load(WordsIn + parent[:, None] * stride_wi + words[None, :],
                            mask=rok[:, None] & (words < w_in)[None, :], other=0).to(tl.int64)
        inherited = tl.where(inherited < 0, inherited + 2**32, inherited)  # the word's 32 bits, unsigned
    packed = inherited | bit
    packed = tl.where(packed >= 2**31, packed - 2**32, packed)
    tl.store(WordsOut + r[:, None] * stride_wo + words[None, :], packed.to(tl.int32),
             mask=rok[:, None] & (words < w_out)[None, :])


def frontier(lp: torch.Tensor, ids: torch.Tensor, score: torch.Tensor | None, hs: torch.Tensor,
             norm_w: torch.Tensor | None, words: torch.Tensor | None, k: int, level: int, eps: float = 0.0,
             out: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """A draft level's frontier in one kernel, for the captured drafting's level `level` >= 1 (`DeviceDrafter`):

        lp, ids    the level before's children, flat node by node ((n,) fp32 log-probabilities, int64 target ids;
                   level 1: the root's k children)
        score      (n // k,) float64 their parents' cumulative scores (level 1: None)
        hs         (R, H) the level before's outputs (level 1: the root's one row)
        norm_w     a norm's weight for the gathered rows, or None
        words      (k, w) int32 the level before's nodes' packed ancestry over the expansion slots (level 1: None)

    Returns (order (k,) int64: the k best children by cumulative score, best first, ties to the lower index, as a
    stable descending sort picks them; their tokens (k,) int64; their scores (k,) float64 (parent's + own
    log-probability, in float64); (k, H) each one's parent's row of hs (normed given norm_w); (k, cdiv(level k,
    32)) int32 each one's ancestry, its parent's and its own slot (level - 1) k + its rank). `out`: those five
    tensors to write (a drafting's own buffers)."""
    n, h_dim = lp.numel(), hs.shape[1]
    first = level == 1
    if first != (score is None) or first != (words is None) or (not first and n != k * k) or n < k:
        raise ValueError(f"level {level}: {n} children of k = {k}, score and words given from level 2 on")
    if hs.stride(1) != 1:
        raise ValueError("hs must be rows with unit column stride")
    w_out = -(-level * k // 32)
    dev = lp.device
    if out is None:
        out = (torch.empty(k, dtype=torch.int64, device=dev), torch.empty(k, dtype=torch.int64, device=dev),
               torch.empty(k, dtype=torch.float64, device=dev), torch.empty(k, h_dim, dtype=hs.dtype, device=dev),
               torch.empty(k, w_out, dtype=torch.int32, device=dev))
    order, tok, fscore, g, words_out = out
    if words_out.shape != (k, w_out) or g.shape != (k, h_dim):
        raise ValueError(f"out: rows (k, {h_dim}) and words ({k}, {w_out}) expected")
    w_in = 0 if words is None else words.shape[1]
    _frontier_kernel[(1,)](lp, ids, lp if score is None else score, hs, hs if norm_w is None else norm_w,
                           words_out if words is None else words, order, tok, fscore, g, words_out, n, h_dim, eps,
                           w_in, w_out, (level - 1) * k, hs.stride(0), g.stride(0),
                           0 if words is None else words.stride(0), words_out.stride(0), K=k,
                           N_PAD=max(16, triton.next_power_of_2(n)), K_PAD=max(16, triton.next_power_of_2(k)),
                           FIRST=first, NORM=norm_w is not None, BLOCK_H=64,
                           W_PAD=max(16, triton.next_power_of_2(w_out)))
    return out


def log_softmax_topk(logits: torch.Tensor, k: int, d2t: torch.Tensor | None = None,
                     out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (R, V) fp32 -> (values (R, k) fp32, target ids (R, k) int64): `log_softmax_topk_torch` in one
    kernel. `out`: the two to write, contiguous (a drafting's flat outputs, level by level)."""
    r, v = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1 or not 1 <= k <= v:
        raise ValueError(f"expected fp32 rows (R, V) with unit column stride and 1 <= k <= V, got {logits.dtype}, "
                         f"{tuple(logits.shape)}, k = {k}")
    values, ids = out if out is not None else (torch.empty(r, k, dtype=torch.float32, device=logits.device),
                                               torch.empty(r, k, dtype=torch.int64, device=logits.device))
    if values.numel() != r * k or ids.numel() != r * k or not (values.is_contiguous() and ids.is_contiguous()):
        raise ValueError(f"out: two contiguous tensors of {r * k} values expected")
    _log_softmax_topk_kernel[(r,)](logits, logits if d2t is None else d2t, values, ids, v, logits.stride(0), k,
                                   K=k, K_PAD=triton.next_power_of_2(k), HAS_MAP=d2t is not None, BLOCK_V=BLOCK_V)
    return values.view(r, k), ids.view(r, k)


def log_softmax_topk_torch(logits: torch.Tensor, k: int, d2t: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    values, draft_ids = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
    return values, draft_ids if d2t is None else draft_ids + d2t[draft_ids]


def frontier_torch(lp, ids, score, hs, norm_w, anc, k: int, level: int, eps: float = 0.0):
    """`frontier` in PyTorch's operations, as `DeviceDrafter`'s levels ran them: the ancestry as bool masks (anc:
    the level before's (k, (level - 1) k), None at level 1; the result's (k, level k), which
    `kernels.tree_attention.pack_mask_bits` packs as `frontier` writes it)."""
    from kernels.layer_ops import add_rms_norm_torch

    full = lp.double() if score is None else (score[:, None] + lp.view(-1, k).double()).reshape(-1)
    order = torch.sort(full, descending=True, stable=True).indices[:k]
    parent = torch.zeros_like(order) if score is None else order // k
    rows = hs[parent]
    if norm_w is not None:
        rows = add_rms_norm_torch(rows.clone(), None, norm_w, eps)
    eye = torch.eye(k, dtype=torch.bool, device=lp.device)
    return order, ids[order], full[order], rows, eye if anc is None else torch.cat([anc[parent], eye], dim=1)

