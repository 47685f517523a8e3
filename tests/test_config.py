"""eagleviz/config.py: SGLang's knob rules and adjustments, recorded and never silent."""

import pytest

from eagleviz.config import TREE_PRESETS, SamplingConfig, TreeConfig


def test_chain_aligns_draft_tokens_to_steps_plus_one():
    cfg = TreeConfig.create(steps=3, topk=1, draft_tokens=16)
    assert (cfg.steps, cfg.topk, cfg.draft_tokens) == (3, 1, 4)
    assert len(cfg.adjustments) == 1 and "steps + 1" in cfg.adjustments[0]


def test_budget_capped_by_what_drafting_can_produce():
    cfg = TreeConfig.create(steps=2, topk=2, draft_tokens=64)
    assert cfg.draft_tokens == 1 + 2 + 4
    assert "reduced" in cfg.adjustments[0]


def test_consistent_knobs_are_not_adjusted():
    cfg = TreeConfig.create(steps=5, topk=4, draft_tokens=8)
    assert cfg.adjustments == () and cfg.draft_tokens == 8


@pytest.mark.parametrize("kwargs", [dict(steps=0), dict(topk=17), dict(draft_tokens=1), dict(steps=2.5),
                                    dict(topk=True)])
def test_out_of_range_knobs_raise(kwargs):
    with pytest.raises(ValueError):
        TreeConfig.create(**kwargs)


def test_direct_construction_refuses_inconsistent_budget():
    with pytest.raises(ValueError, match="TreeConfig.create"):
        TreeConfig(steps=1, topk=2, draft_tokens=10)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=2.5), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(max_new_tokens=0), dict(seed=-1)])
def test_sampling_validation(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_presets_are_valid_and_frozen():
    for cfg in TREE_PRESETS.values():
        assert cfg.draft_tokens <= cfg.max_draft_tokens
    with pytest.raises(AttributeError):
        TREE_PRESETS["default"].steps = 3
