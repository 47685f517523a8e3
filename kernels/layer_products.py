"""A decoder layer in five kernels: its products with the small operations around them in their prologues and
epilogues, for the GPU's steps (`TargetModel.step` with `layer_kernels="products"`).

`kernels.layer_ops` fuses the small operations among themselves: a layer is then 9 kernels (a norm, the q/k/v
product, rope_store, attention, the o product, a norm with the residual add, the gate/up product, silu_mul, the
down product). A 135M model's step on a GPU is bound by launches, not bytes (~1.3 us of launch and ramp a kernel
even inside a CUDA graph), so here each product takes its neighbours in:

    norm_qkv_rope(h, norm_w, w, b, cos, sin, k_cache, v_cache, slots, hq, hkv, eps)
            RMSNorm(h) in the prologue (each program sums its rows' squares itself: 576 values a row), the q/k/v
            product, its bias, then rotate-half RoPE and the cache writes in the epilogue: one program per
            (row block, head) holds a head's two halves, as RoPE pairs them. Returns rotated q (T, Hq, D).
    matmul_residual(x, w, h)
            h += x w^T in place: the o product, and the down product, with the residual add in the epilogue
    norm_gate_up(h, norm_w, w, eps)
            RMSNorm(h) in the prologue, the fused [gate; up] product, silu(gate) * up in the epilogue: the MLP's
            activation (T, I), never the (T, 2 I) product

With attention, a layer is 5 kernels. Each rounds where its PyTorch reference rounds (the normed rows to h's
dtype before the norm's weight, each product's output to its dtype before RoPE, SiLU or the residual add), with
fp32 accumulation; `tests/test_layer_products.py` compares each with its reference in Triton's interpreter.
"""

from __future__ import annotations

import torch

from kernels.tree_attention import tl, triton

BLOCK_T = 16    # rows a program holds: a step's tokens (tl.dot's smallest tile; a decode step's 1 row is masked)
BLOCK_K = 64    # the reduction's tile
BLOCK_N = 64    # output columns a program writes (matmul_residual)
BLOCK_N_GATE = 32   # ... in norm_gate_up, whose two accumulators and weight tiles would spill at 64 on sm_80


@triton.jit
def _rstd(H, rows, rok, stride_h, k_dim, eps, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / RMS of each of the program's rows of H, in fp32."""
    sq = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        h = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=rok[:, None] & (cols < k_dim)[None, :],
                    other=0.0).to(tl.float32)
        sq += tl.sum(h * h, 1)
    return 1.0 / tl.sqrt(sq / k_dim + eps)


@triton.jit
def _normed(H, NW, rows, rok, cols, cok, rstd, stride_h):
    """The tile (rows, cols) of RMSNorm(H) * NW, rounded to H's dtype before the weight, as the reference does."""
    h = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=rok[:, None] & cok[None, :], other=0.0)
    w = tl.load(NW + cols, mask=cok, other=0.0)
    return (h.to(tl.float32) * rstd[:, None]).to(H.dtype.element_ty) * w[None, :]


