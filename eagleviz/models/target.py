"""The target model: a Hugging Face Llama-family causal LM run by our own forward.

We borrow the weights of the HF module (embedding, decoder layers, final norm, LM head, rotary embedding)
and run the layers ourselves so that
  * keys and values live in our preallocated `KVCache` (explicit length, cheap rewind);
  * every attention goes through the tree-attention dispatcher (`impl` = torch or triton);
  * the forward returns the features EAGLE needs: the post-norm last hidden state (EAGLE-1/2) and the
    inputs of layers 2, N//2 and N-3 (EAGLE-3).
Llama, Mistral, Qwen2 (q/k/v biases live in the Linear modules) and Qwen3 (per-head q/k norms) share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from eagleviz.kv_cache import KVCache
from eagleviz.models.dense import Dense
from eagleviz.models.layers import AttentionWeights, attention_dtype, cached_attention, rms_norm, swiglu_mlp

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class TargetOutput:
    """logits: (R, V) fp32 for the requested rows; features: (T, F), the draft head's input feature at each
    of the T positions (post-norm hidden, or the concatenated EAGLE-3 layer inputs)."""

    logits: torch.Tensor | None
    features: torch.Tensor


class TargetModel:
    """A read-only wrapper: shared by every run, it holds no per-run state (caches are arguments).

    pack: how the forward's linears are run (`eagleviz.models.dense.Dense`): None packs bf16 and fp32 CPU
    weights for oneDNN once (bf16: the same kernels without a per-call reorder, ~1.3x faster decoding; fp32:
    oneDNN's kernel from 4 rows on, ~2x cheaper tree verification without AMX), False keeps plain `linear`
    calls. kv_dtype: the dtype of the KV caches and of attention; None measures which is faster on this
    machine (`eagleviz.models.layers.attention_dtype`)."""

    def __init__(self, hf_model: nn.Module, tokenizer, name: str, pack: bool | None = None,
                 kv_dtype: torch.dtype | None = None):
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
        self.lm_head = hf_model.lm_head
        self.unembed = Dense.of(hf_model.lm_head, pack=pack)  # the LM head for inference (packed)
        self._attn = [self._attention_weights(layer, pack) for layer in base.layers]
        self._gate_up = [Dense.of(layer.mlp.gate_proj, layer.mlp.up_proj, pack=pack) for layer in base.layers]
        self._down = [Dense.of(layer.mlp.down_proj, pack=pack) for layer in base.layers]
        self.eos_token_ids = _eos_ids(hf_model, tokenizer)
        self.kv_dtype = kv_dtype or attention_dtype(self.dtype, self.device, self.num_heads, self.num_kv_heads,
                                                    self.head_dim)

    def _attention_weights(self, layer: nn.Module, pack: bool | None) -> AttentionWeights:
        a = layer.self_attn
        return AttentionWeights(a.q_proj, a.k_proj, a.v_proj, Dense.of(a.o_proj, pack=pack), self.num_heads,
                                self.num_kv_heads, self.head_dim, getattr(a, "q_norm", None),
                                getattr(a, "k_norm", None), self.eps, qkv=Dense.of(a.q_proj, a.k_proj, a.v_proj, pack=pack))

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
        h = self._embed(ids)
        cos, sin = self._rotary(h, positions[None])
        cos, sin = cos[0], sin[0]
        captured = {}
        for i, layer in enumerate(self._layers):
            if feature_layers is not None and i in feature_layers:
                captured[i] = h
            x = rms_norm(h, layer.input_layernorm.weight, self.eps)
            h = h + cached_attention(self._attn[i], x, cos, sin, cache, i, tree_mask, impl)
            x = rms_norm(h, layer.post_attention_layernorm.weight, self.eps)
            h = h + swiglu_mlp(layer.mlp, x, self._gate_up[i], self._down[i])
        cache.advance(ids.shape[0])
        normed = rms_norm(h, self._norm.weight, self.eps)
        logits = None if logit_rows is None else self.unembed(normed[logit_rows]).float()
        features = normed if feature_layers is None else torch.cat([captured[i] for i in feature_layers], dim=-1)
        return TargetOutput(logits=logits, features=features)


def _eos_ids(hf_model: nn.Module, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (hf_model.config, getattr(hf_model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
