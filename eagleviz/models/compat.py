"""Whether a draft head fits a target, decided before a single token: every mismatch named in one line.

A head reads the target's embeddings (and, for EAGLE-1, its LM head), consumes target features of a given
width, drafts over a vocabulary that must be the target's, and maps a reduced draft vocabulary to target
ids through d2t/t2d. Each of those is checked against the target here, together with the signs that a
file is not what it claims (an EAGLE-3 config over EAGLE-1 weights, a layer count the weights contradict)
and the settings of its own layers that eagleviz cannot reproduce.

What is not a mismatch: a head whose rope_theta differs from the target's. The draft has its own KV cache
and positions and rotates with the base it was trained with (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B has no
rope_theta, so 10000, under a target at 500000); eagleviz honours the head's own value.

`mismatches` returns the list (empty when the head fits) so that callers such as gpu-check can report
them; `check_fits` raises the one-line `UserFacingError`.
"""

from __future__ import annotations

import torch

from eagleviz.errors import UserFacingError
from eagleviz.models.layouts import Checkpoint

ROPE_TYPES = ("default", "linear", "llama3")  # the scalings eagleviz reproduces (eagleviz.models.layers.rope_inv_freq)
UNSUPPORTED_FLAGS = {
    "norm_before_fc": "an RMSNorm over the fused features before fc (speculators' norm_before_fc)",
    "layernorms": "the extra embedding and LM-head layernorms of HASS-style heads (speculators' layernorms)",
}


def mismatches(ckpt: Checkpoint, target) -> list[str]:
    """Every way the head `ckpt` does not fit `target` (a `TargetModel`), each named in a short phrase."""
    found = _shape_problems(ckpt, target) + _arch_problems(ckpt, target) + _attention_problems(ckpt)
    if ckpt.arch == "eagle3":
        found += _vocab_map_problems(ckpt, target.vocab_size)
    return found + [f"unsupported feature: {what}" for flag, what in UNSUPPORTED_FLAGS.items() if ckpt.config.get(flag)]


def check_fits(ckpt: Checkpoint, target, name: str) -> None:
    """Raise one line naming every mismatch between the head `name` and `target`, or return."""
    found = mismatches(ckpt, target)
    if found:
        raise UserFacingError(f"draft head {name} ({ckpt.layout} layout) does not fit the target {target.name}: "
                              + "; ".join(found))


def _shape_problems(ckpt: Checkpoint, target) -> list[str]:
    cfg, found = ckpt.config, []
    hidden = cfg.get("hidden_size")
    if hidden != target.hidden_size:
        why = "embeddings and LM head" if ckpt.arch == "eagle1" else "embeddings"
        found.append(f"hidden size: the head is {hidden} wide, the target {target.hidden_size} (the head reads the "
                     f"target's {why})")
    feature = cfg.get("target_hidden_size") or hidden
    if ckpt.arch == "eagle3" and feature != target.hidden_size:
        found.append(f"target_hidden_size: the head fuses target features of width {feature}, the target's hidden "
                     f"size is {target.hidden_size}")
    if cfg.get("vocab_size") != target.vocab_size:
        found.append(f"vocab size: the head was made for a vocabulary of {cfg.get('vocab_size')}, the target has "
                     f"{target.vocab_size}")
    return found


def _arch_problems(ckpt: Checkpoint, target) -> list[str]:
    """EAGLE-1 against EAGLE-3: what config.json claims, the weights' layout, the fusion layer's width, the
    layer count, and which target layers an EAGLE-3 head reads."""
    found, cfg, arch = [], ckpt.config, ckpt.arch
    declared = ckpt.declared_arch
    if declared is not None and declared != arch:
        found.append(f"architecture: config.json describes an {_label(declared)} head but the weights are "
                     f"{_label(arch)}'s ({'a midlayer' if arch == 'eagle3' else 'no midlayer.*'})")
    fc = ckpt.state.get("fc.weight")
    hidden = cfg.get("hidden_size")
    if fc is not None and isinstance(hidden, int):
        want = 3 * (cfg.get("target_hidden_size") or hidden) if arch == "eagle3" else 2 * hidden
        if fc.dim() != 2 or fc.shape[1] != want:
            found.append(f"architecture: fc.weight has shape {tuple(fc.shape)} where an {_label(arch)} head of width "
                         f"{hidden} has {(hidden, want)} (its input: "
                         f"{'three target features' if arch == 'eagle3' else 'token embedding + feature'})")
    layers = cfg.get("num_hidden_layers", 1)
    if arch == "eagle1" and layers != ckpt.num_layers:  # EAGLE-3 files say 1 whatever they hold: counted instead
        found.append(f"layer count: config.json says {layers} decoder layers, the weights hold {ckpt.num_layers}")
    if arch == "eagle3":
        found += _feature_layer_problems(cfg, target)
    return found


