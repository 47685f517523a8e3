"""eagleviz/perf/tune.py on a tiny random engine: the sweep is interleaved and ranked against our plain loop, its
result (per temperature) is what `bench` runs as eagle-tuned and what `eagleviz.measured` reads, and
`--curve-only` writes just the verification cost curve, in the shape the app reads."""

from __future__ import annotations

import json

import pytest

from eagleviz import measured
from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.perf import bench, tune
from tiny import tiny_engine


def test_tune_interleaves_the_trees_and_ranks_them_against_plain(tiny_cli, monkeypatch, capsys):
    """A stand-in for the runs records their order and returns set speeds (tokens/s per prompt; plain: 10): per
    prompt, plain and every tree run once, in an order rotated from prompt to prompt, and the trees are ranked
    by their median per-prompt speedup over plain, which here differs from the ranking by mean speedup or by
    overall tokens/s."""
    engine = tiny_engine("llama", vocab=8)
    grid = [TreeConfig.create(2, 1, 3), TreeConfig.create(2, 2, 4), TreeConfig.create(3, 2, 6)]
    prompts = ["abc", "hello there", "xyz"]
    speeds = {None: (10, 10, 10), grid[0]: (8, 30, 9), grid[1]: (40, 11, 9), grid[2]: (12, 13, 14)}
    taus = {None: 0.0, grid[0]: 1.5, grid[1]: 2.0, grid[2]: 2.5}
    index = {tuple(engine.encode_prompt(text)): p for p, text in enumerate(prompts)}
    calls = []

    def measure(engine, ids, tree, sampling):
        calls.append((index[tuple(ids)], tree))
        return bench.Sample(tokens=[1] * 6, seconds=6 / speeds[tree][index[tuple(ids)]], tau=taus[tree])

    monkeypatch.setattr(tune, "run_ours", measure)
    result = tune.tune(engine, prompts, SamplingConfig(max_new_tokens=6), prefix=8, grid=grid)

    runs = [None, *grid]
    order = [[tree for _, tree in calls[i:i + len(runs)]] for i in range(0, len(calls), len(runs))]
    assert [p for p, _ in calls] == [p for p in range(len(prompts)) for _ in runs]  # one prompt at a time
    shifts = [next((k for k in range(len(runs)) if o == runs[k:] + runs[:k]), None) for o in order]
    assert None not in shifts and len(set(shifts)) == len(prompts)  # each a rotation of the runs, a different one
    ranked = [grid[2], grid[1], grid[0]]  # median speedups 1.3, 1.1, 0.9 (mean 1.3, 2.0, 1.57; tokens/s 13, 13.2, 11)
    assert [(r["steps"], r["topk"], r["draft_tokens"]) for r in result["grid"]] == [
        (t.steps, t.topk, t.draft_tokens) for t in ranked]
    assert [r["speedup_vs_plain"] for r in result["grid"]] == pytest.approx([1.3, 1.1, 0.9])
    assert [r["tokens_per_s"] for r in result["grid"]] == pytest.approx(
        [18 / sum(6 / v for v in speeds[t]) for t in ranked])
    assert [r["tau"] for r in result["grid"]] == pytest.approx([taus[t] for t in ranked])
    assert result["best"] == {"steps": 3, "topk": 2, "draft_tokens": 6}
    assert result["plain_tokens_per_s"] == pytest.approx(10)
    assert "[tune] prompt 3/3" in capsys.readouterr().out


def test_tune_at_a_temperature_saves_the_tree_bench_runs_at_it(tiny_cli, monkeypatch, capsys):
    def fake_tune(best, speedup=1.2):
        return lambda *a, **k: {"verify_cost": {"relative": {1: 1.0}}, "best": best,
                                "grid": [dict(best, speedup_vs_plain=speedup)]}

    monkeypatch.setattr(tune, "tune", fake_tune({"steps": 3, "topk": 2, "draft_tokens": 6}))
    assert tune.tune_main(["--prompts", "mtbench", "--limit", "1"]) == 0
    assert "no tree beat plain decoding" not in capsys.readouterr().out
    assert measured.tuned_tree(1.0).path == tune.tuned_path(0.0)  # no sampled tune yet: the greedy one applies
    monkeypatch.setattr(tune, "tune", fake_tune({"steps": 2, "topk": 1, "draft_tokens": 3}, speedup=0.85))
    assert tune.tune_main(["--prompts", "mtbench", "--limit", "1", "--temperature", "1"]) == 0
    assert "no tree beat plain decoding here (the fastest ran at 0.85x plain)" in capsys.readouterr().out
    saved = json.loads(tune.tuned_path(1.0).read_text())
    assert tune.tuned_path(1.0).name == "tuned-T1.json" and saved["sampling"]["temperature"] == 1.0
    assert measured.tuned_config(measured.tuned_tree(0.0)) == TreeConfig.create(3, 2, 6, adaptive=False)
    assert measured.tuned_config(measured.tuned_tree(1.0)) == TreeConfig.create(2, 1, 3, adaptive=False)
    assert measured.tuned_config(measured.tuned_tree(0.7)) == TreeConfig.create(3, 2, 6, adaptive=False)  # none at 0.7: falls back to greedy's

    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\n")
    args = ["--prompts", str(prompts), "--max-new-tokens", "4", "--repeats", "1", "--methods", "plain,eagle-tuned"]
    for t, tree, source in (("0", [3, 2, 6], "tuned.json"), ("1", [2, 1, 3], "tuned-T1.json")):
        assert bench.bench_main(args + ["--temperature", t, "--out", str(tiny_cli / "out")]) == 0
        result = json.loads((tiny_cli / "out" / f"bench-T{t}.json").read_text())
        assert [result["tuned_tree"][k] for k in ("steps", "topk", "draft_tokens")] == tree
        assert result["tuned_tree"]["source"] == source



def test_tune_curve_only_writes_the_curve_the_app_reads(tiny_cli, capsys):
    out = tiny_cli / "curve" / "verify-cost.json"
    assert tune.tune_main(["--curve-only", "--prefix", "16", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    curve = data["verify_cost"]
    assert curve["prefix"] == 16 and list(curve["ms"]) == ["1", "2", "4", "8", "16", "32", "64"]
    assert curve["relative"]["1"] == 1.0 and all(ms > 0 for ms in curve["ms"].values())
    assert data["machine"]["model"] == "tiny-llama" and "--curve-only" in data["command"]
    assert "n=64" in capsys.readouterr().out
    assert measured.latest_verify_cost() is None or measured.latest_verify_cost().path != out  # not in the cache
    assert tune.tune_main(["--curve-only", "--prefix", "16"]) == 0      # default: this machine's cache
    found = measured.latest_verify_cost()
    assert found.path == measured.user_verify_cost_path() and not found.shipped



def test_out_without_curve_only_is_refused(tiny_cli):
    with pytest.raises(SystemExit):
        tune.tune_main(["--out", str(tiny_cli / "x.json")])

