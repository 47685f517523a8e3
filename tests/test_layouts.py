"""eagleviz/models/layouts.py: every published checkpoint layout, written tiny in its exact form, loads unchanged
(the same weights under our names, the right architecture and settings) and drafts for a tiny target."""

import dataclasses
import json

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.errors import UserFacingError
from eagleviz.models.draft import DraftHead, load_head
from eagleviz.models.layouts import flat_config, read_checkpoint
from published_heads import LAYOUT_CASES, write_layout
from tiny import tiny_target

EXPECTED_LAYOUT = {"eagle1": "eagle1", "eagle3-bin": "eagle3", "eagle3-safetensors": "eagle3",
                   "specforge-eagle3": "specforge-eagle3", "speculators-eagle3": "speculators-eagle3",
                   "speculators-eagle3-two-layers": "speculators-eagle3", "speculators-eagle": "speculators-eagle",
                   "vllm-prefixed-eagle3": "eagle3"}


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab=32)


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_each_published_layout_loads_unchanged_and_drafts(case, target, tmp_path):
    source = write_layout(tmp_path, case, target, seed=LAYOUT_CASES.index(case))
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.layout == EXPECTED_LAYOUT[case]
    head = load_head(tmp_path, target)
    assert head.config == source.config
    loaded = head.state_dict()
    for key, value in source.state_dict().items():
        assert torch.equal(loaded[key], value), key
    engine = Engine(target, head, case)
    sampling = SamplingConfig(max_new_tokens=16)
    tree = TreeConfig.create(3, 2, 6)
    spec = engine.generate("abcdef", tree, sampling, chat=False)
    assert spec.cycles and spec.token_ids == engine.generate("abcdef", None, sampling, chat=False).token_ids
    if head.config.arch == "eagle3":  # drafts come from the head's draft vocabulary, mapped to target ids
        allowed = set(torch.nonzero(head.t2d).flatten().tolist())
        assert all(node.token in allowed for c in spec.cycles for node in c.nodes if node.source != "lookup")


def test_norm_before_residual_changes_the_head_and_both_forward_paths_agree(target, tmp_path):
    """speculators' norm_before_residual: the midlayer's residual is the normed feature. The flag must take
    effect, and the compiled CPU path (used for drafting when available) must compute what PyTorch's does."""
    write_layout(tmp_path, "speculators-eagle3", target)
    head = load_head(tmp_path, target)
    assert head.config.norm_before_residual
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(5, 3 * target.hidden_size, generator=gen)
    embeds = torch.randn(5, target.hidden_size, generator=gen)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()

    def run(h):
        return h(feats, embeds, torch.arange(5), h.new_cache(8, torch.float32, "cpu"), mask)

    plain = DraftHead(dataclasses.replace(head.config, norm_before_residual=False)).eval()
    plain.load_state_dict(head.state_dict())
    with torch.no_grad():
        ours = run(head)
        assert not torch.allclose(run(plain), ours)
        if target.ops is not None:
            torch.testing.assert_close(run(head.for_drafting(ops=target.ops)), ours, atol=1e-4, rtol=1e-4)


def test_speculators_config_is_flattened_with_its_eagle_fields():
    cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": 8, "norm_before_residual": True,
           "target_hidden_size": None, "transformer_layer_config": {"hidden_size": 64, "vocab_size": 32}}
    flat = flat_config(cfg)
    assert flat == {"hidden_size": 64, "vocab_size": 32, "draft_vocab_size": 8, "norm_before_residual": True}


def test_sharded_weights_are_read_through_their_index(target, tmp_path):
    from safetensors.torch import load_file, save_file

    source = write_layout(tmp_path, "eagle3-safetensors", target)
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    keys = sorted(state)
    halves = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in halves.items():
        save_file({k: state[k] for k in part}, str(tmp_path / name))
    index = {"weight_map": {k: name for name, part in halves.items() for k in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(load_head(tmp_path, target).fc.weight, source.fc.weight)
    index["weight_map"][keys[0]] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserFacingError, match="outside its folder"):
        load_head(tmp_path, target)


def test_a_folder_without_weights_or_config_is_one_clear_line(target, tmp_path):
    with pytest.raises(UserFacingError, match="config.json not found"):
        load_head(tmp_path, target)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserFacingError, match="neither model.safetensors nor pytorch_model.bin"):
        load_head(tmp_path, target)
    (tmp_path / "config.json").write_text("[1, 2]")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserFacingError, match="corrupt|not a JSON object"):
        load_head(tmp_path, target)
