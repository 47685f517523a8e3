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


def test_calibrate_writes_the_table_the_reliability_report_and_its_plot(tiny_cli, monkeypatch, capsys):
    """`python -m eagleviz calibrate` on a tiny engine: calibration.json where --out says, and beside the journal
    reliability.json and reliability.svg, a panel per temperature with a dot per score bin."""
    from eagleviz.train import data

    monkeypatch.setattr(data, "load_prompts", lambda name: [(p, None) for p in PROMPTS])
    journal, out = tiny_cli / "journal", tiny_cli / "head"
    assert calibrate.main(["--limit", "4", "--first-conversation", "0", "--temperatures", "0,1", "--tree", "2/2/4",
                           "--max-new-tokens", "8", "--out", str(out), "--journal", str(journal)]) == 0
    reports = json.loads((journal / "reliability.json").read_text())
    svg = (journal / "reliability.svg").read_text()
    assert (out / "calibration.json").is_file() and set(reports) == {"greedy", "sampling"}
    assert svg.count("<circle") == sum(len(r["reliability"]) for r in reports.values())
    assert "T = 0 (greedy)" in svg and "T = 1 (sampling)" in svg and "reliability.svg" in capsys.readouterr().out


def test_the_shipped_reliability_plot_is_the_shipped_report_plotted():
    """docs/tree-policy.md shows docs/reliability.svg: the plot `calibrate` draws of docs/reliability.json."""
    from pathlib import Path

    from eagleviz.train.plot import reliability_svg

    docs = Path(__file__).resolve().parents[1] / "docs"
    shown = (docs / "reliability.svg").read_text()
    assert reliability_svg(json.loads((docs / "reliability.json").read_text())) == shown
