"""Tree attention for EAGLE verification.

Verification runs the target once over the T tokens of a draft tree. Token i attends to every position of
the committed prefix (no mask there) and, inside the tree, only to its ancestors and itself:

    allowed(i, j) = j < prefix_len  or  (j - prefix_len) is an ancestor-or-self of i in the tree

Positions inside the tree are prefix_len + depth, so each root-to-leaf path sees exactly what plain causal
attention over prefix + path would see.

Algorithm of the Triton kernel (one fused pass, flash-attention style):
    1. Grid = (KV head, block of M rows, prefix split). Grouped-query attention is packed into the M rows:
       row r of KV head h holds tree token r // G and query head h * G + r % G (G = Hq / Hkv), so every K/V
       tile is read once for all G query heads that share it.
    2. Loop A walks the program's share of the prefix in BLOCK_N-key tiles with no mask but the bounds.
    3. Loop B (the last split only) walks the Tk tree keys 32 at a time; the ancestor mask arrives
       bit-packed, row i as ceil(Tk / 32) int32 words, bit j % 32 of word j // 32 set when tree key j is
       visible to query i, so a tile's mask is one word per row, unpacked with a shift.
    4. Both loops share one online softmax in base 2: scores are pre-multiplied by sm_scale * log2(e) and
       exponentiated with exp2; the running max m, sum l and fp32 accumulator are rescaled per tile. A row
       whose keys are all masked so far keeps m = -inf; a guard uses 0 as its shift so no inf - inf NaN
       appears (this only happens for padding rows, or split rows before their first key).
    5. The epilogue writes out = acc / l and the natural-log sum-exp lse = (m + log2 l) * ln 2.
Split-K (flash-decoding): with a long prefix and few rows there are only Hkv programs, far fewer than a GPU
has SMs, so the prefix is cut into S chunks, each program writes an fp32 partial output and its lse, and a
second kernel merges the splits: out = sum_s exp(lse_s - lse) * out_s, lse = log sum_s exp(lse_s).

Entries:
    tree_attention(q, k, v, prefix_len, parents, impl=...)       public; builds the mask from `parents`
    tree_attention_masked(q, k, v, prefix_len, tree_mask, ...)  the engine's entry, with a prebuilt mask
    ancestor_mask(parents)                                      (T, T) bool, row i = ancestors-or-self of i
    tree_attention_triton(...)                                  the launcher (returns out and lse)
    attention_static(q, k, v, prefix, step_mask, ...)           a captured step's entry: the whole static
                                                                cache, P read from device memory
    tree_attention_static(...), static_visibility(...)          its kernel launcher, its PyTorch mask

A captured CUDA graph freezes every Python value of its launches, so the static entry never takes P as a
number: the kernel loads it (PREFIX_IN_MEMORY), and PyTorch's mask is built on the device from it.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton ships Linux wheels only; elsewhere the kernels stay plain functions, never run
    triton = types.SimpleNamespace(jit=lambda fn=None, **_: fn if fn is not None else (lambda f: f))
    tl = None

IMPLS = ("auto", "torch", "triton")
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # not cuDNN
_LOG2E = 1.0 / math.log(2.0)  # the kernels hard-code it and ln 2 as literals: 1.4426950408889634, 0.6931471805599453


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one tile of base-2 scores s (BLOCK_M, BLOCK_N), -inf where masked, and its values v into the
    running (acc, m, l). Returns the updated triple."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked row: exp2(-inf - 0) = 0, no NaN
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(s - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["prefix_len", "tree_len", "num_rows", "split_len"])
def _tree_attention_kernel(
    Q,  # (Tq, Hq, D) queries, any strides
    K,  # (>= prefix_len + Tk, Hkv, D) keys: the prefix, then the tree (a static cache: then unused slots); any strides
    V,  # laid out like K
    MaskWords,  # (Tq, W) int32, W = cdiv(Tk, 32): bit j % 32 of word j // 32 = query may see tree key j
    Out,  # (S, Tq, Hq, D): the output (S = 1, q's dtype) or the fp32 partial outputs of S prefix splits
    Lse,  # (S, Tq, Hq) fp32: natural-log sum-exp of the scaled scores over the keys each program saw
    PrefixLen,  # (1,) int32 in device memory: P, read in place of prefix_len when PREFIX_IN_MEMORY
    qk_scale,  # sm_scale * log2(e): scores then live in base 2 and feed exp2 directly
    prefix_len,  # P: keys [0, P) are visible to every query (ignored when PREFIX_IN_MEMORY)
    tree_len,  # Tk: keys [P, P + Tk) are the tree, visible through MaskWords
    num_rows,  # Tq * G packed rows per KV head
    group,  # G = Hq // Hkv query heads per KV head
    split_len,  # prefix keys per split, a multiple of BLOCK_N (>= P when there is one split)
    num_splits,  # S; the last split also runs the tree loop
    stride_qt, stride_qh, stride_qd,  # strides of Q
    stride_kn, stride_kh, stride_kd,  # strides of K
    stride_vn, stride_vh, stride_vd,  # strides of V
    stride_mt,  # row stride of MaskWords (words are contiguous within a row)
    stride_os, stride_ot, stride_oh, stride_od,  # strides of Out
    stride_ls, stride_lt, stride_lh,  # strides of Lse
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_M: tl.constexpr,  # packed rows per program, >= 16
    BLOCK_N: tl.constexpr,  # prefix keys per tile, >= 16 (tree tiles are 32 keys, one mask word)
    BLOCK_D: tl.constexpr,  # next power of two >= D, >= 16
    UPCAST: tl.constexpr,  # cast tiles to fp32 before the dots (the interpreter cannot multiply bf16)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32), ignored for fp16/bf16
    PREFIX_IN_MEMORY: tl.constexpr,  # P from PrefixLen: a captured CUDA graph replays at any length
):
    if PREFIX_IN_MEMORY:
        prefix_len = tl.load(PrefixLen)
    pid_h = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    tok = rows // group
    head = pid_h * group + rows % group
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + pid_h * stride_kh + offs_d[:, None] * stride_kd  # K tiles are loaded transposed (D, BLOCK_N)
    v_base = V + pid_h * stride_vh + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # A) this split's share of the prefix: visible to every row, masked only at the chunk's end
    lo = pid_s * split_len
    hi = tl.minimum(lo + split_len, prefix_len)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < hi
        k = tl.load(k_base + cols[None, :] * stride_kn, mask=d_ok[:, None] & col_ok[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(col_ok[None, :], s, float("-inf"))
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v.to(q.dtype), DOT_PRECISION)

    # B) the tree keys (last split only), 32 per tile so that one int32 mask word per row covers a tile
    offs_w = tl.arange(0, 32)
    tree_end = tl.where(pid_s == num_splits - 1, tree_len, 0)
    for start in range(0, tree_end, 32):
        cols = start + offs_w
        col_ok = cols < tree_len
        keys = prefix_len + cols
        k = tl.load(k_base + keys[None, :] * stride_kn, mask=d_ok[:, None] & col_ok[None, :], other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        word = tl.load(MaskWords + tok * stride_mt + start // 32, mask=row_ok, other=0)
        visible = ((word[:, None] >> offs_w[None, :]) & 1) != 0  # bits past tree_len are packed as 0
        s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(visible, s, float("-inf"))
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v.to(q.dtype), DOT_PRECISION)

    # epilogue: rows that saw no key (padding, or a split without keys) get out = 0 and lse = -inf
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    o_ptrs = Out + pid_s * stride_os + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(Lse + pid_s * stride_ls + tok * stride_lt + head * stride_lh, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    Part,  # (S, Tq, Hq, D) fp32 partial outputs, each normalised over its own keys
    PartLse,  # (S, Tq, Hq) fp32 natural-log sum-exp of each partial
    Out,  # (Tq, Hq, D) merged output in q's dtype, any strides
    Lse,  # (Tq, Hq) fp32 merged log-sum-exp
    num_rows,  # Tq * Hq
    num_heads,  # Hq
    num_splits,  # S
    stride_ps, stride_pt, stride_ph, stride_pd,  # strides of Part
    stride_xs, stride_xt, stride_xh,  # strides of PartLse
    stride_ot, stride_oh, stride_od,  # strides of Out
    stride_lt, stride_lh,  # strides of Lse
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_R: tl.constexpr,  # (token, head) rows per program
    BLOCK_D: tl.constexpr,  # next power of two >= D
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    tok = rows // num_heads
    head = rows % num_heads
    offs_d = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]

    # online log-sum-exp merge, in base 2 like the attention kernel
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    w_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for split in range(0, num_splits):
        x = tl.load(PartLse + split * stride_xs + tok * stride_xt + head * stride_xh, mask=row_ok,
                    other=float("-inf")) * 1.4426950408889634
        part = tl.load(Part + split * stride_ps + tok[:, None] * stride_pt + head[:, None] * stride_ph
                       + offs_d[None, :] * stride_pd, mask=mask, other=0.0)
        m_new = tl.maximum(m_i, x)
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_shift)
        w = tl.exp2(x - m_shift)
        acc = acc * alpha[:, None] + w[:, None] * part
        w_sum = w_sum * alpha + w
        m_i = m_new

    w_safe = tl.where(w_sum == 0.0, 1.0, w_sum)
    out = acc / w_safe[:, None]
    lse = tl.where(w_sum == 0.0, float("-inf"), (m_i + tl.log2(w_safe)) * 0.6931471805599453)
    o_ptrs = Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask)
    tl.store(Lse + tok * stride_lt + head * stride_lh, lse, mask=row_ok)


# ---------------------------------------------------------------------------------------------- launcher

@dataclass(frozen=True)
class KernelConfig:
    """Block sizes and launch options of `_tree_attention_kernel` (every dot dimension >= 16)."""

    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int


def kernel_config(num_rows: int, head_dim: int) -> KernelConfig:
    """Default tiling for `num_rows` = Tq * G packed rows of head dimension D.

    BLOCK_M covers all rows when it can (each K/V tile is then read once per KV head); beyond the cap, M
    blocks of one KV head run side by side and share the tiles through L2. Few rows make the kernel
    memory-bound, so small M tiles at D <= 64 take 128-key tiles to keep more bytes in flight. The caps
    and warp counts are the largest tiles that compile without register spills for sm_80 and sm_90
    (`python -m kernels.aot`): at D = 128 a 128-row block spills on sm_80 while a 64-row block on 8 warps
    stays under 180 registers.
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    cap = 128 if block_d <= 64 else 64
    block_m = min(cap, max(16, triton.next_power_of_2(num_rows)))
    block_n = 32 if block_d > 128 else (128 if block_m <= 32 and block_d <= 64 else 64)
    num_warps = 8 if block_m * block_d >= 32 * 128 else 4
    return KernelConfig(block_m, block_n, block_d, num_warps, num_stages=2)


