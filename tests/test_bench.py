"""eagleviz/bench.py on a tiny random engine: `bench` writes its files and keeps its JSON where the app looks
first; `tune --curve-only` writes just the verification cost curve, in the shape the app reads."""

from __future__ import annotations

import json

import pytest
import torch

from eagleviz import bench, measured
from eagleviz import errors
from tiny import tiny_engine


@pytest.fixture
def tiny_cli(tmp_path, monkeypatch):
    """The CLI's model loader returns a tiny engine; EAGLEVIZ_CACHE is a fresh directory."""
    import eagleviz.models.loading as loading

    monkeypatch.setattr(loading, "load_engine", lambda *args, **kwargs: tiny_engine("llama", vocab=8))
    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_bench_writes_its_files_and_keeps_the_latest_for_the_app(tiny_cli, capsys):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    out = tiny_cli / "out"
    assert bench.bench_main(["--prompts", str(prompts), "--max-new-tokens", "6", "--repeats", "1", "--steps", "2",
                             "--topk", "2", "--draft-tokens", "4", "--methods", "hf-generate,plain,eagle-tree",
                             "--out", str(out)]) == 0
    result = json.loads((out / "bench-T0.json").read_text())
    assert list(result["rows"]) == ["hf-generate", "plain", "eagle-tree"] and result["prompts"] == 2
    assert (out / "bench-T0.md").read_text().startswith("| method |")
    cpu = result["machine"]["cpu"]  # what the figures depend on: the CPU's name, vector unit and bf16 support
    assert f", {torch.backends.cpu.get_cpu_capability()}, " in cpu and cpu.endswith("native bf16")
    assert "plotly" in (out / "bench-T0.html").read_text()[:5000].lower()
    found = measured.latest_bench(0)
    assert found is not None and not found.shipped and found.data == result
    assert str(found.path) in capsys.readouterr().out


