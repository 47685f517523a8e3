"""A decoder layer in five kernels: its products with the small operations around them in their prologues and
epilogues, for the GPU's steps (`TargetModel.step` with `layer_kernels="products"`).

`kernels.layer_ops` fuses the small operations among themselves: a layer is then 9 kernels (a norm, the q/k/v
product, rope_store, attention, the o product, a norm with the residual add, the gate/up product, silu_mul, the
down product). A 135M model's step on a GPU is bound by launches, not bytes (~1.3 us of launch and ramp a kernel
even inside a CUDA graph), so here each product takes its neighbours in:

    norm_qkv_rope(a, norm_a, a_ids, b, norm_b, w, bias, rope, positions, pos_add, prefix, slot_add, k_cache,
                  v_cache, hq, hkv, eps)
            RMSNorm in the prologue (each program sums its rows' squares itself: 576 values a row), the q/k/v
            product, its bias, then rotate-half RoPE and the cache writes in the epilogue: one program per
            (row block, head) holds a head's two halves, as RoPE pairs them. It reads its inputs where they lie:
            RoPE's cos and sin from tables at each row's position, the cache slots counted from P in device memory,
            and for a draft head an EAGLE-3 midlayer's input, [RMSNorm(embedding rows gathered by id),
            RMSNorm(features)] side by side, each part its own norm. Returns rotated q (T, Hq, D).
    matmul_residual(x, w, h)
            h += x w^T in place: the o product, and the down product, with the residual add in the epilogue
    norm_gate_up(h, norm_w, w, eps)
            RMSNorm(h) in the prologue, the fused [gate; up] product, silu(gate) * up in the epilogue: the MLP's
            activation (T, I), never the (T, 2 I) product

With attention, a layer is 5 kernels; a draft head's layers take the same products, and its logits one more:

    norm_matmul(h, norm_w, w)
            the head's final norm in its LM head's prologue, fp32 logits out

Each rounds where its PyTorch reference rounds (the normed rows to h's
dtype before the norm's weight, each product's output to its dtype before RoPE, SiLU or the residual add), with
fp32 accumulation; `tests/test_layer_products.py` compares each with its reference in Triton's interpreter.
"""

from __future__ import annotations

import torch

from kernels.tree_attention import tl, triton

BLOCK_T = 16    # rows a program holds: a step's tokens (tl.dot's smallest tile; a decode step's 1 row is masked)
BLOCK_K = 64    # the reduction's tile
BLOCK_N = 64    # output columns a program writes (matmul_residual, norm_matmul)
BLOCK_N_GATE = 32   # ... in norm_gate_up, whose two accumulators and weight tiles would spill at 64 on sm_80
BLOCK_N_FEW = 16    # ... at most BLOCK_T rows (a decode step, a draft level, a small tree): see `columns`