def pack_mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """(T, N) bool -> (T, cdiv(N, 32)) int32; bit j % 32 of word j // 32 is mask[:, j] (LSB first)."""
    t, n = mask.shape
    words = max(1, -(-n // 32))
    bits = torch.zeros(t, words * 32, dtype=torch.int64, device=mask.device)
    bits[:, :n] = mask
    shifts = torch.arange(32, dtype=torch.int64, device=mask.device)
    packed = (bits.view(t, words, 32) << shifts).sum(-1)  # in [0, 2^32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def default_num_splits(prefix_len: int, programs: int, block_n: int, device: torch.device) -> int:
    """Flash-decoding split count: about two programs per SM, each with at least 4 prefix tiles.

    Off CUDA (the interpreter runs programs one by one) splitting only costs time, so it is 1.
    """
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-2 * sms // programs)
    return max(1, min(want, prefix_len // (4 * block_n), 64))


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1 was set before this module was imported (kernels run on CPU tensors)."""
    return tl is not None and not isinstance(_tree_attention_kernel, triton.runtime.JITFunction)


_interpreting = interpreting


def tree_attention_triton(q, k, v, prefix_len: int, tree_mask: torch.Tensor | None, sm_scale: float, *,
                          out: torch.Tensor | None = None, num_splits: int | None = None,
                          config: KernelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. q: (Tq, Hq, D); k, v: (prefix_len + Tk, Hkv, D), any strides; tree_mask: (Tq, Tk)
    bool or None (every key visible). Returns (out (Tq, Hq, D) in q's dtype, lse (Tq, Hq) fp32).

    `out` (optional) receives the result; `num_splits` overrides the split-K heuristic (it is rounded so every
    split holds whole BLOCK_N tiles); `config` overrides the tiling.
    """
    _check_shapes(q, k, v, prefix_len, tree_mask)
    if tree_mask is None:  # everything visible: the whole key range is "prefix"
        prefix_len, tree_mask = k.shape[0], torch.zeros(q.shape[0], 0, dtype=torch.bool, device=q.device)
    return _launch(q, k, v, pack_mask_bits(tree_mask), prefix_len, None, k.shape[0] - prefix_len, sm_scale,
                   out, num_splits, config)


def tree_attention_static(q, k, v, prefix: torch.Tensor, words: torch.Tensor, sm_scale: float, *,
                          tree_len: int | None = None, num_splits: int | None = None,
                          config: KernelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel over a static cache, for a step that a CUDA graph captures once and replays at any length.

    q: (Tq, Hq, D) the step's tokens; k, v: (C, Hkv, D) the whole cache, any strides; prefix: (1,) int32 on
    q's device, P itself (read by the kernel, never by the host); tree_len: Tk (default Tq), the slots
    [P, P + Tk) that `words` governs, the step's own keys among them (a draft level's: its ancestors' too);
    words: (Tq, cdiv(Tk, 32)) int32, that mask packed once per forward (`pack_mask_bits`). The split-K count is
    fixed by the longest prefix the cache allows (C - Tk), so one launch shape serves every P; splits past P
    see no key and drop out of the merge. Returns (out (Tq, Hq, D) in q's dtype, lse (Tq, Hq) fp32)."""
    tq, n = q.shape[0], k.shape[0]
    tk = tq if tree_len is None else tree_len
    if prefix.numel() != 1 or prefix.dtype != torch.int32 or prefix.device != q.device:
        raise ValueError(f"prefix must be a (1,) int32 tensor on {q.device}; got {prefix.dtype} "
                         f"{tuple(prefix.shape)} on {prefix.device}")
    if words.shape != (tq, max(1, -(-tk // 32))):
        raise ValueError(f"words must be ({tq}, {max(1, -(-tk // 32))}); got {tuple(words.shape)}")
    _check_shapes(q, k, v, n - tk, None)
    return _launch(q, k, v, words, n - tk, prefix, tk, sm_scale, None, num_splits, config)


def _launch(q, k, v, words: torch.Tensor, prefix_len: int, prefix: torch.Tensor | None, tree_len: int,
            sm_scale: float, out, num_splits: int | None, config: KernelConfig | None):
    """The two kernels' launch. prefix_len: P, or with `prefix` (P in device memory) the longest P, which
    sizes the splits."""
    if tl is None:
        raise ValueError("the Triton kernel needs the triton package (Linux wheels only)")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one of fp16/bf16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    interpreting = _interpreting()
    if q.device.type != "cuda" and not interpreting:
        raise ValueError("the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 set before import)")
    tq, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    cfg = config or kernel_config(tq * group, d)
    m_blocks = triton.cdiv(tq * group, cfg.block_m)
    splits = num_splits or default_num_splits(prefix_len, hkv * m_blocks, cfg.block_n, q.device)
    split_len = triton.cdiv(triton.cdiv(max(prefix_len, 1), splits), cfg.block_n) * cfg.block_n
    splits = max(1, triton.cdiv(prefix_len, split_len))

    if out is None:
        out = torch.empty(tq, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(tq, hq, dtype=torch.float32, device=q.device)
    if splits == 1:
        part, part_lse = out.unsqueeze(0), lse.unsqueeze(0)
    else:
        part = torch.empty(splits, tq, hq, d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits, tq, hq, dtype=torch.float32, device=q.device)
    _tree_attention_kernel[(hkv, m_blocks, splits)](
        q, k, v, words, part, part_lse, lse if prefix is None else prefix, sm_scale * _LOG2E,
        prefix_len, tree_len, tq * group, group, split_len, splits,
        *q.stride(), *k.stride(), *v.stride(), words.stride(0), *part.stride(), *part_lse.stride(),
        HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        UPCAST=interpreting and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PREFIX_IN_MEMORY=prefix is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        block_r = 16
        _merge_splits_kernel[(triton.cdiv(tq * hq, block_r),)](
            part, part_lse, out, lse, tq * hq, hq, splits,
            *part.stride(), *part_lse.stride(), *out.stride(), *lse.stride(),
            HEAD_DIM=d, BLOCK_R=block_r, BLOCK_D=cfg.block_d, num_warps=4,
        )
    return out, lse


# ------------------------------------------------------------------------------------- torch reference

def tree_attention_torch(q, k, v, prefix_len: int, tree_mask: torch.Tensor | None, sm_scale: float) -> torch.Tensor:
    """Reference and CPU path: one SDPA call with a boolean mask (True = may attend).

    q: (Tq, Hq, D); k, v: (N, Hkv, D), any strides; tree_mask: (Tq, N - prefix_len) or None for "all visible".
    """
    tq, n = q.shape[0], k.shape[0]
    attn_mask = None
    if tree_mask is not None:
        attn_mask = torch.ones(tq, n, dtype=torch.bool, device=q.device)
        attn_mask[:, prefix_len:] = tree_mask
    return sdpa(q, k, v, attn_mask, sm_scale)


def static_visibility(prefix: torch.Tensor, tree_mask: torch.Tensor, n: int) -> torch.Tensor:
    """(Tq, n) bool: what each of a step's Tq tokens sees in a static cache of n slots, built on the device
    from P in device memory (prefix: (1,) int32) and the (Tq, Tk) tree mask over slots [P, P + Tk): every slot
    below P, and slot P + j where tree_mask[:, j]; nothing from P + Tk on (slots a longer run left behind)."""
    tk = tree_mask.shape[1]
    keys = torch.arange(n, device=tree_mask.device)
    rel = keys - prefix.long()  # a key's place after the prefix, negative in it
    in_tree = (rel >= 0) & (rel < tk)
    return (rel < 0)[None, :] | (tree_mask[:, rel.clamp(0, tk - 1)] & in_tree[None, :])


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """PyTorch's attention of q (Tq, Hq, D) over k, v (N, Hkv, D) under a (Tq, N) bool mask (None: all).

    On CUDA the backends are named: cuDNN's, which SDPA prefers for masked calls on recent GPUs, builds a new
    execution plan for every new (query, key) length (45-560 ms at first sight of a length on an H100,
    docs/gpu-check.md), so it is left out; flash and memory-efficient attention take the calls they can,
    the math backend the rest."""
    hq, hkv = q.shape[1], k.shape[1]
    args = (q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0))
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(*args, attn_mask=mask, scale=scale, enable_gqa=hq != hkv)[0].transpose(0, 1)
    with sdpa_kernel(CUDA_SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(*args, attn_mask=mask, scale=scale, enable_gqa=hq != hkv)
    return out[0].transpose(0, 1)


# ------------------------------------------------------------------------------------------- dispatcher

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


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, tree_mask: torch.Tensor | None):
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
    if tree_mask is not None and (tree_mask.dim() != 2 or tree_mask.shape != (tq, n - prefix_len)):
        raise ValueError(f"tree_mask must be (Tq, N - prefix_len) = ({tq}, {n - prefix_len}); got {tuple(tree_mask.shape)}")


def resolve_impl(impl: str, device: torch.device) -> str:
    """'auto' -> 'triton' on CUDA, 'torch' elsewhere."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" and tl is not None else "torch"
    if impl == "triton" and tl is None:
        raise ValueError("impl='triton' needs the triton package (Linux wheels only)")
    return impl


def tree_attention_masked(q, k, v, prefix_len: int, tree_mask: torch.Tensor | None, *, sm_scale=None, impl="auto"):
    """Attention of Tq tree queries over prefix_len unmasked keys plus Tk tree keys under `tree_mask`.

    q: (Tq, Hq, D); k, v: (prefix_len + Tk, Hkv, D); tree_mask: (Tq, Tk) bool, or None when every key is
    visible (single-token decoding). Returns (Tq, Hq, D) in q's dtype.
    """
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    _check_shapes(q, k, v, prefix_len, tree_mask)
    if resolve_impl(impl, q.device) == "torch":
        return tree_attention_torch(q, k, v, prefix_len, tree_mask, sm_scale)
    return tree_attention_triton(q, k, v, prefix_len, tree_mask, sm_scale)[0]


def attention_static(q, k, v, prefix: torch.Tensor, step_mask: torch.Tensor, *, sm_scale=None,
                     impl="auto", tree_len: int | None = None) -> torch.Tensor:
    """Attention of a step's Tq tokens over a static cache (`tree_attention_static`): q (Tq, Hq, D); k, v
    (C, Hkv, D) with the tree's keys at slots [P, P + Tk) (Tk = tree_len, default Tq); prefix (1,) int32, P in
    device memory; step_mask: what the step packed once for every layer, (Tq, cdiv(Tk, 32)) int32 words for
    'triton' or the (Tq, C) bool `static_visibility` for 'torch'. Returns (Tq, Hq, D) in q's dtype."""
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    if resolve_impl(impl, q.device) == "torch":
        return sdpa(q, k, v, step_mask, sm_scale)
    return tree_attention_static(q, k, v, prefix, step_mask, sm_scale, tree_len=tree_len)[0]


def tree_attention(q, k, v, prefix_len: int, parents: torch.Tensor, *, sm_scale=None, impl="auto") -> torch.Tensor:
    """Public entry: q (T, Hq, D) tree queries in topological order; k, v (prefix_len + T, Hkv, D);
    parents (T,) int64 with parents[0] == -1. Returns (T, Hq, D)."""
    mask = ancestor_mask(parents).to(q.device)
    if k.shape[0] != prefix_len + q.shape[0]:
        raise ValueError(f"k has {k.shape[0]} rows, expected prefix_len + T = {prefix_len + q.shape[0]}")
    return tree_attention_masked(q, k, v, prefix_len, mask, sm_scale=sm_scale, impl=impl)