@triton.jit
def _normed_products(H, NW, W, rows, rok, first, second, nok, t, k_dim, eps, stride_h, stride_w,
                     BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """RMSNorm(H) * NW of the program's rows, times the weight rows `first` and, beside them, `second` (RoPE's two
    halves of a head; the gate's and the up product's columns): two (BLOCK_T, BLOCK_N) fp32 accumulators."""
    rstd = _rstd(H, rows, rok, stride_h, k_dim, eps, BLOCK_T, BLOCK_K)
    a = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    b = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        cok = cols < k_dim
        x = _normed(H, NW, rows, rok, cols, cok, rstd, stride_h)
        wmask = cok[:, None] & nok[None, :]
        w_a = tl.load(W + first[None, :] * stride_w + cols[:, None], mask=wmask, other=0.0)
        w_b = tl.load(W + second[None, :] * stride_w + cols[:, None], mask=wmask, other=0.0)
        a = tl.dot(x, w_a, a, input_precision=DOT_PRECISION)
        b = tl.dot(x, w_b, b, input_precision=DOT_PRECISION)
    return a, b


@triton.jit
def _norm_qkv_rope_kernel(
    H, NW,  # (T, K) the residual stream, (K,) the norm's weight
    W, B,  # ((Hq + 2 Hkv) D, K) the fused q/k/v weight, its bias (unused without HAS_BIAS)
    Cos, Sin,  # (T, D) rotate-half layout
    Slots,  # (T,) int64 cache slots of the step's tokens
    Q,  # (T, Hq, D) out: rotated q
    KCache, VCache,  # (Hkv, C, D) this layer's cache
    t, k_dim, eps,
    stride_h, stride_w, stride_cs, stride_kh, stride_kc,
    hq, hkv,
    HAS_BIAS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)  # [0, hq): q; [hq, hq + hkv): k; beyond: v
    rok = rows < t
    half = tl.arange(0, HALF)
    lo_rows = head * HEAD_DIM + half
    lo, hi = _normed_products(H, NW, W, rows, rok, lo_rows, lo_rows + HALF, half < HALF, t, k_dim, eps, stride_h,
                              stride_w, BLOCK_T, HALF, BLOCK_K, DOT_PRECISION)
    if HAS_BIAS:
        lo += tl.load(B + lo_rows).to(tl.float32)[None, :]
        hi += tl.load(B + lo_rows + HALF).to(tl.float32)[None, :]
    x1 = lo.to(H.dtype.element_ty)  # the product's output, rounded as the Linear's
    x2 = hi.to(H.dtype.element_ty)
    slot = tl.load(Slots + rows, mask=rok, other=0)
    ok = rok[:, None]
    if head < hq + hkv:
        at = rows[:, None] * stride_cs + half[None, :]
        c1 = tl.load(Cos + at, mask=ok, other=0.0)
        c2 = tl.load(Cos + at + HALF, mask=ok, other=0.0)
        s1 = tl.load(Sin + at, mask=ok, other=0.0)
        s2 = tl.load(Sin + at + HALF, mask=ok, other=0.0)
        y1 = (x1 * c1 - x2 * s1).to(H.dtype.element_ty)
        y2 = (x2 * c2 + x1 * s2).to(H.dtype.element_ty)
        if head < hq:
            out = Q + (rows[:, None] * hq + head) * HEAD_DIM + half[None, :]
            tl.store(out, y1.to(Q.dtype.element_ty), mask=ok)
            tl.store(out + HALF, y2.to(Q.dtype.element_ty), mask=ok)
        else:
            out = KCache + (head - hq) * stride_kh + slot[:, None] * stride_kc + half[None, :]
            tl.store(out, y1.to(KCache.dtype.element_ty), mask=ok)
            tl.store(out + HALF, y2.to(KCache.dtype.element_ty), mask=ok)
    else:
        out = VCache + (head - hq - hkv) * stride_kh + slot[:, None] * stride_kc + half[None, :]
        tl.store(out, x1.to(VCache.dtype.element_ty), mask=ok)
        tl.store(out + HALF, x2.to(VCache.dtype.element_ty), mask=ok)


@triton.jit
def _norm_gate_up_kernel(
    H, NW,  # (T, K) the residual stream, (K,) the norm's weight
    W,  # (2 I, K) the fused [gate; up] weight
    Out,  # (T, I) silu(gate) * up
    t, k_dim, inter, eps,
    stride_h, stride_w, stride_o,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rok, nok = rows < t, outs < inter
    gate, up = _normed_products(H, NW, W, rows, rok, outs, outs + inter, nok, t, k_dim, eps, stride_h, stride_w,
                                BLOCK_T, BLOCK_N, BLOCK_K, DOT_PRECISION)
    g = gate.to(H.dtype.element_ty).to(tl.float32)  # the product's output, rounded as the Linear's
    act = (g / (1.0 + tl.exp(-g))).to(H.dtype.element_ty)
    tl.store(Out + rows[:, None] * stride_o + outs[None, :], act * up.to(H.dtype.element_ty),
             mask=rok[:, None] & nok[None, :])


@triton.jit
def _matmul_residual_kernel(
    X,  # (T, K)
    W,  # (N, K)
    H,  # (T, N) the residual stream: H += X W^T, in place
    t, k_dim, n,
    stride_x, stride_w, stride_h,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rok, nok = rows < t, outs < n
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        cok = cols < k_dim
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=rok[:, None] & cok[None, :], other=0.0)
        w = tl.load(W + outs[None, :] * stride_w + cols[:, None], mask=cok[:, None] & nok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
    at = H + rows[:, None] * stride_h + outs[None, :]
    mask = rok[:, None] & nok[None, :]
    h = tl.load(at, mask=mask, other=0.0)
    tl.store(at, h + acc.to(H.dtype.element_ty), mask=mask)


def _precision(dtype: torch.dtype) -> str:
    """fp32 products in IEEE fp32, never TF32: the fp32 path is the one greedy outputs are compared in."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _rows(h: torch.Tensor, k_dim: int) -> None:
    if h.dim() != 2 or h.shape[1] != k_dim or h.stride(1) != 1:
        raise ValueError(f"expected rows (T, {k_dim}) with unit column stride, got {tuple(h.shape)}")


def norm_qkv_rope(h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, cos: torch.Tensor,
                  sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, hq: int,
                  hkv: int, eps: float) -> torch.Tensor:
    """h (T, K), norm_w (K,), w ((hq + 2 hkv) D, K), b its bias or None, cos/sin (T, D), k_cache/v_cache
    (hkv, C, D) one layer's, slots (T,) int64: writes rotated k and v at the slots, returns rotated q (T, hq, D)."""
    t, k_dim = h.shape
    d = k_cache.shape[-1]
    _rows(h, k_dim)
    if w.shape != ((hq + 2 * hkv) * d, k_dim) or w.stride(1) != 1 or k_cache.stride(-1) != 1 or cos.stride(1) != 1:
        raise ValueError(f"w must be ({(hq + 2 * hkv) * d}, {k_dim}) with unit column stride; caches (Hkv, C, D)")
    if d % 32:
        raise ValueError(f"a head's halves are tl.dot tiles: the head dimension must be a multiple of 32, got {d}")
    q = torch.empty(t, hq, d, dtype=h.dtype, device=h.device)
    grid = (triton.cdiv(t, BLOCK_T), hq + 2 * hkv)
    _norm_qkv_rope_kernel[grid](h, norm_w, w, w if b is None else b, cos, sin, slots, q, k_cache, v_cache, t, k_dim,
                                eps, h.stride(0), w.stride(0), cos.stride(0), k_cache.stride(0), k_cache.stride(1),
                                hq, hkv, HAS_BIAS=b is not None, HEAD_DIM=d, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K,
                                DOT_PRECISION=_precision(h.dtype))
    return q


def norm_gate_up(h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """h (T, K), norm_w (K,), w (2 I, K) the fused [gate; up] weight -> silu(gate) * up (T, I) of RMSNorm(h)."""
    t, k_dim = h.shape
    _rows(h, k_dim)
    inter = w.shape[0] // 2
    if w.shape != (2 * inter, k_dim) or w.stride(1) != 1:
        raise ValueError(f"w must be (2 I, {k_dim}) with unit column stride, got {tuple(w.shape)}")
    out = torch.empty(t, inter, dtype=h.dtype, device=h.device)
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(inter, BLOCK_N_GATE))
    _norm_gate_up_kernel[grid](h, norm_w, w, out, t, k_dim, inter, eps, h.stride(0), w.stride(0), out.stride(0),
                               BLOCK_T=BLOCK_T, BLOCK_N=BLOCK_N_GATE, BLOCK_K=BLOCK_K,
                               DOT_PRECISION=_precision(h.dtype))
    return out


def matmul_residual(x: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """h (T, N) += x (T, K) w (N, K)^T, in place; returns h."""
    t, k_dim = x.shape
    _rows(x, k_dim)
    n = w.shape[0]
    if w.shape != (n, k_dim) or w.stride(1) != 1 or h.shape != (t, n) or h.stride(1) != 1:
        raise ValueError(f"w must be (N, {k_dim}) and h ({t}, N), both with unit column stride")
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(n, BLOCK_N))
    _matmul_residual_kernel[grid](x, w, h, t, k_dim, n, x.stride(0), w.stride(0), h.stride(0), BLOCK_T=BLOCK_T,
                                  BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT_PRECISION=_precision(h.dtype))
    return h


# ------------------------------------------------------------------------------------- torch references

def norm_qkv_rope_torch(h, norm_w, w, b, cos, sin, k_cache, v_cache, slots, hq, hkv, eps) -> torch.Tensor:
    from kernels.layer_ops import add_rms_norm_torch, rope_store_torch

    qkv = torch.nn.functional.linear(add_rms_norm_torch(h, None, norm_w, eps), w, b)
    return rope_store_torch(qkv, cos, sin, k_cache, v_cache, slots, hq, hkv)


def norm_gate_up_torch(h, norm_w, w, eps) -> torch.Tensor:
    from kernels.layer_ops import add_rms_norm_torch, silu_mul_torch

    return silu_mul_torch(torch.nn.functional.linear(add_rms_norm_torch(h, None, norm_w, eps), w))


def matmul_residual_torch(x, w, h) -> torch.Tensor:
    return h.add_(torch.nn.functional.linear(x, w))