def _feature_layer_problems(cfg: dict, target) -> list[str]:
    """The target layers an EAGLE-3 head reads. eagleviz feeds it the inputs of layers (2, N//2, N-3) as the
    EAGLE repository and vLLM do; a head that names its layers (eagle_aux_hidden_state_layer_ids) is accepted
    when it means those, in vLLM's reading (the inputs of the named layers) or SGLang's (their outputs, one
    lower)."""
    n = target.num_layers
    if n < 3:
        return [f"target depth: an EAGLE-3 head reads the inputs of target layers 2, N//2 and N-3; the target has "
                f"{n} layers"]
    ours = list(target.eagle3_layers)
    named = cfg.get("eagle_aux_hidden_state_layer_ids")
    if named is None or list(named) in (ours, [i - 1 for i in ours]):
        return []
    return [f"target layers: the head was trained on the hidden states of target layers {list(named)}, eagleviz "
            f"feeds EAGLE-3 heads the inputs of layers {ours}"]


def _attention_problems(ckpt: Checkpoint) -> list[str]:
    cfg, found = ckpt.config, []
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    kv = cfg.get("num_key_value_heads") or heads
    if not (isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0):
        return [f"attention heads: config.json gives num_attention_heads {heads!r}, num_key_value_heads {kv!r}"]
    if heads % kv:
        found.append(f"attention heads: {heads} query heads are not a multiple of {kv} key/value heads")
    head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and hidden % heads == 0 else None)
    if head_dim is None:
        found.append(f"head_dim: config.json gives none and hidden size {hidden} is not a multiple of {heads} heads")
    elif head_dim % 2:
        found.append(f"head_dim: RoPE rotates pairs of dimensions, the head's size is {head_dim}")
    q = ckpt.state.get(("midlayer." if ckpt.arch == "eagle3" else "layers.0.") + "self_attn.q_proj.weight")
    if head_dim is not None and q is not None and q.shape[0] != heads * head_dim:
        found.append(f"head_dim: {heads} heads of {head_dim} need {heads * head_dim} query rows, q_proj has "
                     f"{q.shape[0]}")
    kind = rope_type(cfg)
    if kind not in ROPE_TYPES:
        found.append(f"rope scaling: the head uses {kind!r} RoPE scaling; eagleviz reproduces {', '.join(ROPE_TYPES)}")
    return found


def _vocab_map_problems(ckpt: Checkpoint, vocab: int) -> list[str]:
    """d2t (draft id -> target id offset) and t2d (mask of the target ids in the draft vocabulary) must
    describe one draft vocabulary of draft_vocab_size tokens inside the target's."""
    cfg, state = ckpt.config, ckpt.state
    size = cfg.get("draft_vocab_size") or cfg.get("vocab_size")
    d2t, t2d = state.get("d2t"), state.get("t2d")
    found = []
    if size != cfg.get("vocab_size") and d2t is None:
        found.append(f"draft vocab maps: draft_vocab_size {size} is smaller than the vocabulary but the weights have "
                     "no d2t")
    if d2t is not None and d2t.numel() != size:
        found.append(f"draft vocab maps: d2t has {d2t.numel()} entries, draft_vocab_size is {size}")
    if t2d is not None and t2d.numel() != vocab:
        found.append(f"draft vocab maps: t2d has {t2d.numel()} entries, the target vocabulary {vocab}")
    if t2d is not None and int(t2d.bool().sum()) != size:
        found.append(f"draft vocab maps: t2d marks {int(t2d.bool().sum())} target tokens, draft_vocab_size is {size}")
    if d2t is not None and d2t.dim() == 1:
        targets = torch.arange(d2t.numel()) + d2t.long()
        outside = int(((targets < 0) | (targets >= vocab)).sum())
        if outside:
            found.append(f"draft vocab maps: d2t sends {outside} draft tokens outside the target vocabulary "
                         f"[0, {vocab})")
        elif t2d is not None and t2d.numel() == vocab and not bool(t2d.bool()[targets].all()):
            found.append("draft vocab maps: d2t sends draft tokens to target ids that t2d does not mark")
    return found


def rope_type(cfg: dict) -> str:
    """The RoPE scaling of a flat config: 'default' when none (rope_scaling in transformers 4, rope_parameters in 5)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    return str(params.get("rope_type") or params.get("type") or "default") if isinstance(params, dict) else "default"


def _label(arch: str) -> str:
    return {"eagle1": "EAGLE-1", "eagle3": "EAGLE-3"}.get(arch, arch)
