"""Published draft-head checkpoint layouts, read into one form: a flat config and the weights under our key names.

eagle1              yuhuili/EAGLE-*. config.json: LlamaConfig fields (+ bias, qkv_bias). pytorch_model.bin with
                    fc.*, layers.i.* (layer 0 without input_layernorm) and the frozen embed_tokens.weight.
eagle3              yuhuili/EAGLE3-*. config.json: LlamaConfig fields + draft_vocab_size (+ target_hidden_size).
                    pytorch_model.bin or model.safetensors with fc.weight, midlayer.*, norm.weight,
                    lm_head.weight, d2t (int64) and t2d (bool).
specforge-eagle3    SpecForge output (lmsys/SGLang-EAGLE3-*): the eagle3 keys (+ embed_tokens.weight) in
                    model.safetensors; architectures ["LlamaForCausalLMEagle3"], optionally
                    eagle_config.eagle_aux_hidden_state_layer_ids.
speculators-eagle3  vllm-project/speculators (RedHatAI/*speculator.eagle3): speculators_model_type "eagle3", the
                    LlamaConfig nested under transformer_layer_config, draft_vocab_size, norm_before_residual,
                    target_hidden_size and eagle_aux_hidden_state_layer_ids at the top; model.safetensors with
                    layers.0.* for the midlayer, layers.i.* after it, fc, norm, lm_head, d2t, t2d, embed_tokens.
speculators-eagle   speculators' EAGLE-1: speculators_model_type "eagle", fusion_bias, layernorms; fusion_fc.*
                    and transformer.* (layer 0).

Exports in vLLM's naming number the midlayer layers.0 and prefix the keys with "model.": the prefix is
dropped and the layers renumbered. Sharded weights (an `*.index.json` next to the shards) are read shard by
shard. Nothing here judges whether a head fits a target: that is `eagleviz.models.compat`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from eagleviz.errors import UserFacingError

LAYOUTS = ("eagle1", "eagle3", "specforge-eagle3", "speculators-eagle3", "speculators-eagle")
# speculators names the EAGLE-1 layer `transformer` and its fc `fusion_fc`; it and vLLM call the EAGLE-3 midlayer
# `layers.0`, told from an EAGLE-1 layer 0 by its hidden_norm (only the midlayer norms the feature it reads)
RENAMES = {"speculators-eagle": (("fusion_fc.", "fc."), ("transformer.", "layers.0."))}
MIDLAYER_MARK = "layers.0.hidden_norm.weight"
_LAYER = re.compile(r"^layers\.(\d+)\.")
# fields of a speculators config kept at its top level, next to the nested transformer_layer_config
SPECULATORS_FIELDS = ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc",
                      "eagle_aux_hidden_state_layer_ids", "layernorms", "fusion_bias")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class Checkpoint:
    """A head directory as read: `config` is flat (LlamaConfig fields plus the EAGLE extras), `state` uses the
    key names of `eagleviz.models.draft.DraftHead` (plus embed_tokens.weight where the file has it)."""

    layout: str
    config: dict
    state: dict[str, torch.Tensor]

    @property
    def arch(self) -> str:
        """What the weights are: an EAGLE-3 head has a midlayer, an EAGLE-1 head has not."""
        return "eagle3" if any(k.startswith("midlayer.") for k in self.state) else "eagle1"

    @property
    def num_layers(self) -> int:
        """Decoder layers in the weights (for EAGLE-3: the midlayer plus the plain layers after it)."""
        extra = {k.split(".")[1] for k in self.state if k.startswith("layers.")}
        return len(extra) + (1 if self.arch == "eagle3" else 0)

    @property
    def declared_arch(self) -> str | None:
        """The architecture config.json claims, where it says: None for EAGLE-1 files, which carry no mark."""
        cfg = self.config
        if cfg.get("eagleviz_arch"):
            return cfg["eagleviz_arch"]
        if self.layout == "speculators-eagle":
            return "eagle1"
        eagle3 = (self.layout in ("specforge-eagle3", "speculators-eagle3")
                  or any("eagle3" in str(a).lower() for a in cfg.get("architectures") or ())
                  or "draft_vocab_size" in cfg or "target_hidden_size" in cfg)
        return "eagle3" if eagle3 else None


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read config.json and the weights of a head directory in any of `LAYOUTS`."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise UserFacingError(f"draft head {path}: config.json not found")
    try:
        raw = json.loads((path / "config.json").read_text())
        state = read_state(path)
    except UserFacingError:
        raise
    except Exception as exc:  # any parse failure of a user-supplied file (JSON, pickle, safetensors header)
        raise UserFacingError(f"draft head {path} is unreadable or corrupt: {exc.__class__.__name__}: {exc}") from exc
    if not isinstance(raw, dict):
        raise UserFacingError(f"draft head {path}: config.json is not a JSON object")
    layout = detect_layout(raw, state)
    return Checkpoint(layout=layout, config=flat_config(raw), state=renamed(state, layout))


def detect_layout(cfg: dict, state: dict) -> str:
    """Which of `LAYOUTS` a config and its weights follow."""
    kind = cfg.get("speculators_model_type")
    if kind in ("eagle3", "eagle"):
        return f"speculators-{kind}"
    if any(_unprefixed(k).startswith("midlayer.") or _unprefixed(k) == MIDLAYER_MARK for k in state):
        architectures = [str(a) for a in cfg.get("architectures") or ()]
        return "specforge-eagle3" if "LlamaForCausalLMEagle3" in architectures else "eagle3"
    return "eagle1"


def flat_config(cfg: dict) -> dict:
    """A speculators config's transformer_layer_config lifted to the top level, with the EAGLE fields that
    sit beside it; a SpecForge config's eagle_config fields lifted likewise. Other configs are returned as they are."""
    out = dict(cfg)
    nested = cfg.get("transformer_layer_config")
    if isinstance(nested, dict):
        out = dict(nested) | {k: cfg[k] for k in SPECULATORS_FIELDS if cfg.get(k) is not None}
        if cfg.get("fusion_bias") is not None:
            out["bias"] = bool(cfg["fusion_bias"])
    eagle = cfg.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        out.setdefault("eagle_aux_hidden_state_layer_ids", eagle["eagle_aux_hidden_state_layer_ids"])
    return out


def renamed(state: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """The state under our key names: the "model." prefix dropped, then the layout's prefix table applied."""
    table = RENAMES.get(layout, ())
    numbered_from_midlayer = any(_unprefixed(k) == MIDLAYER_MARK for k in state)
    out = {}
    for key, value in state.items():
        key = _unprefixed(key)
        for old, new in table:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        if numbered_from_midlayer:  # their layers.0 is our midlayer, their layers.i our layers.(i - 1)
            key = _LAYER.sub(lambda m: "midlayer." if m[1] == "0" else f"layers.{int(m[1]) - 1}.", key, count=1)
        out[key] = value
    return out


def _unprefixed(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The weights of a head directory: one file of `WEIGHT_FILES`, or the shards an index names."""
    for name in WEIGHT_FILES:
        index = path / f"{name}.index.json"
        if (path / name).exists():
            return _load(path / name)
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if any(Path(shard).name != shard for shard in shards):
                raise UserFacingError(f"draft head {path}: {index.name} names files outside its folder")
            return {k: v for shard in shards for k, v in _load(path / shard).items()}
    raise UserFacingError(f"draft head {path} has neither model.safetensors nor pytorch_model.bin")


def _load(file: Path) -> dict[str, torch.Tensor]:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    return torch.load(file, map_location="cpu", weights_only=True)