def columns(t: int, widest: int) -> int:
    """Output columns a program writes for t rows: `widest`, or BLOCK_N_FEW for one row block. At one row a
    product's grid is its columns over the tile: SmolLM2's o and down products (576 columns) at 64 a program are 9
    programs on a GPU of 132 SMs, each streaming its 64 weight rows alone (entry 61 of docs/performance.md timed them
    at 8.0 us a call, cuBLAS's GEMV 3.8); at 16, 36 programs read the same bytes. The sums are the same either way
    (each output's reduction runs in one program, in the same order)."""
    return BLOCK_N_FEW if t <= BLOCK_T else widest


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
def _part_products(a, b, X, NW, src, rok, first, second, nok, k_dim, k_off, eps, stride_x, W, stride_w,
                   NORM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a += x W[first, k_off:k_off + k_dim]^T and b likewise with `second` (RoPE's two halves of a head; the gate's
    and the up product's columns), x the rows `src` of X (RMSNorm(X) * NW given NORM): a product, or one part of a
    product whose input is several tensors side by side."""
    if NORM:
        rstd = _rstd(X, src, rok, stride_x, k_dim, eps, BLOCK_T, BLOCK_K)
    for k0 in range(0, k_dim, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        cok = cols < k_dim
        if NORM:
            x = _normed(X, NW, src, rok, cols, cok, rstd, stride_x)
        else:
            x = tl.load(X + src[:, None] * stride_x + cols[None, :], mask=rok[:, None] & cok[None, :], other=0.0)
        wmask = cok[:, None] & nok[None, :]
        w_a = tl.load(W + first[None, :] * stride_w + (k_off + cols)[:, None], mask=wmask, other=0.0)
        w_b = tl.load(W + second[None, :] * stride_w + (k_off + cols)[:, None], mask=wmask, other=0.0)
        a = tl.dot(x, w_a, a, input_precision=DOT_PRECISION)
        b = tl.dot(x, w_b, b, input_precision=DOT_PRECISION)
    return a, b


@triton.jit
def _norm_qkv_rope_kernel(
    A, NWA, AIds,  # the input's first part: rows of A (AIds[row] of them, given GATHER: an embedding table's)
    B2, NWB,  # its second part (T, K2) beside the first (unused without TWO)
    W, Bias,  # ((Hq + 2 Hkv) D, K1 + K2), its bias (unused without HAS_BIAS)
    CosT, SinT,  # (R, D) tables: RoPE's cos and sin at position r
    Pos,  # positions: Pos[row * pos_stride] + pos_add
    Prefix,  # (1,) int64 P: the row's cache slot is P + slot_add + row
    Q, KCache, VCache,
    t, k_a, k_b, eps, pos_stride, pos_add, slot_add,
    stride_a, stride_b, stride_w, stride_cs, stride_kh, stride_kc,
    hq, hkv,
    GATHER: tl.constexpr, NORM_A: tl.constexpr, TWO: tl.constexpr, NORM_B: tl.constexpr, HAS_BIAS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)  # [0, hq): q; [hq, hq + hkv): k; beyond: v
    rok = rows < t
    half = tl.arange(0, HALF)
    lo_rows = head * HEAD_DIM + half
    src = tl.load(AIds + rows, mask=rok, other=0) if GATHER else rows
    lo = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
    hi = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
    lo, hi = _part_products(lo, hi, A, NWA, src, rok, lo_rows, lo_rows + HALF, half < HALF, k_a, 0, eps, stride_a, W,
                            stride_w, NORM_A, BLOCK_T, BLOCK_K, DOT_PRECISION)
    if TWO:
        lo, hi = _part_products(lo, hi, B2, NWB, rows, rok, lo_rows, lo_rows + HALF, half < HALF, k_b, k_a, eps,
                                stride_b, W, stride_w, NORM_B, BLOCK_T, BLOCK_K, DOT_PRECISION)
    if HAS_BIAS:
        lo += tl.load(Bias + lo_rows).to(tl.float32)[None, :]
        hi += tl.load(Bias + lo_rows + HALF).to(tl.float32)[None, :]
    x1 = lo.to(A.dtype.element_ty)  # the product's output, rounded as the Linear's
    x2 = hi.to(A.dtype.element_ty)
    slot = tl.load(Prefix) + slot_add + rows
    ok = rok[:, None]
    if head < hq + hkv:
        pos = tl.load(Pos + rows * pos_stride, mask=rok, other=0) + pos_add
        at = pos[:, None] * stride_cs + half[None, :]
        c1 = tl.load(CosT + at, mask=ok, other=0.0)
        c2 = tl.load(CosT + at + HALF, mask=ok, other=0.0)
        s1 = tl.load(SinT + at, mask=ok, other=0.0)
        s2 = tl.load(SinT + at + HALF, mask=ok, other=0.0)
        y1 = (x1 * c1 - x2 * s1).to(A.dtype.element_ty)
        y2 = (x2 * c2 + x1 * s2).to(A.dtype.element_ty)
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
    gate = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    gate, up = _part_products(gate, up, H, NW, rows, rok, outs, outs + inter, nok, k_dim, 0, eps, stride_h, W, stride_w,
                              True, BLOCK_T, BLOCK_K, DOT_PRECISION)
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


@triton.jit
def _norm_matmul_kernel(
    H, NW,  # (T, K) rows, the norm's weight (unused without NORM)
    W,  # (N, K)
    Out,  # (T, N) fp32: (RMSNorm(H) * NW) W^T, rounded to H's dtype first, as a Linear's output then `.float()`
    t, k_dim, n, eps,
    stride_h, stride_w, stride_o,
    NORM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rok, nok = rows < t, outs < n
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    acc, _ = _part_products(acc, acc, H, NW, rows, rok, outs, outs, nok, k_dim, 0, eps, stride_h, W, stride_w, NORM,
                            BLOCK_T, BLOCK_K, DOT_PRECISION)
    tl.store(Out + rows[:, None] * stride_o + outs[None, :], acc.to(H.dtype.element_ty).to(tl.float32),
             mask=rok[:, None] & nok[None, :])


def _precision(dtype: torch.dtype) -> str:
    """fp32 products in IEEE fp32, never TF32: the fp32 path is the one greedy outputs are compared in."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _rows(h: torch.Tensor, k_dim: int) -> None:
    if h.dim() != 2 or h.shape[1] != k_dim or h.stride(1) != 1:
        raise ValueError(f"expected rows (T, {k_dim}) with unit column stride, got {tuple(h.shape)}")


def norm_gate_up(h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """h (T, K), norm_w (K,), w (2 I, K) the fused [gate; up] weight -> silu(gate) * up (T, I) of RMSNorm(h)."""
    t, k_dim = h.shape
    _rows(h, k_dim)
    inter = w.shape[0] // 2
    if w.shape != (2 * inter, k_dim) or w.stride(1) != 1:
        raise ValueError(f"w must be (2 I, {k_dim}) with unit column stride, got {tuple(w.shape)}")
    out = torch.empty(t, inter, dtype=h.dtype, device=h.device)
    block_n = columns(t, BLOCK_N_GATE)
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(inter, block_n))
    _norm_gate_up_kernel[grid](h, norm_w, w, out, t, k_dim, inter, eps, h.stride(0), w.stride(0), out.stride(0),
                               BLOCK_T=BLOCK_T, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
                               DOT_PRECISION=_precision(h.dtype))
    return out


def matmul_residual(x: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """h (T, N) += x (T, K) w (N, K)^T, in place; returns h."""
    t, k_dim = x.shape
    _rows(x, k_dim)
    n = w.shape[0]
    if w.shape != (n, k_dim) or w.stride(1) != 1 or h.shape != (t, n) or h.stride(1) != 1:
        raise ValueError(f"w must be (N, {k_dim}) and h ({t}, N), both with unit column stride")
    block_n = columns(t, BLOCK_N)
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(n, block_n))
    _matmul_residual_kernel[grid](x, w, h, t, k_dim, n, x.stride(0), w.stride(0), h.stride(0), BLOCK_T=BLOCK_T,
                                  BLOCK_N=block_n, BLOCK_K=BLOCK_K, DOT_PRECISION=_precision(h.dtype))
    return h


def norm_qkv_rope(a: torch.Tensor, norm_a: torch.Tensor | None, a_ids: torch.Tensor | None, b: torch.Tensor | None,
                  norm_b: torch.Tensor | None, w: torch.Tensor, bias: torch.Tensor | None, rope: tuple[torch.Tensor,
                  torch.Tensor], positions: torch.Tensor, pos_add: int, prefix: torch.Tensor, slot_add: int,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, hq: int, hkv: int, eps: float) -> torch.Tensor:
    """The q/k/v product with its norms, RoPE and cache writes, every input read where it lies (no kernel before it):

        the input     [RMSNorm(a[a_ids]) * norm_a, RMSNorm(b) * norm_b] side by side (a_ids None: a's rows
                      themselves; a norm's weight None: no norm; b None: a alone), T rows: an EAGLE-3 midlayer's
                      normed token embeddings (gathered from the table by id) beside its normed features
        RoPE          cos and sin rows of `rope` (two (R, D) tables) at positions[row] + pos_add ((1,) positions:
                      every row's, as a draft level's nodes share their depth)
        the cache     k and v of row r written at slot prefix + slot_add + r (prefix (1,) int64 in device memory)

    Returns rotated q (T, hq, D)."""
    t = a.shape[0] if a_ids is None else a_ids.shape[0]
    k_a, k_b = a.shape[1], 0 if b is None else b.shape[1]
    d = k_cache.shape[-1]
    cos, sin = rope
    if a.stride(1) != 1 or (b is not None and (b.shape[0] != t or b.stride(1) != 1)):
        raise ValueError("the input's parts must be rows with unit column stride, the second as many as the first")
    if w.shape != ((hq + 2 * hkv) * d, k_a + k_b) or w.stride(1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError(f"w must be ({(hq + 2 * hkv) * d}, {k_a + k_b}) with unit column stride; caches (Hkv, C, D)")
    if d % 32 or cos.shape[1] != d or cos.stride() != sin.stride() or cos.stride(1) != 1:
        raise ValueError(f"a head's halves are tl.dot tiles (D a multiple of 32, got {d}); tables (R, {d}) alike")
    if positions.numel() not in (1, t) or prefix.numel() != 1 or prefix.dtype != torch.int64:
        raise ValueError("positions must be (T,) or (1,), prefix (1,) int64")
    q = torch.empty(t, hq, d, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(t, BLOCK_T), hq + 2 * hkv)
    _norm_qkv_rope_kernel[grid](
        a, a if norm_a is None else norm_a, a if a_ids is None else a_ids, a if b is None else b,
        a if norm_b is None else norm_b, w, w if bias is None else bias, cos, sin, positions, prefix, q, k_cache,
        v_cache, t, k_a, k_b, eps, 0 if positions.numel() == 1 and t > 1 else positions.stride(0), pos_add, slot_add,
        a.stride(0), 0 if b is None else b.stride(0), w.stride(0), cos.stride(0), k_cache.stride(0),
        k_cache.stride(1), hq, hkv, GATHER=a_ids is not None, NORM_A=norm_a is not None, TWO=b is not None,
        NORM_B=norm_b is not None, HAS_BIAS=bias is not None, HEAD_DIM=d, BLOCK_T=BLOCK_T, BLOCK_K=BLOCK_K,
        DOT_PRECISION=_precision(a.dtype), num_warps=qkv_warps(d))
    return q


def qkv_warps(head_dim: int) -> int:
    """`norm_qkv_rope`'s warps: 8 for heads of 128 (its two parts' state spilled 8 bytes at 4 warps on sm_90)."""
    return 8 if head_dim >= 128 else 4


def norm_matmul(h: torch.Tensor, norm_w: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """h (T, K), norm_w (K,) or None (no norm), w (N, K) -> fp32 (T, N): a draft head's logits, its final norm in
    the product's prologue."""
    t, k_dim = h.shape
    _rows(h, k_dim)
    n = w.shape[0]
    if w.shape != (n, k_dim) or w.stride(1) != 1:
        raise ValueError(f"w must be (N, {k_dim}) with unit column stride, got {tuple(w.shape)}")
    out = torch.empty(t, n, dtype=torch.float32, device=h.device)
    block_n = columns(t, BLOCK_N)
    grid = (triton.cdiv(t, BLOCK_T), triton.cdiv(n, block_n))
    _norm_matmul_kernel[grid](h, h if norm_w is None else norm_w, w, out, t, k_dim, n, eps, h.stride(0), w.stride(0),
                              out.stride(0), NORM=norm_w is not None, BLOCK_T=BLOCK_T, BLOCK_N=block_n,
                              BLOCK_K=BLOCK_K, DOT_PRECISION=_precision(h.dtype))
    return out


# ------------------------------------------------------------------------------------- torch references

def norm_gate_up_torch(h, norm_w, w, eps) -> torch.Tensor:
    from kernels.layer_ops import add_rms_norm_torch, silu_mul_torch

    return silu_mul_torch(torch.nn.functional.linear(add_rms_norm_torch(h, None, norm_w, eps), w))


def matmul_residual_torch(x, w, h) -> torch.Tensor:
    return h.add_(torch.nn.functional.linear(x, w))


def norm_qkv_rope_torch(a, norm_a, a_ids, b, norm_b, w, bias, rope, positions, pos_add, prefix, slot_add, k_cache,
                        v_cache, hq, hkv, eps) -> torch.Tensor:
    from kernels.layer_ops import add_rms_norm_torch, rope_store_torch

    x = a if a_ids is None else a[a_ids]
    parts = [x if norm_a is None else add_rms_norm_torch(x, None, norm_a, eps)]
    if b is not None:
        parts.append(b if norm_b is None else add_rms_norm_torch(b, None, norm_b, eps))
    t = parts[0].shape[0]
    at = (positions + pos_add).expand(t)
    slots = prefix + slot_add + torch.arange(t, device=a.device)
    qkv = torch.nn.functional.linear(torch.cat(parts, -1), w, bias)
    return rope_store_torch(qkv, rope[0][at], rope[1][at], k_cache, v_cache, slots, hq, hkv)


def norm_matmul_torch(h, norm_w, w, eps) -> torch.Tensor:
    from kernels.layer_ops import add_rms_norm_torch

    x = h if norm_w is None else add_rms_norm_torch(h, None, norm_w, eps)
    return torch.nn.functional.linear(x, w).float()
