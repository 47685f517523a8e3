"""The EAGLE draft head: EAGLE-1/2 and EAGLE-3 architectures, with the official checkpoint key names.

EAGLE-1/2 (yuhuili/EAGLE-*):   x = fc(cat(embed(token), feature));  layers.i (layer 0 has no input norm);
                               logits = target_lm_head(x)  (the feature is the target's post-norm state)
EAGLE-3   (yuhuili/EAGLE3-*):  g = fc(cat(low, mid, high)) for target features, g = own output otherwise;
                               a = cat(input_layernorm(embed(token)), hidden_norm(g))   (2H attention input)
                               h = g + attn(a); h = h + mlp(post_attention_layernorm(h))
                               (speculators' norm_before_residual: h = hidden_norm(g) + attn(a))
                               logits = lm_head(norm(h)) over a draft vocabulary; target id = id + d2t[id]
Draft position p pairs the target feature at p with the token at p + 1, so it predicts the token at p + 2.
The embedding is always the target's (frozen, never saved with the head). `load_head` reads every published
layout (`eagleviz.models.layouts`) and refuses a head that does not fit its target (`eagleviz.models.compat`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eagleviz.errors import UserFacingError
from eagleviz.models.kv_cache import KVCache
from eagleviz.models.compat import check_fits
from eagleviz.models.dense import Dense, for_inference
from eagleviz.models.layers import (AttentionWeights, StepFrame, cached_attention, rms_norm, rope_cos_sin,
                                    rope_inv_freq, step_attention, swiglu_mlp)
from eagleviz.models.layouts import read_checkpoint
from eagleviz.models.quantized import QuantDense, to_q8_0
from eagleviz.paths import cache_dir
from kernels import cpu_ops, layer_ops, layer_products, stack_ops
from kernels.quant_ops import QuantOps
from kernels.tree_attention import attention_static, resolve_impl

ARCHS = ("eagle1", "eagle3")


@dataclass(frozen=True)
class DraftConfig:
    """Shapes of a draft head. `target_hidden_size` is the width of one target feature."""

    arch: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    num_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    bias: bool = True
    qkv_bias: bool = False
    norm_before_residual: bool = False  # EAGLE-3: the midlayer's residual is hidden_norm(g), not g (speculators)
    rope_scaling: tuple[tuple[str, float | str], ...] = ()  # the (key, value) pairs of a config's rope_scaling

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.num_layers < 1:
            raise ValueError(f"a head needs at least one layer, got {self.num_layers}")

    @property
    def feature_size(self) -> int:
        """Width of the target feature the head consumes."""
        return self.target_hidden_size * (3 if self.arch == "eagle3" else 1)

    @classmethod
    def for_target(cls, target, arch: str = "eagle1", num_layers: int = 1, draft_vocab_size: int | None = None):
        """A head shaped like one decoder layer of `target` (the EAGLE papers' choice)."""
        return cls(arch=arch, hidden_size=target.hidden_size, num_heads=target.num_heads,
                   num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   intermediate_size=target.config.intermediate_size, vocab_size=target.vocab_size,
                   draft_vocab_size=draft_vocab_size or target.vocab_size, target_hidden_size=target.hidden_size,
                   num_layers=num_layers, rms_norm_eps=target.eps,
                   rope_theta=float(_rope_theta(target.config)), bias=arch == "eagle1")

    def to_hf(self) -> dict:
        """config.json in the layout of the published heads (LlamaConfig fields plus EAGLE extras)."""
        out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
               "hidden_size": self.hidden_size, "num_attention_heads": self.num_heads,
               "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
               "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
               "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "vocab_size": self.vocab_size,
               "bias": self.bias, "qkv_bias": self.qkv_bias, "tie_word_embeddings": False,
               "eagleviz_arch": self.arch}
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        if self.norm_before_residual:
            out["norm_before_residual"] = True
        if self.arch == "eagle3":
            out["draft_vocab_size"] = self.draft_vocab_size
            out["target_hidden_size"] = self.target_hidden_size
        return out

    @classmethod
    def from_hf(cls, cfg: dict, arch: str, eagle3_layers: int = 1) -> DraftConfig:
        """eagle3_layers: the midlayer plus the extra layers found in the weights (published EAGLE-3 heads
        have the midlayer only, whatever their config's num_hidden_layers says)."""
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        return cls(arch=arch, hidden_size=hidden, num_heads=heads,
                   num_kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_dim=cfg.get("head_dim") or hidden // heads, intermediate_size=cfg["intermediate_size"],
                   vocab_size=cfg["vocab_size"], draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
                   target_hidden_size=cfg.get("target_hidden_size") or hidden,
                   num_layers=cfg.get("num_hidden_layers", 1) if arch == "eagle1" else eagle3_layers,
                   rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=float(_rope_theta(cfg)),
                   bias=bool(cfg.get("bias", True)) and arch == "eagle1", qkv_bias=cfg.get("qkv_bias", False),
                   norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                   rope_scaling=_rope_scaling(cfg))


