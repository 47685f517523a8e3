"""The one-command training recipe (eagleviz/train/recipe.py): features computed online are the cached ones, the
schedule follows a time budget, answers stop at a deadline. The whole path, on a bare machine with tiny sizes:
tests/test_bare_box.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from eagleviz.train import data as D
from eagleviz.train.batches import make_row
from eagleviz.train.features import OnlineFeatures, collect
from eagleviz.train.recipe import Budget
from eagleviz.train.trainer import Trainer, TrainConfig, lr_at, new_head
from tiny import tiny_target

V = 32


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab=V, layers=4, scale=20.0)


@pytest.fixture(scope="module")
def samples():
    gen = torch.Generator().manual_seed(2)
    out = []
    for _ in range(12):
        n = int(torch.randint(10, 30, (1,), generator=gen))
        out.append(D.Sample(torch.randint(0, V, (n,), generator=gen).tolist(), [0] * 3 + [1] * (n - 3)))
    return out


def test_an_online_row_is_the_row_of_the_cached_features(target, samples):
    online = OnlineFeatures(target, samples, max_len=24)
    cached = collect(target, samples, max_len=24)
    assert torch.equal(online.offsets, cached.offsets) and torch.equal(online.ids, cached.ids)
    assert torch.equal(online.mask, cached.mask)
    for seqs in ([3, 0, 7], [11]):
        got, want = online.row(seqs), make_row(cached, seqs)
        for field in want.__dataclass_fields__:
            a, b = getattr(got, field), getattr(want, field)
            assert a.dtype == b.dtype and a.shape == b.shape, field
            if field in ("aux", "final", "top_p"):  # another batch of the same forward: rounding only
                torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
            elif field != "top_ids":
                assert torch.equal(a, b), field
        assert (got.top == want.top).float().mean() > 0.9


def test_the_schedule_fitted_to_a_time_budget_decays_by_its_end(target, samples, tmp_path):
    data = OnlineFeatures(target, samples, max_len=24)
    cfg = TrainConfig(arch="eagle3", row_len=64, warmup=2, eval_rows=1, autocast=False)
    trainer = Trainer(cfg, new_head(target, "eagle3"), _parts(target), data, collect(target, samples[:2], 24), tmp_path)
    trainer.step = 10
    assert trainer.fit_schedule(seconds=30, steps_per_s=2.0) == 70
    assert lr_at(cfg, 70, trainer.total) == pytest.approx(cfg.lr * cfg.min_lr_ratio)
    assert trainer.fit_schedule(seconds=0, steps_per_s=2.0) == 11  # always one more step


def test_a_step_count_is_the_schedule_and_a_resumed_run_goes_on_to_it(target, samples, tmp_path):
    """--max-steps with --online: no probe, no schedule fitted to the time; the run ends with its steps (long before
    its minute here) and a resumed run trains on to the new count."""
    from eagleviz.train.recipe import train

    data = OnlineFeatures(target, samples, max_len=24)
    cfg = TrainConfig(arch="eagle3", row_len=64, warmup=1, eval_rows=1, eval_every=2, autocast=False)
    trainer = Trainer(cfg, new_head(target, "eagle3"), _parts(target), data, collect(target, samples[:2], 24), tmp_path)
    said = []
    first = train(trainer, 60.0, Budget(minutes=1), said.append, max_steps=3)
    assert (first["steps"], first["this_run_steps"], first["schedule_steps"]) == (3, 3, 3)
    assert first["seconds"] < 30 and first["steps_per_s"] > 0 and "3 steps (--max-steps)" in said[0]
    again = train(trainer, 60.0, Budget(minutes=1), said.append, max_steps=5)
    assert (again["steps"], again["this_run_steps"], again["schedule_steps"]) == (5, 2, 5)
    assert lr_at(cfg, 5, trainer.total) == pytest.approx(cfg.lr * cfg.min_lr_ratio)  # decayed by its end


def test_budgets_are_checked():
    assert Budget(minutes=25).answer_share == 0.4
    for bad in ({"minutes": 0}, {"minutes": 5, "answer_share": 1.2}, {"minutes": 5, "answer_share": 0.95}):
        with pytest.raises(ValueError):
            Budget(**bad)


def test_no_answer_shard_starts_after_the_deadline(tmp_path):
    never = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0), eos_token_ids=frozenset({0}))  # not called
    past = time.monotonic() - 1
    assert D.generate_answers(never, ["a", "b"], tmp_path / "answers", deadline=past) == 0
    assert list((tmp_path / "answers").iterdir()) == []


def _parts(target):
    from eagleviz.train.objectives import TargetParts

    return TargetParts(embed=target.hf.model.embed_tokens.weight.detach(), lm_head=target.lm_head)


def test_a_bundle_target_brings_its_own_prompt_sets(tmp_path):
    from eagleviz.paths import Bundle
    from eagleviz.prompts import bundle_copies

    assert bundle_copies(str(tmp_path)) == ("sharegpt", "mtbench")  # not a bundle
    (tmp_path / Bundle.INDEX).write_text("{}")
    bundle = Bundle(tmp_path)
    bundle.sharegpt.parent.mkdir()
    bundle.sharegpt.write_text("[]")
    assert bundle_copies(str(tmp_path)) == (str(bundle.sharegpt), "mtbench")  # no MT-bench copy in this one
    assert bundle_copies(str(tmp_path), "mine.json", "prompts.txt") == ("mine.json", "prompts.txt")  # given: kept
    assert bundle_copies("embedded") == bundle_copies("random") == ("sharegpt", "mtbench")


@pytest.fixture
def touched(monkeypatch):
    """What `train-head --online` reached: the device check, the model load, the recipe (each a stand-in)."""
    import eagleviz.models.loading as loading
    from eagleviz.train import recipe

    seen = []
    monkeypatch.setattr(loading, "check_device", lambda device: seen.append("device") or torch.device("cpu"))
    monkeypatch.setattr(loading, "load_target", lambda *args, **kwargs: seen.append("model") or
                        SimpleNamespace(name="tiny"))
    monkeypatch.setattr(recipe, "run", lambda *args, **kwargs: seen.append("trained") or {"minutes": 0.1})
    return seen


@pytest.mark.parametrize("given", [["--device", "cuda", "--prepare-only"], ["--online", "--prepare-only"],
                                   ["--device", "cuda", "--epochs", "3"], ["--online", "--epochs", "1"],
                                   ["--device", "cuda:1", "--heldout-answers", "original"]])
def test_the_staged_runs_options_are_refused_online_before_any_device_is_touched(touched, tmp_path, given):
    """--online (implied by --device cuda) fits its schedule to --minutes, prepares nothing and scores the held-out
    prompts on the target's own answers: an option it would ignore is refused in one line, no device or model used."""
    from eagleviz.errors import UserFacingError
    from eagleviz.train.cli import train_head_main

    common = ["--minutes", "1", "--out", str(tmp_path / "run"), "--cache", str(tmp_path / "cache")]
    flag = next(a for a in given if a not in ("--device", "--online") and a.startswith("--"))
    with pytest.raises(UserFacingError, match=f"^{flag}.*not for --online"):
        train_head_main(given + common)
    assert touched == []
    assert train_head_main(["--online", "--heldout-answers", "self"] + common) == 0  # what it does anyway: kept
    assert touched == ["device", "model", "trained"]
