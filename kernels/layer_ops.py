"""A decoder layer's small operations as three Triton kernels, for the GPU's steps (`TargetModel.step`).

Run as PyTorch operations, a Llama layer's norms, RoPE, cache writes and SwiGLU gate are ~25 kernels of a
plain step's ~30 per layer (`tests/test_static.py` counts them): RMSNorm alone is pow, mean, add, rsqrt, mul,
cast, mul; RoPE is slices, a negation, a concatenation, two products and a sum, for q and for k. A captured
graph launches them cheaply, but each is still a kernel that reads and writes its tensor. Here:

    add_rms_norm(h, delta, weight, eps)   h += delta (in place, the residual stream), then x = RMSNorm(h):
                                          one kernel, one program per row; the sums in fp32, x rounded to h's
                                          dtype before the weight's product, as the reference Llama does
    rope_store(qkv, cos, sin, k_cache, v_cache, slots, hq, hkv)
                                          q and k of a fused projection rotated (rotate-half RoPE), q returned,
                                          k and v written into the layer's cache at `slots`: one kernel, one
                                          program per (token, head)
    silu_mul(gate_up)                     silu(gate) * up of a fused [gate; up] product: one kernel

A layer is then 9 kernels: a norm, the q/k/v product, rope_store, attention, the o product, a norm (with the
residual add), the gate/up product, silu_mul, the down product (its residual add is the next norm's).
Each kernel has a PyTorch reference here; `tests/test_layer_ops.py` compares them in Triton's interpreter.
"""

from __future__ import annotations

import torch

from kernels.tree_attention import tl, triton


@triton.jit
def _add_rms_norm_kernel(
    H,  # (T, N) residual stream, updated in place when HAS_DELTA
    Delta,  # (T, N) what is added to H (unused without HAS_DELTA)
    W,  # (N,) the norm's weight
    X,  # (T, N) out: RMSNorm(H) in H's dtype
    stride_h, stride_d, stride_x,  # row strides
    n,  # N
    eps,
    HAS_DELTA: tl.constexpr,
    BLOCK: tl.constexpr,  # next power of two >= N
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    h = tl.load(H + row * stride_h + cols, mask=ok, other=0.0)
    if HAS_DELTA:
        h = h + tl.load(Delta + row * stride_d + cols, mask=ok, other=0.0)
        tl.store(H + row * stride_h + cols, h, mask=ok)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, 0) / n + eps)
    w = tl.load(W + cols, mask=ok, other=0.0)
    x = (hf * rstd).to(H.dtype.element_ty) * w
    tl.store(X + row * stride_x + cols, x.to(X.dtype.element_ty), mask=ok)