def _rope_theta(cfg) -> float:
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    params = get("rope_parameters") or get("rope_scaling") or {}
    return get("rope_theta") or params.get("rope_theta") or 10000.0


def _rope_scaling(cfg: dict) -> tuple[tuple[str, float | str], ...]:
    """A config's RoPE scaling as sorted (key, value) pairs; () for none (rope_scaling in transformers 4 configs,
    rope_parameters in 5, where it also holds rope_theta)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if (params.get("rope_type") or params.get("type") or "default") == "default":
        return ()
    return tuple(sorted((k, v) for k, v in params.items() if k != "rope_theta" and isinstance(v, (int, float, str))))


class _RMSNorm(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


class _Attention(nn.Module):
    def __init__(self, c: DraftConfig, in_features: int):
        super().__init__()
        self.q_proj = nn.Linear(in_features, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(in_features, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(in_features, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)


class _Layer(nn.Module):
    """EAGLE-1 layer i (input norm only when i > 0), the EAGLE-3 midlayer (two input norms, 2H attention), or
    one of an EAGLE-3 head's extra layers after it (`wide` False: a plain pre-norm decoder layer)."""

    def __init__(self, c: DraftConfig, index: int, wide: bool | None = None):
        super().__init__()
        wide = c.arch == "eagle3" and index == 0 if wide is None else wide
        self.self_attn = _Attention(c, 2 * c.hidden_size if wide else c.hidden_size)
        self.mlp = _MLP(c)
        self.post_attention_layernorm = _RMSNorm(c.hidden_size)
        if wide:
            self.hidden_norm = _RMSNorm(c.hidden_size)
        if wide or index > 0:
            self.input_layernorm = _RMSNorm(c.hidden_size)


@dataclass(frozen=True)
class ProductsFrame:
    """Where a captured draft step's rows go, all in device memory (`DraftHead.step_products`): row r's position
    is positions[r] + pos_add (positions (T,), or (1,): a level's nodes share their depth), its keys go at slot
    prefix + slot_add + r; the attention sees the slots [prefix, prefix + tree_len) as `words` (T, cdiv(tree_len,
    32)) int32 allow, prefix32 the same P as int32."""

    positions: torch.Tensor
    pos_add: int
    prefix: torch.Tensor
    prefix32: torch.Tensor
    slot_add: int
    words: torch.Tensor
    tree_len: int


