"""Building blocks shared by the target forward and the draft head: RMSNorm, RoPE, cached attention.

Both models write their keys and values into a preallocated `KVCache` and attend through one function,
`kernels.tree_attention.tree_attention_masked`, so the draft tree's expansion and the target's verification
use the same tree attention (and the same `impl` switch).
"""

from __future__ import annotations

import math
import statistics
import time

from dataclasses import dataclass

import torch
from torch import nn

from eagleviz.models.kv_cache import KVCache
from eagleviz.models.dense import Dense
from kernels.layer_ops import rope_store
from kernels.tree_attention import attention_static, pack_mask_bits, resolve_impl, static_visibility, tree_attention_masked


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 like the reference Llama, returned in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """(head_dim/2,) fp32 inverse frequencies of RoPE: the default, or with `scaling` (a config's rope_scaling)
    of type "linear" (every frequency divided by `factor`) or "llama3" (Llama 3.1: wavelengths longer than
    original_max_position_embeddings / low_freq_factor divided by `factor`, shorter than .../high_freq_factor
    kept, and a linear blend in between). Both leave the attention scale alone, so only the angles change."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "default":
        return inv_freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        raise ValueError(f"RoPE scaling {kind!r} is not reproduced here (default, linear, llama3)")
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = ((context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(wavelen > context / low, inv_freq / factor, torch.where(wavelen < context / high, inv_freq,
                                                                               blended))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """positions (T,) -> cos, sin of shape (T, head_dim) in `dtype` (rotate-half layout)."""
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, H, D), cos/sin (T, D) -> rotated x (rotate-half convention of HF Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class AttentionWeights:
    """The projections of one attention layer, borrowed from an HF module or a draft layer.

    q_norm/k_norm are the per-head RMSNorms of Qwen3 (None for Llama, Qwen2 and Mistral). `qkv` is an optional
    fused `Dense` whose rows are [q; k; v]: one matmul instead of three. `o_proj` is any (T, H) -> (T, H)
    callable: the module, or a `Dense` of its weight.
    """

    def __init__(self, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear, o_proj: nn.Linear,
                 num_heads: int, num_kv_heads: int, head_dim: int, q_norm=None, k_norm=None, norm_eps=1e-6,
                 qkv: Dense | None = None):
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_norm, self.k_norm, self.norm_eps = q_norm, k_norm, norm_eps
        self.qkv = qkv

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, Hin) -> q (T, Hq, D), k and v (T, Hkv, D)."""
        t, d = x.shape[0], self.head_dim
        if self.qkv is None:
            return (self.q_proj(x).view(t, self.num_heads, d), self.k_proj(x).view(t, self.num_kv_heads, d),
                    self.v_proj(x).view(t, self.num_kv_heads, d))
        out = self.qkv(x)
        q, k, v = out.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        return q.view(t, self.num_heads, d), k.view(t, self.num_kv_heads, d), v.view(t, self.num_kv_heads, d)

    def project_rotated(self, x: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, Hin), cos/sin (T, D) -> q (T, Hq, D) and k (T, Hkv, D) normed (Qwen3) and rotated, v (T, Hkv, D).

        With a fused projection and no per-head norms, q and k are adjacent in its output and rotated by one
        RoPE call (seven small operations fewer per layer; a decode step is mostly small operations on CPU)."""
        if self.qkv is None or self.q_norm is not None:
            q, k, v = self.project(x)
            if self.q_norm is not None:
                q = rms_norm(q, self.q_norm.weight, self.norm_eps)
                k = rms_norm(k, self.k_norm.weight, self.norm_eps)
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v
        t, d, hq, hkv = x.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        qk, v = self.qkv(x).split([(hq + hkv) * d, hkv * d], dim=-1)
        q, k = apply_rope(qk.view(t, hq + hkv, d), cos, sin).split([hq, hkv], dim=1)
        return q, k, v.view(t, hkv, d)


def cached_attention(w: AttentionWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     cache: KVCache, layer: int, tree_mask: torch.Tensor | None, impl: str) -> torch.Tensor:
    """Self-attention of T new tokens appended at cache slots [cache.length, cache.length + T).

    x: (T, Hin) layer input; cos/sin: (T, D); tree_mask: (T, Tk) bool over the last Tk cache slots (the
    tokens of the current tree or block, new ones included), None when every slot is visible.
    Writes this layer's K/V but does not advance `cache.length`: the caller does once all layers ran.
    Attention runs in the cache's dtype (q is converted to it, the output back to x's). Returns the o_proj
    output (T, H).
    """
    t = x.shape[0]
    q, k, v = w.project_rotated(x, cos, sin)
    start = cache.length
    cache.write(layer, start, k, v)
    keys, values = cache.view(layer, start + t)
    tk = t if tree_mask is None else tree_mask.shape[1]
    out = tree_attention_masked(q.to(keys.dtype), keys, values, start + t - tk, tree_mask, impl=impl)
    return w.o_proj(out.to(x.dtype).reshape(t, w.num_heads * w.head_dim))


@dataclass(frozen=True)
class StepFrame:
    """What every layer of a static step shares, built once on the device per forward (`for_step`):
    slots (T,) int64 the step's keys and values are written at; prefix (1,) int32, P; mask: the visibility of
    slots [P, P + Tk) as the attention implementation takes it (`attention_static`); tree_len: Tk."""

    slots: torch.Tensor
    prefix: torch.Tensor
    mask: torch.Tensor
    tree_len: int

    @classmethod
    def for_step(cls, prefix: torch.Tensor, tree_mask: torch.Tensor, capacity: int, impl: str) -> StepFrame:
        """prefix: (1,) int64 P in device memory; tree_mask: (T, Tk) bool over slots [P, P + Tk), the step's T
        tokens at the last T of them: P + Tk - T onwards (a target step: Tk = T; a draft level: Tk counts
        the expansion slots of the levels before it too)."""
        t, tk = tree_mask.shape
        slots = prefix + (tk - t) + torch.arange(t, device=prefix.device)
        p32 = prefix.to(torch.int32)
        if resolve_impl(impl, prefix.device) == "triton":
            return cls(slots, p32, pack_mask_bits(tree_mask), tk)
        return cls(slots, p32, static_visibility(p32, tree_mask, capacity), tk)


def step_attention(w: AttentionWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                   layer: int, frame: StepFrame, impl: str, fused: bool = False) -> torch.Tensor:
    """`cached_attention` over a static cache, with no Python value that changes between steps: K/V written
    at `frame.slots`, attention over the whole cache as `frame` allows. Leaves `cache.length` alone.
    `fused`: RoPE and the cache writes in one Triton kernel (`kernels.layer_ops.rope_store`)."""
    t = x.shape[0]
    if fused:
        q = rope_store(w.qkv(x), cos, sin, cache.k[layer], cache.v[layer], frame.slots, w.num_heads, w.num_kv_heads)
    else:
        q, k, v = w.project_rotated(x, cos, sin)
        cache.k[layer].index_copy_(1, frame.slots, k.transpose(0, 1).to(cache.k.dtype))
        cache.v[layer].index_copy_(1, frame.slots, v.transpose(0, 1).to(cache.v.dtype))
    keys, values = cache.view(layer, cache.capacity)
    out = attention_static(q.to(keys.dtype), keys, values, frame.prefix, frame.mask, impl=impl,
                           tree_len=frame.tree_len)
    return w.o_proj(out.to(x.dtype).reshape(t, w.num_heads * w.head_dim))


CLEARLY_FASTER = 0.8  # fp32 attention is chosen when its probe takes under 80% of the native dtype's


def attention_dtype(dtype: torch.dtype, device: torch.device | str, num_heads: int, num_kv_heads: int,
                    head_dim: int) -> torch.dtype:
    """The dtype a model computing in `dtype` keeps its keys/values in and attends in.

    On CUDA, and for fp32 models, it is `dtype`. On a CPU, PyTorch's bf16/fp16 SDPA kernel can cost several
    times its fp32 kernel for the short queries of decoding (one token against a 200-token prefix: 96 us in
    bf16 against 22 us in fp32 on a 2-core Zen 5; docs/performance.md entry 19). So the choice is measured,
    never assumed: a short timed probe of both (a decode step and a 16-token tree over a 256-token cache)
    takes fp32 only when it wins clearly (`CLEARLY_FASTER`), which keeps the choice away from a near-even
    call that could go either way from one load to the next (`--kv-dtype` pins it). Keys and values are
    produced in `dtype`, so storing them in fp32 loses nothing; the attention itself is then computed in
    fp32, more precise than in bf16."""
    device = torch.device(device)
    if device.type != "cpu" or dtype == torch.float32:
        return dtype
    native = _attention_probe_us(dtype, dtype, num_heads, num_kv_heads, head_dim)
    fp32 = _attention_probe_us(dtype, torch.float32, num_heads, num_kv_heads, head_dim)
    return torch.float32 if fp32 < CLEARLY_FASTER * native else dtype


def _attention_probe_us(dtype: torch.dtype, kv_dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                        head_dim: int, prefix: int = 256, repeats: int = 15) -> float:
    """The median microseconds of a 1-token attention plus those of a 16-token tree attention over `prefix`
    cached keys, the queries in `dtype` and the cache in `kv_dtype` (as `cached_attention` runs them)."""
    gen = torch.Generator().manual_seed(0)
    kv = [torch.randn(num_kv_heads, prefix + 16, head_dim, generator=gen).to(kv_dtype).transpose(0, 1)
          for _ in range(2)]
    total = 0.0
    for t in (1, 16):
        q = torch.randn(t, num_heads, head_dim, generator=gen).to(dtype)
        mask = None if t == 1 else torch.ones(t, t, dtype=torch.bool).tril()
        keys, values = kv[0][:prefix + t], kv[1][:prefix + t]
        times = []
        for i in range(repeats + 3):
            begin = time.perf_counter()
            tree_attention_masked(q.to(kv_dtype), keys, values, prefix, mask, impl="torch").to(dtype)
            if i >= 3:
                times.append(time.perf_counter() - begin)
        total += statistics.median(times) * 1e6
    return total


def swiglu_mlp(mlp: nn.Module, x: torch.Tensor, gate_up: Dense | None = None, down=None) -> torch.Tensor:
    """The gated MLP of Llama-family models: down(silu(gate(x)) * up(x)). `gate_up` is the optional fused
    [gate; up] `Dense` (one matmul instead of two); `down` optionally replaces mlp.down_proj (a `Dense`)."""
    down = mlp.down_proj if down is None else down
    if gate_up is None:
        return down(nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    gate, up = gate_up(x).chunk(2, dim=-1)
    return down(nn.functional.silu(gate) * up)