@triton.jit
def _rope_store_kernel(
    QKV,  # (T, (Hq + 2 Hkv) D) the fused projection's output: q heads, k heads, v heads
    Cos, Sin,  # (T, D) rotate-half layout
    Slots,  # (T,) int64 cache slots of the step's tokens
    Q,  # (T, Hq, D) out: rotated q, contiguous
    KCache, VCache,  # (Hkv, C, D) this layer's cache
    stride_qkv, stride_cs,  # row strides of QKV and of Cos/Sin
    stride_kh, stride_kc,  # head and slot strides of the caches (unit stride along D)
    hq, hkv,  # query and key/value heads
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,  # next power of two >= D / 2
):
    tok = tl.program_id(0)
    head = tl.program_id(1)  # [0, hq): q; [hq, hq + hkv): k; beyond: v
    offs = tl.arange(0, HALF)
    ok = offs < HEAD_DIM // 2
    base = QKV + tok * stride_qkv + head * HEAD_DIM
    x1 = tl.load(base + offs, mask=ok, other=0.0)
    x2 = tl.load(base + HEAD_DIM // 2 + offs, mask=ok, other=0.0)
    slot = tl.load(Slots + tok)
    if head < hq + hkv:
        c1 = tl.load(Cos + tok * stride_cs + offs, mask=ok, other=0.0)
        c2 = tl.load(Cos + tok * stride_cs + HEAD_DIM // 2 + offs, mask=ok, other=0.0)
        s1 = tl.load(Sin + tok * stride_cs + offs, mask=ok, other=0.0)
        s2 = tl.load(Sin + tok * stride_cs + HEAD_DIM // 2 + offs, mask=ok, other=0.0)
        y1 = (x1 * c1 - x2 * s1).to(x1.dtype)
        y2 = (x2 * c2 + x1 * s2).to(x1.dtype)
        if head < hq:
            out = Q + (tok * hq + head) * HEAD_DIM
            tl.store(out + offs, y1, mask=ok)
            tl.store(out + HEAD_DIM // 2 + offs, y2, mask=ok)
        else:
            out = KCache + (head - hq) * stride_kh + slot * stride_kc
            tl.store(out + offs, y1.to(KCache.dtype.element_ty), mask=ok)
            tl.store(out + HEAD_DIM // 2 + offs, y2.to(KCache.dtype.element_ty), mask=ok)
    else:
        out = VCache + (head - hq - hkv) * stride_kh + slot * stride_kc
        tl.store(out + offs, x1.to(VCache.dtype.element_ty), mask=ok)
        tl.store(out + HEAD_DIM // 2 + offs, x2.to(VCache.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(
    GU,  # (T, 2 I) the fused [gate; up] product
    Out,  # (T, I)
    stride_gu, stride_o,  # row strides
    inter,  # I
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(GU + row * stride_gu + cols, mask=ok, other=0.0)
    up = tl.load(GU + row * stride_gu + inter + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    tl.store(Out + row * stride_o + cols, act * up, mask=ok)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """h (T, N) += delta (in place; None: no add); returns RMSNorm(h) * weight (T, N) in h's dtype."""
    t, n = h.shape
    if h.stride(1) != 1 or (delta is not None and (delta.shape != h.shape or delta.stride(1) != 1)):
        raise ValueError("h and delta must be (T, N) with unit column stride and the same shape")
    x = torch.empty_like(h)
    _add_rms_norm_kernel[(t,)](h, h if delta is None else delta, weight, x, h.stride(0),
                               h.stride(0) if delta is None else delta.stride(0), x.stride(0), n, eps,
                               HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(n))
    return x


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slots: torch.Tensor, hq: int, hkv: int) -> torch.Tensor:
    """qkv (T, (hq + 2 hkv) D), cos/sin (T, D), k_cache/v_cache (hkv, C, D) one layer's, slots (T,) int64:
    writes rotated k and v at the slots, returns rotated q (T, hq, D)."""
    t, width = qkv.shape
    d = k_cache.shape[-1]
    if width != (hq + 2 * hkv) * d or qkv.stride(1) != 1 or k_cache.stride(-1) != 1 or cos.stride(1) != 1:
        raise ValueError(f"qkv must be (T, {(hq + 2 * hkv) * d}) with unit column stride; caches (Hkv, C, D)")
    q = torch.empty(t, hq, d, dtype=qkv.dtype, device=qkv.device)
    _rope_store_kernel[(t, hq + 2 * hkv)](qkv, cos, sin, slots, q, k_cache, v_cache, qkv.stride(0), cos.stride(0),
                                          k_cache.stride(0), k_cache.stride(1), hq, hkv, HEAD_DIM=d,
                                          HALF=triton.next_power_of_2(d // 2))
    return q


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """gate_up (T, 2 I) -> silu(gate) * up (T, I), rounded like PyTorch's silu then product in its dtype."""
    t, width = gate_up.shape
    inter = width // 2
    out = torch.empty(t, inter, dtype=gate_up.dtype, device=gate_up.device)
    _silu_mul_kernel[(t, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), inter,
                                                     BLOCK=block)
    return out


# ------------------------------------------------------------------------------------- torch references

def add_rms_norm_torch(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if delta is not None:
        h += delta
    hf = h.float()
    return weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def rope_store_torch(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slots: torch.Tensor, hq: int, hkv: int) -> torch.Tensor:
    t, d = qkv.shape[0], k_cache.shape[-1]
    heads = qkv.view(t, hq + 2 * hkv, d)
    qk, v = heads[:, :hq + hkv], heads[:, hq + hkv:]
    half = d // 2
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
    qk = qk * cos[:, None, :] + rotated * sin[:, None, :]
    k_cache.index_copy_(1, slots, qk[:, hq:].transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(1, slots, v.transpose(0, 1).to(v_cache.dtype))
    return qk[:, :hq].contiguous()


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