class DraftHead(nn.Module):
    """The draft model. Holds weights only; caches, masks and the target's embedding/LM head are arguments."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        self.config = c = config
        bias = c.bias if c.arch == "eagle1" else False
        self.fc = nn.Linear(c.feature_size if c.arch == "eagle3" else 2 * c.hidden_size, c.hidden_size, bias=bias)
        if c.arch == "eagle1":
            self.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_layers))
        else:
            self.midlayer = _Layer(c, 0)
            if c.num_layers > 1:  # deeper EAGLE-3 heads: plain decoder layers after the midlayer
                self.layers = nn.ModuleList(_Layer(c, i, wide=False) for i in range(1, c.num_layers))
            self.norm = _RMSNorm(c.hidden_size)
            self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(c.head_dim, c.rope_theta, dict(c.rope_scaling)),
                             persistent=False)
        self.ops: cpu_ops.CpuOps | None = None  # set on the frozen copy `for_drafting` makes
        self.compiled_layer: stack_ops.Midlayer | None = None  # ditto: an EAGLE-3 layer from blocks in one C call
        self.layer_kernels = False  # ditto: `step`'s small operations as the target's Triton kernels (a GPU)

    def for_drafting(self, pack: bool | None = None, ops: cpu_ops.CpuOps | None = None,
                     block_ops: QuantOps | None = None, int8: bool = True, layer_kernels: bool = False) -> DraftHead:
        """A frozen copy to draft with: linears packed where that pays (`eagleviz.models.dense`), q/k/v and
        gate/up each fused into one product, and, given `ops` (the target's `kernels.cpu_ops`), each layer's
        small operations compiled, as in the target's forward. Given `block_ops` (a target computing from its
        file's blocks: `TargetModel.block_ops`), an fp32 head's products are rounded to Q8_0 blocks and computed
        as the target's are (int8 activations unless `int8` is False): a draft level then reads a quarter of the
        bytes. `layer_kernels` (the target's: a CUDA model whose steps fuse their small operations): the captured
        drafting's norms, RoPE with the cache writes, and SwiGLU gate as the same Triton kernels (`step`). The head
        drafts; it never decides the output, which the target verifies. This head is untouched (training goes
        on)."""
        frozen = for_inference(self, pack)
        for layer in frozen.blocks:
            a, m = layer.self_attn, layer.mlp
            a.qkv = Dense.of(a.q_proj, a.k_proj, a.v_proj, pack=pack)
            m.gate_up = Dense.of(m.gate_proj, m.up_proj, pack=pack)
        if block_ops is not None and all(p.dtype == torch.float32 and p.device.type == "cpu"
                                         for p in frozen.parameters()):
            to_q8_0(frozen, block_ops, int8)
        weights = list(frozen.parameters())
        fits = (ops is not None and self.config.head_dim % 16 == 0 and weights[0].dtype in cpu_ops.DTYPES
                and all(w.dtype == weights[0].dtype and w.device.type == "cpu" for w in weights)
                and all(layer.self_attn.qkv is not None for layer in frozen.blocks))
        frozen.ops = ops if fits else None
        frozen.layer_kernels = layer_kernels
        frozen.compiled_layer = frozen._block_midlayer(block_ops, int8) if fits and block_ops is not None else None
        return frozen

    def _block_midlayer(self, block_ops: QuantOps, int8: bool) -> stack_ops.Midlayer | None:
        """A one-layer EAGLE-3 head's layer from Q8_0 blocks in one C call (`kernels.stack_ops.draft_midlayer`:
        the calls and order of `_forward_fused`, so the same bits), or None where it does not apply or cannot be
        built."""
        c = self.config
        if c.arch != "eagle3" or c.num_layers != 1:
            return None
        layer = self.midlayer
        a, m = layer.self_attn, layer.mlp
        products = {"fc": getattr(self.fc, "dense", None), "qkv": a.qkv, "o": getattr(a.o_proj, "dense", None),
                    "gate_up": m.gate_up, "down": getattr(m.down_proj, "dense", None)}
        if not all(isinstance(p, QuantDense) and len(p.parts) == 1 and p.int8 == int8 for p in products.values()):
            return None
        built = stack_ops.load(cache_dir() / "kernels")
        if built is None:
            return None
        norms = {"hidden_norm": layer.hidden_norm.weight.detach(), "input_norm": layer.input_layernorm.weight.detach(),
                 "post_norm": layer.post_attention_layernorm.weight.detach()}
        return built.midlayer(self.ops, block_ops, int8, {k: p.parts[0] for k, p in products.items()}, norms,
                              c.norm_before_residual, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                              c.rms_norm_eps)

    @property
    def blocks(self) -> list[_Layer]:
        """Every decoder layer in order; block i owns layer i of the draft KV cache."""
        if self.config.arch == "eagle1":
            return list(self.layers)
        return [self.midlayer] + (list(self.layers) if self.config.num_layers > 1 else [])

    def new_cache(self, capacity: int, dtype: torch.dtype, device) -> KVCache:
        c = self.config
        return KVCache.allocate(len(self.blocks), c.num_kv_heads, capacity, c.head_dim, dtype, device)

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                tree_mask: torch.Tensor | None, impl: str = "torch") -> torch.Tensor:
        """features: (T, feature_size) target features, or (T, H) the head's own outputs (tree expansion);
        token_embeds: (T, H) target embeddings of the paired tokens; positions: (T,) draft positions;
        tree_mask: (T, Tk) over the last Tk cache slots or None. Returns the output feature (T, H) and
        advances cache.length by T."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, token_embeds.dtype)
        if (self.ops is not None and features.shape[0] <= cpu_ops.MAX_ROWS and cache.k.dtype == torch.float32
                and resolve_impl(impl, cache.k.device) == "torch"):
            return self._forward_fused(features, token_embeds, cos, sin, cache, tree_mask)
        h = self._stack(features, token_embeds, cos, sin,
                        lambda i, w, x: cached_attention(w, x, cos, sin, cache, i, tree_mask, impl))
        cache.advance(features.shape[0])
        return h

    def step(self, features: torch.Tensor, token_embeds: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor,
             tree_mask: torch.Tensor, cache: KVCache, impl: str = "torch") -> torch.Tensor:
        """`forward` as a captured draft level runs it (`eagleviz.decoding.device_draft`): T tokens whose
        keys go at the last T of the slots [P, P + Tk) that tree_mask (T, Tk) governs, P (prefix: (1,) int64)
        in device memory, attention over the whole static cache. Touches no Python state (`cache.length` is
        the caller's). The same operations as `forward`'s PyTorch path; with `layer_kernels`, its norms, RoPE
        with the cache writes and SwiGLU gate as Triton kernels (`_stack_fused`)."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, token_embeds.dtype)
        frame = StepFrame.for_step(prefix, tree_mask, cache.capacity, impl)
        fused = self.layer_kernels

        def attend(i: int, w: AttentionWeights, x: torch.Tensor) -> torch.Tensor:
            return step_attention(w, x, cos, sin, cache, i, frame, impl, fused)

        if fused:
            return self._stack_fused(features, token_embeds, attend)
        return self._stack(features, token_embeds, cos, sin, attend)

    def _stack_fused(self, features: torch.Tensor, token_embeds: torch.Tensor, attend) -> torch.Tensor:
        """`_stack` with each layer's norms and SwiGLU gate as the target's Triton kernels (`kernels.layer_ops`:
        a norm adds the residual it follows in place), as `TargetModel.step` runs its layers."""
        c, eps = self.config, self.config.rms_norm_eps

        def mlp(layer: _Layer, x: torch.Tensor) -> torch.Tensor:
            return layer.mlp.down_proj(layer_ops.silu_mul(layer.mlp.gate_up(x)))

        if c.arch == "eagle1":
            h = self.fc(torch.cat((token_embeds, features), dim=-1))
            for i, layer in enumerate(self.layers):
                x = h if i == 0 else layer_ops.add_rms_norm(h, None, layer.input_layernorm.weight, eps)
                x = layer_ops.add_rms_norm(h, attend(i, self._attn(layer), x), layer.post_attention_layernorm.weight,
                                           eps)
                h.add_(mlp(layer, x))
            return h
        layer = self.midlayer
        g = self.fc(features) if features.shape[-1] != c.hidden_size else features
        normed = layer_ops.add_rms_norm(g, None, layer.hidden_norm.weight, eps)
        a = torch.cat((layer_ops.add_rms_norm(token_embeds, None, layer.input_layernorm.weight, eps), normed), dim=-1)
        h = (normed if c.norm_before_residual else g) + attend(0, self._attn(layer), a)  # a new residual stream
        h.add_(mlp(layer, layer_ops.add_rms_norm(h, None, layer.post_attention_layernorm.weight, eps)))
        for i, extra in enumerate(self.blocks[1:], start=1):
            x = layer_ops.add_rms_norm(h, None, extra.input_layernorm.weight, eps)
            x = layer_ops.add_rms_norm(h, attend(i, self._attn(extra), x), extra.post_attention_layernorm.weight, eps)
            h.add_(mlp(extra, x))
        return h

    @property
    def runs_products(self) -> bool:
        """Whether the captured drafting can run this head's layers as the target's five-kernel layer
        (`step_products`): an EAGLE-3 head (its midlayer, and any plain layers after it) whose q/k/v and gate/up
        are fused products, with no bias but q/k/v's, heads a multiple of 32 wide (`kernels.layer_products`)."""
        if self.config.arch != "eagle3" or self.config.head_dim % 32:
            return False
        return all(layer.self_attn.qkv is not None and layer.mlp.gate_up is not None
                   and layer.self_attn.o_proj.bias is None and layer.mlp.gate_up.bias is None
                   and layer.mlp.down_proj.bias is None for layer in self.blocks)

    def step_products(self, g: torch.Tensor, ids: torch.Tensor, embed: torch.Tensor, rope: tuple[torch.Tensor,
                      torch.Tensor], at: ProductsFrame, cache: KVCache, normed: bool = False) -> torch.Tensor:
        """`step` for an EAGLE-3 head (`runs_products`) as the target's five-kernel layer runs, each input read where
        it lies: g (T, H) the fused features (or, drafting a level, the parents' outputs; `normed`: hidden_norm
        already applied, as `kernels.draft_select.frontier` gathers them where the residual is the normed rows),
        ids (T,) the tokens, whose embeddings the q/k/v product gathers from `embed` and norms itself; RoPE from
        the tables `rope`; the slots and positions in `at`. A layer is five kernels: the q/k/v product with both
        norms, RoPE and the cache writes; attention; the o product with the residual add; the norm, gate/up product
        and SwiGLU gate; the down product with its residual add. g is the residual stream, updated in place (a
        buffer of the caller's); returns it."""
        c, layer = self.config, self.midlayer
        norm_g = None if normed else layer.hidden_norm.weight
        if c.norm_before_residual and not normed:  # the residual stream is hidden_norm(g), the q/k/v input beside
            g, norm_g = layer_ops.add_rms_norm(g, None, layer.hidden_norm.weight, c.rms_norm_eps), None
        h = self._layer_products(0, layer, embed, ids, g, norm_g, g, rope, at, cache)
        for i, extra in enumerate(self.blocks[1:], start=1):
            h = self._layer_products(i, extra, h, None, None, None, h, rope, at, cache)
        return h

    def _layer_products(self, i: int, layer: _Layer, a: torch.Tensor, a_ids: torch.Tensor | None,
                        b: torch.Tensor | None, norm_b: torch.Tensor | None, h: torch.Tensor,
                        rope: tuple[torch.Tensor, torch.Tensor], at: ProductsFrame, cache: KVCache) -> torch.Tensor:
        """Layer i in five kernels: its input [input_norm(a[a_ids] or a), norm_b(b)], h the residual stream."""
        c, attn, mlp, eps = self.config, layer.self_attn, layer.mlp, self.config.rms_norm_eps
        q = layer_products.norm_qkv_rope(a, layer.input_layernorm.weight, a_ids, b, norm_b, attn.qkv.weight,
                                         attn.qkv.bias, rope, at.positions, at.pos_add, at.prefix, at.slot_add,
                                         cache.k[i], cache.v[i], c.num_heads, c.num_kv_heads, eps)
        keys, values = cache.view(i, cache.capacity)
        out = attention_static(q.to(keys.dtype), keys, values, at.prefix32, at.words, impl="triton",
                               tree_len=at.tree_len)
        layer_products.matmul_residual(out.to(h.dtype).reshape(q.shape[0], -1), attn.o_proj.weight, h)
        act = layer_products.norm_gate_up(h, layer.post_attention_layernorm.weight, mlp.gate_up.weight, eps)
        return layer_products.matmul_residual(act, mlp.down_proj.weight, h)

    def _stack(self, features: torch.Tensor, token_embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               attend) -> torch.Tensor:
        """The head's layers, attend(layer index, AttentionWeights, x) -> the attention's output."""
        c = self.config
        if c.arch == "eagle1":
            h = self.fc(torch.cat((token_embeds, features), dim=-1))
            for i, layer in enumerate(self.layers):
                x = h if i == 0 else rms_norm(h, layer.input_layernorm.weight, c.rms_norm_eps)
                h = h + attend(i, self._attn(layer), x)
                h = h + swiglu_mlp(layer.mlp, rms_norm(h, layer.post_attention_layernorm.weight, c.rms_norm_eps),
                                   getattr(layer.mlp, "gate_up", None))
            return h
        layer = self.midlayer
        g = self.fc(features) if features.shape[-1] != c.hidden_size else features
        normed = rms_norm(g, layer.hidden_norm.weight, c.rms_norm_eps)
        a = torch.cat((rms_norm(token_embeds, layer.input_layernorm.weight, c.rms_norm_eps), normed), dim=-1)
        h = (normed if c.norm_before_residual else g) + attend(0, self._attn(layer), a)
        h = h + swiglu_mlp(layer.mlp, rms_norm(h, layer.post_attention_layernorm.weight, c.rms_norm_eps),
                           getattr(layer.mlp, "gate_up", None))
        for i, extra in enumerate(self.blocks[1:], start=1):
            x = rms_norm(h, extra.input_layernorm.weight, c.rms_norm_eps)
            h = h + attend(i, self._attn(extra), x)
            h = h + swiglu_mlp(extra.mlp, rms_norm(h, extra.post_attention_layernorm.weight, c.rms_norm_eps),
                               getattr(extra.mlp, "gate_up", None))
        return h

    def _forward_fused(self, features: torch.Tensor, token_embeds: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, cache: KVCache, tree_mask: torch.Tensor | None) -> torch.Tensor:
        """`forward` through the compiled operations (`for_drafting`); the same arithmetic as the PyTorch path."""
        c, ops = self.config, self.ops
        dtype = self.blocks[0].post_attention_layernorm.weight.dtype  # the compiled calls take one dtype
        cos, sin = cos.to(dtype), sin.to(dtype)
        mask = None if tree_mask is None else tree_mask.contiguous()
        if c.arch == "eagle1":
            h = self.fc(torch.cat((token_embeds, features), dim=-1))
            for i, layer in enumerate(self.layers):
                x = h if i == 0 else ops.rms_norm(h, layer.input_layernorm.weight, c.rms_norm_eps)
                h = self._block_fused(layer, i, x, h.clone(), cos, sin, cache, mask)
        elif self.compiled_layer is not None:  # the same calls in one C call
            h = self.compiled_layer.run(features.contiguous(), token_embeds.contiguous(), cos.contiguous(),
                                        sin.contiguous(), cache.k, cache.v, cache.length, mask,
                                        torch.get_num_threads())
        else:
            layer = self.midlayer
            g = self.fc(features) if features.shape[-1] != c.hidden_size else features.contiguous()
            normed = ops.rms_norm(g, layer.hidden_norm.weight, c.rms_norm_eps)
            x = torch.cat((ops.rms_norm(token_embeds.contiguous(), layer.input_layernorm.weight, c.rms_norm_eps),
                           normed), dim=-1)
            h = self._block_fused(layer, 0, x, normed if c.norm_before_residual else g.clone(), cos, sin, cache, mask)
            for i, extra in enumerate(self.blocks[1:], start=1):
                x = ops.rms_norm(h, extra.input_layernorm.weight, c.rms_norm_eps)
                h = self._block_fused(extra, i, x, h, cos, sin, cache, mask)
        cache.advance(features.shape[0])
        return h

    def _block_fused(self, layer: _Layer, index: int, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, cache: KVCache, mask: torch.Tensor | None) -> torch.Tensor:
        """h + attn(x), then + mlp(post-norm), updating h in place (h is the caller's copy of the residual)."""
        c, ops, a, m = self.config, self.ops, layer.self_attn, layer.mlp
        out = ops.self_attention(a.qkv(x), cos, sin, cache.k, cache.v, index, cache.length, mask, c.num_heads,
                                 c.num_kv_heads)
        y = ops.rms_norm(h, layer.post_attention_layernorm.weight, c.rms_norm_eps, delta=a.o_proj(out))
        return h.add_(m.down_proj(ops.silu_mul(m.gate_up(y))))

    def _attn(self, layer: _Layer) -> AttentionWeights:
        a, c = layer.self_attn, self.config
        return AttentionWeights(a.q_proj, a.k_proj, a.v_proj, a.o_proj, c.num_heads, c.num_kv_heads, c.head_dim,
                                qkv=getattr(a, "qkv", None))

    def logits(self, h: torch.Tensor, target_lm_head: nn.Module, products: bool = False) -> torch.Tensor:
        """(T, H) -> (T, Vd) fp32 draft logits (Vd = V for EAGLE-1: the target's own LM head). `products`: an
        EAGLE-3 head's final norm in its LM head's prologue, one kernel (`kernels.layer_products.norm_matmul`)."""
        if products:
            return layer_products.norm_matmul(h, self.norm.weight, self.lm_head.weight, self.config.rms_norm_eps)
        if self.config.arch == "eagle1":
            return target_lm_head(h).float()
        eps = self.config.rms_norm_eps
        normed = (layer_ops.add_rms_norm(h, None, self.norm.weight, eps) if self.layer_kernels
                  else rms_norm(h, self.norm.weight, eps))
        return self.lm_head(normed).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids (identity for EAGLE-1 and full-vocabulary EAGLE-3)."""
        offsets = self.target_offsets()
        return draft_ids if offsets is None else draft_ids + offsets[draft_ids]

    def target_offsets(self) -> torch.Tensor | None:
        """d2t: target id = draft id + d2t[draft id]; None where the draft vocabulary is the target's."""
        if self.config.arch == "eagle1" or self.config.draft_vocab_size == self.config.vocab_size:
            return None
        return self.d2t


def random_head(target, arch: str = "eagle1", seed: int = 0, num_layers: int = 1, std: float = 0.02) -> DraftHead:
    """A randomly initialised head shaped for `target` (the engine is lossless whatever the head predicts)."""
    gen = torch.Generator().manual_seed(seed)
    head = DraftHead(DraftConfig.for_target(target, arch, num_layers))
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.randn(p.shape, generator=gen) * std)
    return head.to(target.dtype).to(target.device).eval()


