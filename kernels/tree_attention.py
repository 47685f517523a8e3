"""Tree attention for EAGLE verification.

Verification runs the target once over the T tokens of a draft tree. Token i attends to every position of
the committed prefix (no mask there) and, inside the tree, only to its ancestors and itself:

    allowed(i, j) = j < prefix_len  or  (j - prefix_len) is an ancestor-or-self of i in the tree

Positions inside the tree are prefix_len + depth, so each root-to-leaf path sees exactly what plain causal
attention over prefix + path would see.

Entries:
    tree_attention(q, k, v, prefix_len, parents, impl=...)       public; builds the mask from `parents`
    tree_attention_masked(q, k, v, prefix_len, tree_mask, ...)  the engine's entry, with a prebuilt mask
    ancestor_mask(parents)                                      (T, T) bool, row i = ancestors-or-self of i
"""

from __future__ import annotations

import math

import torch

IMPLS = ("auto", "torch", "triton")


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(T,) int64 parents in topological order -> (T, T) bool, row i = ancestors of i and i itself."""
    parents = _check_parents(parents)
    t = parents.numel()
    mask = torch.eye(t, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            mask[i] |= mask[p]
    return mask.to(parents.device)


def _check_parents(parents: torch.Tensor) -> torch.Tensor:
    if parents.dim() != 1 or parents.numel() == 0:
        raise ValueError(f"parents must be a non-empty 1-D tensor, got shape {tuple(parents.shape)}")
    plist = parents.tolist()
    if plist[0] != -1:
        raise ValueError("parents[0] must be -1 (the root)")
    for i, p in enumerate(plist[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"parents must be topological (0 <= parents[i] < i); parents[{i}] = {p}")
    return parents.long()


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, tree_mask: torch.Tensor):
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be 3-D (tokens, heads, head_dim); got {q.shape}, {k.shape}, {v.shape}")
    tq, hq, d = q.shape
    n, hkv, dk = k.shape
    if v.shape != k.shape or dk != d:
        raise ValueError(f"k and v must share shape (N, Hkv, {d}); got {tuple(k.shape)} and {tuple(v.shape)}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if prefix_len < 0 or prefix_len > n:
        raise ValueError(f"prefix_len {prefix_len} out of range for {n} keys")
    if tree_mask.dim() != 2 or tree_mask.shape != (tq, n - prefix_len):
        raise ValueError(f"tree_mask must be (Tq, N - prefix_len) = ({tq}, {n - prefix_len}); got {tuple(tree_mask.shape)}")


def tree_attention_torch(q, k, v, prefix_len: int, tree_mask: torch.Tensor | None, sm_scale: float) -> torch.Tensor:
    """Reference and CPU path: one SDPA call with a boolean mask (True = may attend).

    q: (Tq, Hq, D); k, v: (N, Hkv, D), any strides; tree_mask: (Tq, N - prefix_len) or None for "all visible".
    """
    tq, hq, _ = q.shape
    n, hkv, _ = k.shape
    attn_mask = None
    if tree_mask is not None:
        attn_mask = torch.ones(tq, n, dtype=torch.bool, device=q.device)
        attn_mask[:, prefix_len:] = tree_mask
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=attn_mask,
        scale=sm_scale,
        enable_gqa=hq != hkv,
    )
    return out[0].transpose(0, 1)


def resolve_impl(impl: str, device: torch.device) -> str:
    """'auto' -> 'triton' on CUDA, 'torch' elsewhere."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return impl


def tree_attention_masked(q, k, v, prefix_len: int, tree_mask: torch.Tensor | None, *, sm_scale=None, impl="auto"):
    """Attention of Tq tree queries over prefix_len unmasked keys plus Tk tree keys under `tree_mask`.

    q: (Tq, Hq, D); k, v: (prefix_len + Tk, Hkv, D); tree_mask: (Tq, Tk) bool, or None when every key is
    visible (single-token decoding). Returns (Tq, Hq, D) in q's dtype.
    """
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    if tree_mask is not None:
        _check_shapes(q, k, v, prefix_len, tree_mask)
    which = resolve_impl(impl, q.device)
    if which == "torch":
        return tree_attention_torch(q, k, v, prefix_len, tree_mask, sm_scale)
    raise NotImplementedError("the Triton tree-attention kernel is not available in this build")


def tree_attention(q, k, v, prefix_len: int, parents: torch.Tensor, *, sm_scale=None, impl="auto") -> torch.Tensor:
    """Public entry: q (T, Hq, D) tree queries in topological order; k, v (prefix_len + T, Hkv, D);
    parents (T,) int64 with parents[0] == -1. Returns (T, Hq, D)."""
    mask = ancestor_mask(parents).to(q.device)
    if k.shape[0] != prefix_len + q.shape[0]:
        raise ValueError(f"k has {k.shape[0]} rows, expected prefix_len + T = {prefix_len + q.shape[0]}")
    return tree_attention_masked(q, k, v, prefix_len, mask, sm_scale=sm_scale, impl=impl)
