"""The target model: a Hugging Face Llama-family causal LM run by our own forward.

We borrow the weights of the HF module (embedding, decoder layers, final norm, LM head, rotary embedding)
and run the layers ourselves so that
  * keys and values live in our preallocated `KVCache` (explicit length, cheap rewind);
  * every attention goes through the tree-attention dispatcher (`impl` = torch or triton), except that on a
    CPU the short forwards of decoding and verification run each layer's norms, RoPE, cache write,
    attention and SiLU as compiled C calls (`kernels.cpu_ops`, `_forward_fused`);
  * the forward returns the features EAGLE needs: the post-norm last hidden state (EAGLE-1/2) and the
    inputs of layers 2, N//2 and N-3 (EAGLE-3).
Llama, Mistral, Qwen2 (q/k/v biases live in the Linear modules) and Qwen3 (per-head q/k norms) share it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from eagleviz.models.kv_cache import KVCache
from eagleviz.paths import cache_dir
from eagleviz.models.dense import Dense
from eagleviz.models.quantized import QuantDense, weight_names
from eagleviz.models.layers import (AttentionWeights, StepFrame, attention_dtype, cached_attention, rms_norm,
                                    step_attention, swiglu_mlp)
from kernels import cpu_ops, layer_ops, layer_products, quant_ops, stack_ops
from kernels.quant_ops import QuantWeight
from kernels.tree_attention import attention_static, interpreting, pack_mask_bits, resolve_impl, static_visibility

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# How products from weight blocks take their inputs: quantized per block of 32 to int8 and multiplied in
# integers (llama.cpp's scheme), or as fp32 rows (`kernels/quant_ops.c`)
ACTIVATIONS = ("int8", "fp32")
LAYER_KERNELS_ENV = "EAGLEVIZ_LAYER_KERNELS"   # "products": a GPU's steps run the five-kernel layer (`_layer_products`)
BLOCKS_MAX_ROWS = 256  # the largest tree (config.LIMITS) and most prompts: see `TargetModel.forward`


@dataclass
class TargetOutput:
    """logits: (R, V) fp32 for the requested rows; features: (T, F), the draft head's input feature at each
    of the T positions (post-norm hidden, or the concatenated EAGLE-3 layer inputs)."""

    logits: torch.Tensor | None
    features: torch.Tensor


ROPE_BLOCK_VALUES = 16_384   # values a block of `TargetModel._rope_rows`' table: half PyTorch's grain (32,768)


class TargetModel:
    """A read-only wrapper: shared by every run, it holds no per-run state (caches are arguments).

    pack: how the forward's linears are run (`eagleviz.models.dense.Dense`): None packs bf16 and fp32 CPU
    weights for oneDNN once (bf16: the same kernels without a per-call reorder, ~1.3x faster decoding; fp32:
    oneDNN's kernel from 4 rows on, ~2x cheaper tree verification without AMX), False keeps plain `linear`
    calls. fused: whether forwards of up to `kernels.cpu_ops.MAX_ROWS` tokens run the small operations of each layer
    (norms, RoPE, cache write, attention, SiLU) as 4 compiled C calls (`kernels.cpu_ops`) instead of ~65
    PyTorch operations: None when the C library builds and the model allows it (a CPU, bf16 or fp32, fused
    q/k/v, no per-head norms, a head size that is a multiple of 16), False never, True insists. kv_dtype: the
    dtype of the KV caches and of attention; None takes fp32 when the fused layer runs (its attention reads
    fp32), else measures which is faster on this machine (`eagleviz.models.layers.attention_dtype`). stack:
    from blocks with the fused layer, whether the whole decoder stack runs in one C call (`kernels.stack_ops`,
    bitwise the same results): None when it builds, False keeps one Python call per operation (the reference)."""

    def __init__(self, hf_model: nn.Module, tokenizer, name: str, pack: bool | None = None,
                 kv_dtype: torch.dtype | None = None, fused: bool | None = None,
                 blocks: dict[str, QuantWeight] | None = None, activations: str = "int8", stack: bool | None = None,
                 layer_kernels: bool | str | None = None):
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
        self.activations = activations
        cfg = hf_model.config
        if cfg.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model type {cfg.model_type!r} is not supported; use one of {SUPPORTED_MODEL_TYPES}")
        self.hf = hf_model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.config = cfg
        self.num_layers = cfg.num_hidden_layers
        self.hidden_size = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size = cfg.vocab_size
        self.max_positions = getattr(cfg, "max_position_embeddings", 4096)
        self.eps = cfg.rms_norm_eps
        base = hf_model.model
        self._embed = base.embed_tokens
        self._layers = base.layers
        self._norm = base.norm
        self._rotary = base.rotary_emb
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None   # `_rope_rows`
        self.lm_head = hf_model.lm_head
        self._quant = self._quant_ops(blocks, hf_model)
        self.unembed = self._dense(hf_model.lm_head, pack=pack)  # the LM head for inference (packed)
        self._attn = [self._attention_weights(layer, pack) for layer in base.layers]
        self._gate_up = [self._dense(layer.mlp.gate_proj, layer.mlp.up_proj, pack=pack) for layer in base.layers]
        self._down = [self._dense(layer.mlp.down_proj, pack=pack) for layer in base.layers]
        # "blocks" when every product computes from blocks (so the forward is batch invariant), else "dense"
        self.weights = "dense" if self._quant is None else "blocks"
        # the products' library a draft head beside this target computes with (Q8_0 blocks), or None
        self.block_ops = None if self._quant is None else self._quant[0]
        # the norm after layer i's MLP: layer i + 1's input norm, the final norm after the last layer
        self._next_norms = [layer.input_layernorm.weight for layer in base.layers[1:]] + [base.norm.weight]
        self.eos_token_ids = _eos_ids(hf_model, tokenizer)
        self.ops = self._fused_ops(fused, kv_dtype)
        self.kv_dtype = kv_dtype or (torch.float32 if self.ops else attention_dtype(
            self.dtype, self.device, self.num_heads, self.num_kv_heads, self.head_dim))
        self._stack = self._block_stack(stack)
        self.layer_kernels = self._layer_kernels(bool(layer_kernels) if layer_kernels is not None else None)
        self.layer_products = self._layer_products(layer_kernels)

    def _layer_kernels(self, wanted: bool | None) -> bool:
        """Whether `step` runs each layer's small operations as Triton kernels (`kernels.layer_ops`): None on a
        CUDA model whose layers allow them (fused q/k/v, no per-head norms); True insists (a ValueError naming
        why not), and on a CPU runs them in Triton's interpreter where TRITON_INTERPRET=1 (tests)."""
        reasons = [why for bad, why in (
            (layer_ops.tl is None, "Triton is not installed"),
            (self.device.type != "cuda" and not (wanted and interpreting()), "the model is not on a CUDA GPU"),
            (any(a.qkv is None or a.q_norm is not None for a in self._attn), "q/k/v are not fused or have per-head norms"),
        ) if bad]
        if wanted and reasons:
            raise ValueError("the fused layer kernels cannot run: " + "; ".join(reasons))
        return wanted is not False and not reasons

    def _layer_products(self, wanted: bool | str | None) -> bool:
        """Whether `step` runs each layer as five kernels, the products with their norms, RoPE, cache writes,
        SwiGLU gate and residual adds fused in (`kernels.layer_products`): "products" insists (a ValueError naming
        why not); None takes them where EAGLEVIZ_LAYER_KERNELS=products asks and the model allows; otherwise the
        9-kernel layer of `kernels.layer_ops` (until a GPU's measurement says which is faster)."""
        asked = wanted == "products" or (wanted is None and os.environ.get(LAYER_KERNELS_ENV, "") == "products")
        if not asked:
            return False
        dense = [d for i in range(len(self._layers)) for d in (self._attn[i].qkv, self._attn[i].o_proj,
                                                                  self._gate_up[i], self._down[i])]
        reasons = [why for bad, why in (
            (not self.layer_kernels, "the layer kernels do not run here (a CUDA GPU, or Triton's interpreter)"),
            (any(not isinstance(d, Dense) for d in dense), "a product is not a dense weight"),
            (any(d.bias is not None for d in dense[1::4] + dense[2::4] + dense[3::4] if isinstance(d, Dense)),
             "the o, gate/up or down products have a bias"),
            (self.head_dim % 32 != 0, f"the head size {self.head_dim} is not a multiple of 32"),
        ) if bad]
        if reasons and wanted == "products":
            raise ValueError("the five-kernel layer cannot run: " + "; ".join(reasons))
        return not reasons

    def _block_stack(self, stack: bool | None) -> stack_ops.Stack | None:
        """From blocks with the compiled layer: the decoder stack in one C call (`kernels.stack_ops`, bitwise
        the layer loop of `_forward_fused`), unless `stack` is False or a product is not one block weight."""
        if stack is False or self.weights != "blocks" or self.ops is None:
            return None
        products = [p for a, gu, down in zip(self._attn, self._gate_up, self._down) for p in (a.qkv, a.o_proj, gu, down)]
        if not all(isinstance(p, QuantDense) and len(p.parts) == 1 for p in products):
            return None
        built = stack_ops.load(cache_dir() / "kernels")
        if built is None:
            return None
        layers = [stack_ops.LayerWeights(a.qkv.parts[0], a.o_proj.parts[0], gu.parts[0], down.parts[0],
                                         layer.post_attention_layernorm.weight.detach(), nxt.detach())
                  for a, gu, down, layer, nxt in zip(self._attn, self._gate_up, self._down, self._layers,
                                                     self._next_norms)]
        return built.stack(self.ops, self._quant[0], self.activations == "int8", layers,
                           self._layers[0].input_layernorm.weight.detach(), self.num_heads, self.num_kv_heads,
                           self.head_dim, self.eps, ordered=True)

    def _fused_ops(self, fused: bool | None, kv_dtype: torch.dtype | None) -> cpu_ops.CpuOps | None:
        """The compiled layer operations when `fused` allows them and this model can use them, else None."""
        if fused is False:
            return None
        norms = [w for layer in self._layers for w in (layer.input_layernorm.weight,
                                                       layer.post_attention_layernorm.weight)]
        reasons = [why for bad, why in (
            (self.device.type != "cpu", "the model is not on a CPU"),
            (self.dtype not in cpu_ops.DTYPES, f"the model's dtype is {self.dtype}"),
            (kv_dtype not in (None, torch.float32), f"the KV cache is pinned to {kv_dtype}"),
            (self.head_dim % 16 != 0, f"the head size {self.head_dim} is not a multiple of 16"),
            (any(a.qkv is None or a.q_norm is not None for a in self._attn), "q/k/v are not fused or have per-head norms"),
            (any(w.dtype != self.dtype or not w.is_contiguous() for w in norms + [self._norm.weight]),
             "a norm weight differs in dtype or layout"),
        ) if bad]
        ops = None if reasons else cpu_ops.load(cache_dir() / "kernels")
        if ops is None and not reasons:
            reasons = [cpu_ops.last_error(cache_dir() / "kernels") or "unknown"]
            if not fused:  # the model could use it, the machine cannot build it: say so, once, and go on
                warnings.warn(f"eagleviz: the fused CPU layer (kernels/cpu_ops.c) could not be built, so decoding "
                              f"runs PyTorch's operations (~1.2x slower): {reasons[0]}", RuntimeWarning, stacklevel=3)
        if ops is None and fused:
            raise ValueError("the fused CPU layer is unavailable: " + "; ".join(reasons))
        return ops

    def _quant_ops(self, blocks: dict[str, QuantWeight] | None, hf_model: nn.Module):
        """What the linears need to compute from `blocks` (the products' library and each weight's name), or
        None: no blocks, not an fp32 CPU model, or the library cannot be built (said once)."""
        self.weights_note = ""
        if not blocks or self.device.type != "cpu" or self.dtype != torch.float32:
            return None
        names = weight_names(hf_model)
        linears = [m for m in hf_model.modules() if isinstance(m, nn.Linear)]
        missing = [names[id(m)] for m in linears if names[id(m)] not in blocks]
        if missing:  # all or nothing: a mix would lose batch invariance for nothing
            self.weights_note = (f"{len(missing)} of {len(linears)} linears (e.g. {missing[0]}) are not Q4_1/Q8_0 "
                                 "blocks, so every linear runs as a dense fp32 product")
            return None
        ops = quant_ops.load(cache_dir() / "kernels")
        if ops is None:
            warnings.warn("eagleviz: the quantized products (kernels/quant_ops.c) could not be built, so the "
                          f"weights run widened to fp32: {quant_ops.last_error(cache_dir() / 'kernels')}",
                          RuntimeWarning, stacklevel=3)
            return None
        return ops, blocks, names

    def _dense(self, *linears: nn.Linear, pack: bool | None):
        """The inference product of linears sharing an input: from their weight blocks where the model has
        them (`QuantDense`), else a `Dense`."""
        if self._quant is not None:
            ops, blocks, names = self._quant
            found = QuantDense.of(blocks, [names[id(lin)] for lin in linears], list(linears), ops,
                                  int8=self.activations == "int8")
            if found is not None:  # None: formats that cannot be concatenated (e.g. q4_1 with q8_0), or mixed biases
                return found
        return Dense.of(*linears, pack=pack)

    def _attention_weights(self, layer: nn.Module, pack: bool | None) -> AttentionWeights:
        a = layer.self_attn
        return AttentionWeights(a.q_proj, a.k_proj, a.v_proj, self._dense(a.o_proj, pack=pack), self.num_heads,
                                self.num_kv_heads, self.head_dim, getattr(a, "q_norm", None),
                                getattr(a, "k_norm", None), self.eps,
                                qkv=self._dense(a.q_proj, a.k_proj, a.v_proj, pack=pack))

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def eagle3_layers(self) -> tuple[int, int, int]:
        """Indices of the decoder layers whose inputs feed an EAGLE-3 head (low, mid, high)."""
        n = self.num_layers
        return (2, n // 2, n - 3)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache.allocate(self.num_layers, self.num_kv_heads, capacity, self.head_dim, self.kv_dtype,
                                self.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._embed(ids)

    @property
    def embed_weight(self) -> torch.Tensor:
        """The embedding table (V, H), which a kernel gathers rows of itself (`DraftHead.step_products`)."""
        return self._embed.weight

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, tree_mask: torch.Tensor | None,
                *, logit_rows: slice | None = slice(None), feature_layers: tuple[int, ...] | None = None,
                impl: str = "torch") -> TargetOutput:
        """Run T new tokens appended after the cache's committed slots.

        ids, positions: (T,) int64; tree_mask: (T, T) bool (ancestor-or-self; causal for a prompt) or None
        when T == 1. logit_rows picks the rows that need logits (None: none). feature_layers None returns
        the post-norm hidden state; a tuple returns the concatenated inputs of those layers (EAGLE-3).
        Advances cache.length by T.
        """
        # From blocks, any tree or prompt up to BLOCKS_MAX_ROWS takes the C layer, whose sums do not depend on the
        # batch (PyTorch's attention and norms do): verification then gives plain decoding's logits bit for bit
        rows_limit = BLOCKS_MAX_ROWS if self.weights == "blocks" else cpu_ops.MAX_ROWS
        if (self.ops is not None and ids.shape[0] <= rows_limit and cache.k.dtype == torch.float32
                and resolve_impl(impl, cache.k.device) == "torch"):
            return self._forward_fused(ids, positions, cache, tree_mask, logit_rows, feature_layers)
        out = self._stack_forward(ids, positions, logit_rows, feature_layers,
                                  lambda i, x, cos, sin: cached_attention(self._attn[i], x, cos, sin, cache, i,
                                                                          tree_mask, impl))
        cache.advance(ids.shape[0])
        return out

    def step(self, ids: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor, tree_mask: torch.Tensor,
             cache: KVCache, *, feature_layers: tuple[int, ...] | None = None, impl: str = "torch",
             words: torch.Tensor | None = None) -> TargetOutput:
        """`forward` as a captured step runs it (`eagleviz.models.static`): T tokens after P committed slots,
        where P (prefix: (1,) int64) is in device memory, tree_mask (T, T) bool, the logits of every row.
        Keys and values are written at slots [P, P + T) of the whole static cache, which every layer attends
        over as the step's `StepFrame` allows. Touches no Python state: `cache.length` is left to the caller.
        The same layer operations as `forward`'s eager path, in the same order; with `layer_kernels`, its
        small operations fused into Triton kernels (`kernels.layer_ops`: 9 kernels a layer); with `layer_products`
        five a layer (`_products_step`), where `words` may give tree_mask already packed for the Triton attention
        (a constant: a step of one token sees itself)."""
        if self.layer_products:
            return self._products_step(ids, positions, prefix, tree_mask, cache, feature_layers, impl, words)
        frame = StepFrame.for_step(prefix, tree_mask, cache.capacity, impl)
        fused = self.layer_kernels
        return self._stack_forward(ids, positions, slice(None), feature_layers,
                                   lambda i, x, cos, sin: step_attention(self._attn[i], x, cos, sin, cache, i,
                                                                         frame, impl, fused), fused)

    def _products_step(self, ids: torch.Tensor, positions: torch.Tensor, prefix: torch.Tensor,
                       tree_mask: torch.Tensor, cache: KVCache, feature_layers: tuple[int, ...] | None, impl: str,
                       words: torch.Tensor | None) -> TargetOutput:
        """`step` with each layer as five kernels (`kernels.layer_products`): the input norm, q/k/v product, RoPE
        (read from `rope_tables` at each row's position) and cache writes (at P + Tk - T + row, P read in device
        memory); the attention; the o product with its residual add; the second norm, gate/up product and SwiGLU
        gate; the down product with its residual add. The residual stream h is updated in place. Besides the
        layers: the embedding, P as int32 for the attention, the mask packed (none given `words`), the final
        norm, the LM head."""
        h = self._embed(ids)
        t, tk = h.shape[0], tree_mask.shape[1]
        rope = self.rope_tables(cache.capacity, h.dtype, h.device)  # (made before any capture: `StaticSteps`)
        prefix32 = prefix.to(torch.int32)
        if resolve_impl(impl, h.device) == "triton":
            mask = pack_mask_bits(tree_mask) if words is None else words
        else:
            mask = static_visibility(prefix32, tree_mask, cache.capacity)
        captured = {}
        for i, layer in enumerate(self._layers):
            if feature_layers is not None and i in feature_layers:
                captured[i] = h.clone()
            a = self._attn[i]
            q = layer_products.norm_qkv_rope(h, layer.input_layernorm.weight, None, None, None, a.qkv.weight,
                                             a.qkv.bias, rope, positions, 0, prefix, tk - t, cache.k[i], cache.v[i],
                                             a.num_heads, a.num_kv_heads, self.eps)
            keys, values = cache.view(i, cache.capacity)
            out = attention_static(q.to(keys.dtype), keys, values, prefix32, mask, impl=impl, tree_len=tk)
            layer_products.matmul_residual(out.to(h.dtype).reshape(t, a.num_heads * a.head_dim), a.o_proj.weight, h)
            act = layer_products.norm_gate_up(h, layer.post_attention_layernorm.weight, self._gate_up[i].weight,
                                              self.eps)
            layer_products.matmul_residual(act, self._down[i].weight, h)
        normed = layer_ops.add_rms_norm(h, None, self._norm.weight, self.eps)
        return self._outputs(normed, captured, slice(None), feature_layers)

    def _stack_forward(self, ids: torch.Tensor, positions: torch.Tensor, logit_rows: slice | None,
                       feature_layers: tuple[int, ...] | None, attend, fused: bool = False) -> TargetOutput:
        """Embedding, the decoder layers with attend(layer, x, cos, sin) -> the attention's output, final norm,
        logits of `logit_rows` and the features. `fused`: the norms and the SwiGLU gate as Triton kernels
        (`kernels.layer_ops`), the residual stream updated in place."""
        h = self._embed(ids)
        cos, sin = self._rotary(h, positions[None])
        cos, sin = cos[0], sin[0]
        captured = {}
        if fused:
            x = layer_ops.add_rms_norm(h, None, self._layers[0].input_layernorm.weight, self.eps)
            for i, layer in enumerate(self._layers):
                if feature_layers is not None and i in feature_layers:
                    captured[i] = h.clone()
                x = layer_ops.add_rms_norm(h, attend(i, x, cos, sin), layer.post_attention_layernorm.weight, self.eps)
                mlp = self._down[i](layer_ops.silu_mul(self._gate_up[i](x)))
                x = layer_ops.add_rms_norm(h, mlp, self._next_norms[i], self.eps)
            return self._outputs(x, captured, logit_rows, feature_layers)
        for i, layer in enumerate(self._layers):
            if feature_layers is not None and i in feature_layers:
                captured[i] = h
            x = rms_norm(h, layer.input_layernorm.weight, self.eps)
            h = h + attend(i, x, cos, sin)
            x = rms_norm(h, layer.post_attention_layernorm.weight, self.eps)
            h = h + swiglu_mlp(layer.mlp, x, self._gate_up[i], self._down[i])
        return self._outputs(rms_norm(h, self._norm.weight, self.eps), captured, logit_rows, feature_layers)

    def _outputs(self, normed: torch.Tensor, captured: dict[int, torch.Tensor] | torch.Tensor | None,
                 logit_rows: slice | None, feature_layers: tuple[int, ...] | None) -> TargetOutput:
        """The logits of `logit_rows` (None: none) of the final normed states, and the features: the captured
        layers' inputs joined in `feature_layers`' order (`captured` a tensor: already joined)."""
        logits = None if logit_rows is None else self.unembed(normed[logit_rows]).float()
        features = (normed if feature_layers is None else captured if isinstance(captured, torch.Tensor) else
                    torch.cat([captured[i] for i in feature_layers], dim=-1))
        return TargetOutput(logits=logits, features=features)

    def _forward_fused(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                       tree_mask: torch.Tensor | None, logit_rows: slice | None,
                       feature_layers: tuple[int, ...] | None) -> TargetOutput:
        """`forward` with each layer's small operations in `kernels.cpu_ops`: the residual stream h is updated
        in place by the norms that follow each add, and the products stay `Dense` calls."""
        ops, eps, t, start = self.ops, self.eps, ids.shape[0], cache.length
        h = torch.embedding(self._embed.weight, ids)   # the module's own operation, without a module's call
        cos, sin = self._rope_rows(cache.capacity, h.dtype, positions)
        mask = None if tree_mask is None else tree_mask.contiguous()
        if self._stack is not None:  # the same operations as the loop below, in one C call
            x, features = self._stack.run(h, cos, sin, cache.k, cache.v, start, mask, feature_layers,
                                          torch.get_num_threads())
            return self._finish(x, features, cache, t, logit_rows, feature_layers)
        captured = {}
        ordered = self.weights == "blocks"  # batch-invariant sums where the products are too
        x = ops.rms_norm(h, self._layers[0].input_layernorm.weight, eps, ordered=ordered)
        for i, layer in enumerate(self._layers):
            if feature_layers is not None and i in feature_layers:
                captured[i] = h.clone()
            attn = self._attn[i]
            out = ops.self_attention(attn.qkv(x), cos, sin, cache.k, cache.v, i, start, mask, self.num_heads,
                                     self.num_kv_heads, ordered)
            x = ops.rms_norm(h, layer.post_attention_layernorm.weight, eps, delta=attn.o_proj(out), ordered=ordered)
            x = ops.rms_norm(h, self._next_norms[i], eps, delta=self._down[i](ops.silu_mul(self._gate_up[i](x))),
                             ordered=ordered)
        return self._finish(x, captured, cache, t, logit_rows, feature_layers)

    def rope_tables(self, capacity: int, dtype: torch.dtype,
                    device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin tables (R, head_dim), R >= capacity: the rotary module's rows for positions [0, R),
        kept and grown by doubling (`_rope_rows` reads them; the five-kernel layer's q/k/v product reads them
        itself, at each row's position). Each row is what the module gives for its position alone, bit for bit
        (`tests/test_models.py`): its operations are elementwise, and the table is made in blocks of ROPE_BLOCK_VALUES
        values, each below PyTorch's grain (one thread, one vector loop over the block); a head size that
        PyTorch's widest vector loop does not divide leaves a row's last values to its scalar loop, so there each
        row is made alone."""
        table = self._rope_table
        if table is None or table[0].shape[0] < capacity or table[0].dtype != dtype:
            n = max(capacity, 2 * table[0].shape[0] if table is not None and table[0].dtype == dtype else 0)
            dev = self.device if device is None else device
            probe = torch.empty(1, dtype=dtype, device=dev)
            step = max(1, ROPE_BLOCK_VALUES // self.head_dim) if self.head_dim % 32 == 0 else 1
            rows = [self._rotary(probe, torch.arange(a, min(a + step, n), device=dev)[None]) for a in range(0, n, step)]
            table = self._rope_table = (torch.cat([c[0] for c, _ in rows]), torch.cat([s[0] for _, s in rows]))
            # (one assignment: a run reading the table beside this one sees the old or the new, both right)
        return table

    def _rope_rows(self, capacity: int, dtype: torch.dtype,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin (T, head_dim) at `positions` (each below `capacity`), read from `rope_tables`: a lookup
        costs a fifth of the module's six operations a step."""
        table = self.rope_tables(capacity, dtype, positions.device)
        return table[0].index_select(0, positions), table[1].index_select(0, positions)

    def _finish(self, x: torch.Tensor, captured: dict[int, torch.Tensor] | torch.Tensor | None, cache: KVCache, t: int,
                logit_rows: slice | None, feature_layers: tuple[int, ...] | None) -> TargetOutput:
        """After the layers: the cache advanced, the logits of `logit_rows`, the features."""
        cache.advance(t)
        return self._outputs(x, captured, logit_rows, feature_layers)


def _eos_ids(hf_model: nn.Module, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (hf_model.config, getattr(hf_model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
