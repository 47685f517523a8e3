"""eagleviz/train/calibrate.py on a tiny engine: each cycle's observations are what the trace shows, a run
resumes from its journal, and the fit is checked on prompts it was not fitted on."""

from __future__ import annotations

import json

import pytest

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.errors import UserFacingError
from eagleviz.train import calibrate
from tiny import tiny_engine

TREE = TreeConfig.create(4, 3, 12, adaptive=False, source="eagle+lookup")
PROMPTS = ["one two one two", "abc abc abc", "hello there", "x y z x y", "a b a b a b"]


def test_observations_are_what_each_cycle_shows():
    engine = tiny_engine("llama", vocab=8, seed=0)
    run = engine.generate("one two one two one", TREE, SamplingConfig(max_new_tokens=30))
    assert run.cycles
    for c in run.cycles:
        obs = calibrate.observe(c)
        verified = [n for n in c.nodes if n.slot > 0]
        head = [n for n in verified if n.source != "lookup"]
        assert len(obs["scored"]) == len(head)
        assert sum(ok for _, ok in obs["scored"]) == sum(n.slot in c.path for n in head)
        assert sum(ok for _, ok in obs["child"]) + sum(ok for _, ok in obs["lookup"]) == c.accept_length
        assert all(n == c.lookup_ngram for n, _ in obs["lookup"])


def test_collect_resumes_from_its_journal(tmp_path):
    engine = tiny_engine("llama", vocab=8, seed=0)
    sampling = SamplingConfig(max_new_tokens=12)
    journal = tmp_path / "j.jsonl"
    first = calibrate.collect(engine, PROMPTS[:3], TREE, sampling, journal, progress=lambda _: None)
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:3]) + "\n")   # as if interrupted after two prompts
    seen = []
    again = calibrate.collect(engine, PROMPTS[:3], TREE, sampling, journal, progress=seen.append)
    assert again == first and len(seen) == 2 and "resuming after prompt 2/3" in seen[0] and "prompt 3/3" in seen[1]
    fresh = calibrate.collect(engine, PROMPTS[:2], TREE, sampling, journal, progress=lambda _: None)
    assert len(fresh) == 2 and json.loads(journal.read_text().splitlines()[0])["prompts"] == PROMPTS[:2]


def test_fit_and_check_reports_on_held_out_prompts(tmp_path):
    engine = tiny_engine("llama", vocab=8, seed=0)
    observed = calibrate.collect(engine, PROMPTS * 2, TREE, SamplingConfig(max_new_tokens=16),
                                 tmp_path / "j.jsonl", progress=lambda _: None)
    table, report = calibrate.fit_and_check(observed, "test")
    assert report["fit_prompts"] == 7 and report["check_prompts"] == 3
    assert report["check_cycles"] == sum(len(p) for p in observed[7:])
    assert all(0 <= row["predicted"] <= 1 and 0 <= row["observed"] <= 1 for row in report["reliability"])
    assert list(table.accept) == sorted(table.accept) and table.samples == sum(
        len(c["scored"]) for p in observed for c in p)


def test_too_few_prompts_is_one_line():
    with pytest.raises(UserFacingError, match="at least 4"):
        calibrate.main(["--limit", "2"])