def save_head(head: DraftHead, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write config.json + model.safetensors with the official key names (no embedding)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in head.state_dict().items()}
    if head.config.arch == "eagle3" and head.config.draft_vocab_size == head.config.vocab_size:
        state.pop("d2t"), state.pop("t2d")
    cfg = head.config.to_hf() | {"torch_dtype": str(dtype).removeprefix("torch.")}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(state, str(out / "model.safetensors"))


def load_head(path: str | Path, target) -> DraftHead:
    """Load a head directory in any published layout (`eagleviz.models.layouts`) for `target`, refused in one
    line before any weight is used when it does not fit (`eagleviz.models.compat`)."""
    path = Path(path)
    ckpt = read_checkpoint(path)
    check_fits(ckpt, target, str(path))
    try:
        config = DraftConfig.from_hf(ckpt.config, ckpt.arch, ckpt.num_layers)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserFacingError(f"draft head {path}: bad config.json ({exc.__class__.__name__}: {exc})") from exc
    head = DraftHead(config)
    state = {k: v for k, v in ckpt.state.items() if k != "embed_tokens.weight"}  # the target's embedding is used
    if config.arch == "eagle3" and "d2t" not in state:
        state["d2t"] = head.d2t
        state["t2d"] = head.t2d
    own = head.state_dict()
    for key, value in state.items():
        if key in own and own[key].shape != value.shape:
            raise UserFacingError(f"draft head {path}: {key} has shape {tuple(value.shape)}, "
                                  f"expected {tuple(own[key].shape)} for this target")
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserFacingError(f"draft head {path}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
    return head.to(dtype=target.dtype, device=target.device).eval()