def test_ab_modes_report_ratios_and_same_tokens(tiny_cli, capsys):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    common = ["--prompts", str(prompts), "--max-new-tokens", "5", "--repeats", "2", "--steps", "2", "--topk", "2",
              "--draft-tokens", "4"]
    assert bench.bench_main(common + ["--ab", "packing"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["plain", "eagle-tree"]
    assert all("over 2 prompts" in ln and "same tokens: True" in ln for ln in lines)
    assert bench.bench_main(common + ["--ab", "trace"]) == 0
    assert "same tokens: True" in capsys.readouterr().out


def test_tune_interleaves_the_trees_and_ranks_them_against_plain(tiny_cli, capsys):
    from eagleviz.config import SamplingConfig, TreeConfig

    engine = tiny_engine("llama", vocab=8)
    grid = [TreeConfig.create(2, 1, 3), TreeConfig.create(2, 2, 4), TreeConfig.create(3, 2, 6)]
    result = bench.tune(engine, ["abc", "hello there", "xyz"], SamplingConfig(max_new_tokens=6), prefix=8,
                        grid=grid)
    speedups = [r["speedup_vs_plain"] for r in result["grid"]]
    assert result["interleaved"] and len(speedups) == 3 and speedups == sorted(speedups, reverse=True)
    assert result["best"] == {k: result["grid"][0][k] for k in ("steps", "topk", "draft_tokens")}
    assert all(r["tau"] >= 1 and r["tokens_per_s"] > 0 for r in result["grid"])
    assert "[tune] prompt 3/3" in capsys.readouterr().out


def test_eagle_tuned_runs_the_tree_tune_saved(tiny_cli, capsys):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\n")
    args = ["--prompts", str(prompts), "--max-new-tokens", "5", "--repeats", "1", "--out", str(tiny_cli / "out")]
    with pytest.raises(errors.UserFacingError, match="tune"):  # not tuned yet
        bench.bench_main(args + ["--methods", "plain,eagle-tuned"])
    bench.tuned_path().parent.mkdir(parents=True, exist_ok=True)
    bench.tuned_path().write_text(json.dumps({"best": {"steps": 2, "topk": 2, "draft_tokens": 4}}))
    assert bench.bench_main(args) == 0  # the default methods now include it
    result = json.loads((tiny_cli / "out" / "bench-T0.json").read_text())
    assert "eagle-tuned" in result["rows"]
    assert result["tuned_tree"] == {"steps": 2, "topk": 2, "draft_tokens": 4, "source": "tuned.json"}
    with pytest.raises(SystemExit):
        bench.bench_main(args + ["--methods", "plain,nonsense"])


def test_tune_at_a_temperature_saves_the_tree_bench_runs_at_it(tiny_cli, monkeypatch, capsys):
    def fake_tune(best, speedup=1.2):
        return lambda *a, **k: {"verify_cost": {"relative": {1: 1.0}}, "best": best,
                                "grid": [dict(best, speedup_vs_plain=speedup)]}

    monkeypatch.setattr(bench, "tune", fake_tune({"steps": 3, "topk": 2, "draft_tokens": 6}))
    assert bench.tune_main(["--prompts", "mtbench", "--limit", "1"]) == 0
    assert "no tree beat plain decoding" not in capsys.readouterr().out
    assert bench.tuned_source(1.0) == bench.tuned_path(0.0)  # no sampled tune yet: the greedy one applies
    monkeypatch.setattr(bench, "tune", fake_tune({"steps": 2, "topk": 1, "draft_tokens": 3}, speedup=0.85))
    assert bench.tune_main(["--prompts", "mtbench", "--limit", "1", "--temperature", "1"]) == 0
    assert "no tree beat plain decoding here (the fastest ran at 0.85x plain)" in capsys.readouterr().out
    saved = json.loads(bench.tuned_path(1.0).read_text())
    assert bench.tuned_path(1.0).name == "tuned-T1.json" and saved["sampling"]["temperature"] == 1.0
    assert bench.load_tuned(0.0) == bench.TreeConfig.create(3, 2, 6)
    assert bench.load_tuned(1.0) == bench.TreeConfig.create(2, 1, 3)
    assert bench.load_tuned(0.7) == bench.TreeConfig.create(3, 2, 6)  # none at 0.7: falls back to greedy's

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
    assert bench.tune_main(["--curve-only", "--prefix", "16", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    curve = data["verify_cost"]
    assert curve["prefix"] == 16 and list(curve["ms"]) == ["1", "2", "4", "8", "16", "32", "64"]
    assert curve["relative"]["1"] == 1.0 and all(ms > 0 for ms in curve["ms"].values())
    assert data["machine"]["model"] == "tiny-llama" and "--curve-only" in data["command"]
    assert "n=64" in capsys.readouterr().out
    assert measured.latest_verify_cost() is None or measured.latest_verify_cost().path != out  # not in the cache
    assert bench.tune_main(["--curve-only", "--prefix", "16"]) == 0      # default: this machine's cache
    found = measured.latest_verify_cost()
    assert found.path == measured.user_verify_cost_path() and not found.shipped


def test_out_without_curve_only_is_refused(tiny_cli):
    with pytest.raises(SystemExit):
        bench.tune_main(["--out", str(tiny_cli / "x.json")])


def test_an_interrupted_bench_resumes_after_its_last_finished_prompt(tmp_path):
    from eagleviz.config import SamplingConfig, TreeConfig

    engine = tiny_engine("llama", vocab=8)
    prompts, sampling, tree = ["abc", "hello there", "xyz"], SamplingConfig(max_new_tokens=5), TreeConfig.create(2, 2, 4)
    journal, methods = tmp_path / "bench.journal.jsonl", ("plain", "eagle-tree")
    calls = []

    def interrupt_at_third(message):
        calls.append(message)
        if "prompt 2/3" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench.bench(engine, prompts, sampling, tree, 1, methods, progress=interrupt_at_third, journal=journal)
    assert len(journal.read_text().splitlines()) == 3  # header + 2 finished prompts
    seen = []
    result = bench.bench(engine, prompts, sampling, tree, 1, methods, progress=seen.append, journal=journal)
    assert "resuming after prompt 2/3" in seen[0] and seen[-1].startswith("[bench] prompt 3/3")
    assert result["prompts"] == 3 and not journal.exists()
    fresh = bench.bench(engine, prompts, sampling, tree, 1, methods, progress=lambda m: None)
    assert result["rows"]["plain"]["tokens"] == fresh["rows"]["plain"]["tokens"]


def test_a_journal_with_other_settings_is_started_afresh(tmp_path):
    from eagleviz.config import SamplingConfig, TreeConfig

    engine = tiny_engine("llama", vocab=8)
    journal = tmp_path / "bench.journal.jsonl"
    journal.write_text('{"prompts": [[1, 2]]}\n{"plain": []}\n')
    seen = []
    bench.bench(engine, ["abc"], SamplingConfig(max_new_tokens=4), TreeConfig.create(2, 2, 4), 1, ("plain",),
                progress=seen.append, journal=journal)
    assert not any("resuming" in m for m in seen) and not journal.exists()
