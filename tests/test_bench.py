"""eagleviz/perf/bench.py on a tiny random engine: `bench` writes its files and keeps its JSON where the app looks
first, runs the tree `tune` saved as eagle-tuned, and resumes after an interruption; each A/B writes its arms'
ratios, taus and trees to JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagleviz import errors, measured
from eagleviz.perf import bench, tune
from eagleviz.visuals.table import markdown_table
from tiny import CPU_COSTS, tiny_engine


def test_a_bench_the_user_did_not_publish_never_replaces_the_pages_figures(tiny_cli, capsys):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\n")
    before = measured.latest_bench(0)
    assert bench.bench_main(["--prompts", str(prompts), "--max-new-tokens", "4", "--repeats", "1", "--methods",
                             "plain", "--out", str(tiny_cli / "smoke")]) == 0
    assert (tiny_cli / "smoke" / "bench-T0.json").is_file() and "not published" in capsys.readouterr().out
    after = measured.latest_bench(0)
    assert (after is None) == (before is None) and (after is None or after.path == before.path)
    assert after is None or after.shipped


def tiny_bench(tiny_cli, methods: str, *options: str) -> tuple[dict, Path]:
    """`bench` on two prompts of the tiny engine (`tiny_cli`), 6 tokens, tree 2/2/4: its result and --out."""
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    out = tiny_cli / "out"
    assert bench.bench_main(["--prompts", str(prompts), "--max-new-tokens", "6", "--repeats", "1", "--steps", "2",
                             "--topk", "2", "--draft-tokens", "4", "--methods", methods, *options,
                             "--out", str(out)]) == 0
    return json.loads((out / "bench-T0.json").read_text()), out


def test_bench_writes_its_files_and_keeps_the_latest_for_the_app(tiny_cli, capsys):
    result, out = tiny_bench(tiny_cli, "hf-generate,plain,eagle-tree", "--publish")
    assert list(result["rows"]) == ["hf-generate", "plain", "eagle-tree"] and result["prompts"] == 2
    assert (out / "bench-T0.md").read_text().startswith("| method |")
    cpu = result["machine"]["cpu"]  # what the figures depend on: the CPU's name, vector unit and bf16 support
    assert f", {torch.backends.cpu.get_cpu_capability()}, " in cpu and "native bf16" in cpu
    assert "plotly" in (out / "bench-T0.html").read_text()[:5000].lower()
    found = measured.latest_bench(0)
    assert found is not None and not found.shipped and found.data == result
    assert str(found.path) in capsys.readouterr().out


def ratio_lines(out: str) -> list[str]:
    """An A/B's printed ratios, without the line that says where its JSON went."""
    return [ln for ln in out.splitlines() if not ln.startswith("wrote ")]


def test_ab_modes_report_ratios_and_same_tokens(tiny_cli, capsys):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    common = ["--prompts", str(prompts), "--max-new-tokens", "5", "--repeats", "2", "--steps", "2", "--topk", "2",
              "--draft-tokens", "4", "--out", str(tiny_cli / "out")]
    assert bench.bench_main(common + ["--ab", "packing"]) == 0
    lines = ratio_lines(capsys.readouterr().out)
    assert [ln.split(":")[0] for ln in lines] == ["plain", "eagle-tree"]
    assert all("over 2 prompts" in ln and "same tokens: True" in ln for ln in lines)
    assert bench.bench_main(common + ["--ab", "trace"]) == 0
    assert "same tokens: True" in capsys.readouterr().out


def test_the_graphs_lever_needs_a_gpu(tiny_cli):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\n")
    with pytest.raises(errors.UserFacingError, match="needs --device cuda"):
        bench.bench_main(["--prompts", str(prompts), "--max-new-tokens", "5", "--ab", "graphs",
                          "--out", str(tiny_cli / "out")])


@pytest.mark.parametrize("lever,changed", [("policy", {"adaptive": (False, True)}),
                                           ("lookup", {"source": ("eagle", "eagle+lookup")})])
def test_the_policy_and_lookup_levers_write_what_the_docs_quote(tiny_cli, capsys, lever, changed):
    """docs/performance.md entry 22 quotes each lever's median ratio and tau without -> with: the JSON
    holds them per arm, with the two trees the arm compared (only the lever differs) and the machine."""
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    out = tiny_cli / "out"
    argv = ["--prompts", str(prompts), "--max-new-tokens", "5", "--repeats", "2", "--steps", "2", "--topk", "2",
            "--draft-tokens", "4", "--ab", lever, "--out", str(out)]
    assert bench.bench_main(argv) == 0
    path = out / f"ab-{lever}-T0.json"
    assert path.is_file() and f"wrote {path}" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert (result["lever"], result["prompts"], result["repeats"]) == (lever, 2, 2)
    assert result["ratio"] == f"decode time without {lever} / with"
    assert result["command"] == "python -m eagleviz bench " + " ".join(argv)
    assert result["sampling"]["temperature"] == 0 and result["machine"]["cpu"] and result["machine"]["threads"] >= 1
    assert list(result["arms"]) == ["eagle-tree"]  # one engine, two trees
    arm = result["arms"]["eagle-tree"]
    assert arm["median_ratio"] > 0 and len(arm["per_prompt"]) == 2 and arm["same_tokens"] is True  # greedy, fp32
    assert set(arm["tau"]) == {"without", "with"} and all(t >= 1 for t in arm["tau"].values())
    trees = arm["trees"]
    assert {k: (trees["without"][k], trees["with"][k]) for k in trees["with"]
            if trees["with"][k] != trees["without"][k]} == changed
    assert (trees["with"]["steps"], trees["with"]["topk"], trees["with"]["draft_tokens"]) == (2, 2, 4)
    assert bench.ab_name(lever, 0.0) == path.name and bench.ab_name(lever, 1.0) == f"ab-{lever}-T1.json"


def test_the_prefix_lever_reports_the_prefill_times(tiny_cli, monkeypatch, capsys):
    import eagleviz.decoding.load as loading

    monkeypatch.setattr(loading, "load_engine", lambda *args, **kwargs: tiny_engine("llama", vocab=8, chat=True))
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    assert bench.bench_main(["--prompts", str(prompts), "--max-new-tokens", "5", "--repeats", "2", "--steps", "2",
                             "--topk", "2", "--draft-tokens", "4", "--ab", "prefix", "--out", str(tiny_cli / "out")]) == 0
    lines = ratio_lines(capsys.readouterr().out)
    assert [ln.split(":")[0] for ln in lines] == ["plain", "eagle-tree"]
    assert all("median prefill without" in ln and "same tokens: True" in ln for ln in lines)




def test_eagle_tuned_runs_the_tree_tune_saved(tiny_cli, capsys):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\n")
    args = ["--prompts", str(prompts), "--max-new-tokens", "5", "--repeats", "1", "--out", str(tiny_cli / "out")]
    with pytest.raises(errors.UserFacingError, match="tune"):  # not tuned yet
        bench.bench_main(args + ["--methods", "plain,eagle-tuned"])
    tune.tuned_path().parent.mkdir(parents=True, exist_ok=True)
    tune.tuned_path().write_text(json.dumps({"best": {"steps": 2, "topk": 2, "draft_tokens": 4}}))
    assert bench.bench_main(args) == 0  # the default methods now include it
    result = json.loads((tiny_cli / "out" / "bench-T0.json").read_text())
    assert "eagle-tuned" in result["rows"]
    assert result["tuned_tree"] == {"steps": 2, "topk": 2, "draft_tokens": 4, "source": "tuned.json"}
    with pytest.raises(SystemExit):
        bench.bench_main(args + ["--methods", "plain,nonsense"])








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

    # killed while writing prompt 2's line: prompt 1 stands, prompt 2 runs again, the journal stays readable
    with pytest.raises(KeyboardInterrupt):
        bench.bench(engine, prompts, sampling, tree, 1, methods, progress=interrupt_at_third, journal=journal)
    header, first, second = journal.read_text().splitlines()
    journal.write_text(f"{header}\n{first}\n{second[:len(second) // 2]}")
    seen = []
    torn = bench.bench(engine, prompts, sampling, tree, 1, methods, progress=seen.append, journal=journal)
    assert any("torn" in m for m in seen) and "resuming after prompt 1/3" in " ".join(seen)
    assert torn["prompts"] == 3 and torn["rows"]["plain"]["tokens"] == fresh["rows"]["plain"]["tokens"]


def test_a_journal_with_other_settings_is_started_afresh(tmp_path):
    from eagleviz.config import SamplingConfig, TreeConfig

    engine = tiny_engine("llama", vocab=8)
    journal = tmp_path / "bench.journal.jsonl"
    journal.write_text('{"prompts": [[1, 2]]}\n{"plain": []}\n')
    seen = []
    bench.bench(engine, ["abc"], SamplingConfig(max_new_tokens=4), TreeConfig.create(2, 2, 4), 1, ("plain",),
                progress=seen.append, journal=journal)
    assert not any("resuming" in m for m in seen) and not journal.exists()
    assert any("other settings (" in m and "policy" in m and "tree" in m for m in seen)


def test_a_journal_from_another_policy_is_not_resumed(tmp_path, monkeypatch):
    """The same prompts and knobs with another price list (or draft source) start afresh: the cost-aware tree's
    choices depend on them, so the finished prompts would mix two benches."""
    from eagleviz.config import SamplingConfig, TreeConfig

    engine, tree, seen, headers = tiny_engine("llama", vocab=8), TreeConfig.create(2, 2, 4), [], []
    journal = tmp_path / "bench.journal.jsonl"
    original = bench.Journal
    monkeypatch.setattr(bench, "Journal", lambda j, header, name, progress: headers.append(header) or
                        original(j, header, name, progress))

    def resumed(eng, tree_) -> bool:
        """Leave the journal of a bench of these settings interrupted after its first prompt, then run `tree_`."""
        journal.write_text(json.dumps(headers[0]) + "\n" + json.dumps({"plain": [{"tokens": [1], "seconds": 1.0}]})
                           + "\n")
        seen.clear()
        bench.bench(eng, ["abc", "abd"], SamplingConfig(max_new_tokens=4), tree_, 1, ("plain",), progress=seen.append,
                    journal=journal)
        return any("resuming after prompt 1" in m for m in seen)

    bench.bench(engine, ["abc", "abd"], SamplingConfig(max_new_tokens=4), tree, 1, ("plain",), progress=seen.append,
                journal=journal)
    assert resumed(engine, tree)  # the same settings resume
    assert not resumed(engine.with_policy(CPU_COSTS), tree) and any("(policy)" in m for m in seen)
    assert not resumed(engine, tree.with_(source="eagle")) and any("(tree)" in m for m in seen)


def test_each_prompt_starts_with_another_method_and_ratios_to_plain_carry_an_interval(monkeypatch):
    from eagleviz.config import SamplingConfig, TreeConfig

    engine, order = tiny_engine("llama", vocab=8), []
    speeds = {"plain": 1.0, "eagle-chain": 1.5, "eagle-tree": 2.0}
    monkeypatch.setattr(bench, "run_method", lambda eng, m, ids, sampling, tree, tuned=None, peers=None: (
        order.append(m), bench.Sample(tokens=[1] * 10, seconds=10 / speeds[m] / (1 + 0.1 * len(order) % 3)))[1])
    methods = tuple(speeds)
    result = bench.bench(engine, ["ab", "cd", "ef", "gh"], SamplingConfig(max_new_tokens=4), TreeConfig.create(2, 2, 4),
                         2, methods, progress=lambda line: None)
    runs = order[len(methods):]  # after the warm-up
    firsts = [runs[k] for k in range(0, len(runs), len(methods))]  # (prompt, repeat) in order
    assert firsts == [methods[(i + r) % 3] for i in range(4) for r in range(2)]
    rows = result["rows"]
    assert rows["plain"]["vs_plain"] == 1.0 and rows["plain"]["vs_plain_ci95"] == [1.0, 1.0]
    for m in ("eagle-chain", "eagle-tree"):
        low, high = rows[m]["vs_plain_ci95"]
        assert low <= rows[m]["vs_plain"] <= high and len(rows[m]["vs_plain_per_prompt"]) == 4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lockstep_steps_whichever_method_has_written_fewer_tokens_and_writes_what_whole_runs_do(monkeypatch, temperature):
    """`bench --lockstep`: within a prompt, plain decoding and the tree take turns, the one that has written fewer
    tokens taking the next step (equals: the first in order, rotated from one prompt to the next), and each
    writes the tokens a whole run of it writes. A method that cannot be stepped (a peer's) is refused."""
    from eagleviz.config import SamplingConfig, TreeConfig
    from eagleviz.errors import UserFacingError

    engine, tree = tiny_engine("llama", vocab=8), TreeConfig.create(2, 2, 4)
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature)
    ids, methods, turns = engine.encode_prompt("ab"), ("plain", "eagle-tree"), []
    whole = {m: bench.run_ours(engine, ids, bench.our_tree(m, tree), sampling) for m in methods}
    written = dict.fromkeys(methods, 0)
    for name, method, at in (("plain", "plain", 2), ("speculate", "eagle-tree", 3)):
        def stepped(*a, _f=getattr(type(engine), name), _m=method, _at=at, **k):
            for item in _f(engine, *a, **k):
                turns.append((_m, dict(written)))  # who stepped, and what each had written before it
                written[_m] = len(a[_at].output)
                yield item
        monkeypatch.setattr(engine, name, stepped)
    got = bench.run_lockstep(engine, methods, ids, sampling, tree)
    assert {m: got[m].tokens for m in methods} == {m: whole[m].tokens for m in methods}
    live = [(m, before) for m, before in turns if all(before[o] < len(whole[o].tokens) for o in methods)]
    assert [m for m, _ in live[:2]] == list(methods)
    assert all(before[m] == min(before.values()) for m, before in live)
    assert all(got[m].seconds > 0 for m in methods)

    orders = []
    lockstep = bench.run_lockstep
    monkeypatch.setattr(bench, "run_lockstep", lambda eng, order, *a: orders.append(order) or lockstep(eng, order, *a))
    result = bench.bench(engine, ["ab", "cd"], sampling, tree, 1, methods, progress=lambda line: None, lockstep=True)
    assert result["pairing"] == "step" and orders == [methods, methods[::-1]]
    assert result["greedy_mismatches"] == [] and len(result["rows"]["eagle-tree"]["vs_plain_per_prompt"]) == 2
    with pytest.raises(UserFacingError, match="cannot be stepped"):
        bench.bench(engine, ["ab"], sampling, tree, 1, ("hf-generate", "plain"), progress=lambda line: None,
                    lockstep=True)


@pytest.mark.parametrize("weights,greedy_reference", [("dense", "hf-generate"), ("blocks", "plain")])
def test_greedy_outputs_are_checked_against_the_same_numerics(monkeypatch, weights, greedy_reference):
    """Hugging Face computes dense weights: from weight blocks the greedy methods are checked against our plain
    loop, and Hugging Face's outputs against it like the others'; speedups stay relative to hf-generate."""
    from eagleviz.config import SamplingConfig, TreeConfig

    engine = tiny_engine("llama", vocab=8)
    monkeypatch.setattr(engine.target, "weights", weights)
    tokens = {"hf-generate": [1, 2, 3, 9], "plain": [1, 2, 3, 4], "eagle-tree": [1, 2, 3, 4]}
    monkeypatch.setattr(bench, "run_method", lambda eng, m, ids, sampling, tree, tuned=None, peers=None:
                        bench.Sample(tokens=tokens[m], seconds=1.0))
    result = bench.bench(engine, ["ab"], SamplingConfig(max_new_tokens=4), TreeConfig.create(2, 2, 4), 1,
                         tuple(tokens), progress=lambda line: None)
    assert (result["reference"], result["greedy_reference"]) == ("hf-generate", greedy_reference)
    differ = {m for m in tokens if tokens[m] != tokens[greedy_reference]}
    assert {x["method"] for x in result["greedy_mismatches"]} == differ
    assert all(x["position"] == 3 for x in result["greedy_mismatches"])


def test_the_bootstrap_interval_is_seeded_and_brackets_the_median():
    values = [0.9, 1.1, 1.2, 1.25, 1.3, 1.5, 2.0]
    low, high = bench.bootstrap_ci(values)
    assert bench.bootstrap_ci(values) == [low, high] and low <= 1.25 <= high and low < high


def test_the_bootstrap_interval_is_the_medians_not_the_samples_range():
    """80 per-prompt ratios spread evenly over [0.5, 1.5]: the median's 95% interval is a narrow band around
    1.0 (about +-0.1 for this n), far inside the range of the ratios that an interval of [min, max] would give."""
    values = [0.5 + i / 79 for i in range(80)]
    low, high = bench.bootstrap_ci(values)
    assert 0.85 < low < 1.0 < high < 1.15 and high - low < 0.3


def test_resampled_medians_are_the_point_estimates_median():
    """The same median everywhere: of an even count, the mean of the two middle values (statistics.median),
    never the lower one (torch's)."""
    import statistics

    values = [1.0, 2.0, 3.0, 10.0]
    medians = bench.resampled_medians(values, draws=200, seed=3)
    gen = torch.Generator().manual_seed(3)
    picks = torch.randint(0, 4, (200, 4), generator=gen)
    assert medians.tolist() == [statistics.median(values[j] for j in row) for row in picks.tolist()]
    assert any(m not in values for m in medians.tolist())  # means of two middles occur


def test_ab_rotation_puts_each_arm_first_on_half_the_prompts_with_one_repeat():
    firsts = []

    def arm(name):
        def run(ids):
            if not firsts or firsts[-1][1] == "second":
                firsts.append((name, "first"))
            else:
                firsts.append((name, "second"))
            return bench.Sample(seconds=1.0, tokens=[1], tau=1.0, prefill_ms=0.0)
        return run

    class Encoder:
        def encode_prompt(self, prompt):
            return [1]

    bench.ab_ratio(Encoder(), ["p1", "p2", "p3", "p4"], arm("a"), arm("b"), repeats=1)
    assert [name for name, when in firsts if when == "first"] == ["a", "b", "a", "b"]


def test_the_llama_cpp_peer_says_what_it_needs_or_decodes_the_embedded_gguf():
    from eagleviz.errors import UserFacingError
    from eagleviz.perf import peers

    with pytest.raises(UserFacingError, match="llama-cpp-python|embedded model's GGUF"):
        peers.make_peers(("plain", "llama-cpp"), "random", 2)
    assert peers.make_peers(("plain", "eagle-tree"), "random", 2) == {}
    if peers.needs_llama_cpp():
        pytest.skip(peers.needs_llama_cpp())
    try:
        made = peers.make_peers(("llama-cpp",), "embedded", 2)
    except UserFacingError as exc:  # the embedded model package is not installed
        pytest.skip(str(exc))
    from eagleviz.config import SamplingConfig

    tokens, seconds = made["llama-cpp"].run([1, 504, 3575, 282], SamplingConfig(max_new_tokens=6))
    again, _ = made["llama-cpp"].run([1, 504, 3575, 282], SamplingConfig(max_new_tokens=6))
    assert 1 <= len(tokens) <= 6 and seconds > 0 and again == tokens  # greedy, and no state kept between runs


def test_with_a_peer_among_the_methods_ours_prefill_whole_as_the_peer_does(monkeypatch):
    """The engine's cached chat opening saves ours part of every prefill; a peer has no such cache, so in a bench
    with one every method prefills the whole prompt (and the result and its table say which)."""
    from eagleviz.config import SamplingConfig, TreeConfig
    from eagleviz.decoding.prefix import PrefixCache

    engine = tiny_engine("llama", vocab=8)
    prompts = ["abcab", "abcba"]
    shared = engine.encode_prompt(prompts[0])[:3]
    assert engine.encode_prompt(prompts[1])[:3] == shared
    engine.prefix = PrefixCache(tuple(shared))  # as a chat template's opening would be
    reused, original = {}, bench.run_method

    def recording(eng, m, ids, sampling, tree, tuned=None, peers=None):
        sample = original(eng, m, ids, sampling, tree, tuned, peers)
        reused.setdefault(m, set()).add(sample.prefill_reused)
        return sample

    monkeypatch.setattr(bench, "run_method", recording)
    tree, sampling = TreeConfig.create(2, 2, 4), SamplingConfig(max_new_tokens=4)
    alone = bench.bench(engine, prompts, sampling, tree, 1, ("plain", "eagle-tree"), progress=lambda _: None)
    assert alone["prefill"] == "cached opening" and reused == {"plain": {3}, "eagle-tree": {3}}
    reused.clear()
    with_peer = bench.bench(engine, prompts, sampling, tree, 1, ("hf-generate", "plain", "eagle-tree"),
                            progress=lambda _: None)
    assert with_peer["prefill"] == "whole" and reused["plain"] == reused["eagle-tree"] == {0}
    assert "prefilled each prompt whole" in markdown_table(with_peer)
    assert engine.prefix.covers(engine.encode_prompt(prompts[0])) == 3  # the caller's engine is left as it was


def test_the_ledger_lever_compares_the_forecast_alone_with_the_clock_too(monkeypatch):
    from eagleviz.config import SamplingConfig, TreeConfig

    engine, seen = tiny_engine("llama", vocab=8).with_policy(CPU_COSTS), []
    original = bench.run_ours
    monkeypatch.setattr(bench, "run_ours", lambda eng, *a, **k: seen.append(eng.ledger) or original(eng, *a, **k))
    res = bench.lever_ab(engine, "ledger", ["abc", "abd"], SamplingConfig(max_new_tokens=6), TreeConfig.create(2, 2, 4), 1)
    assert {False, True} <= set(seen) and engine.ledger is True
    assert res["eagle-tree"]["same_tokens"] and len(res["eagle-tree"]["per_prompt"]) == 2


def test_the_performance_logs_lockstep_table_is_the_committed_runs():
    """docs/performance.md entry 40 gives the default against plain decoding on 80 prompts, each prompt run by both
    in lockstep, natively and held to AVX2 on an Intel Xeon, at T = 0 and T = 1: each row's plain tokens/s, ratio,
    interval and tau as the bench wrote them in assets/bench/lockstep-*.json, whose commands say how they were run."""
    root = Path(__file__).resolve().parents[1]
    log = (root / "docs" / "performance.md").read_text()
    entry = log[log.index("\n## 40. "):log.index("\n## 41. ")]
    table = entry[entry.index("**Result** on 80 prompts"):]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip().strip("|").split("|")]
                                              for line in table.splitlines() if line.startswith("| T = "))}
    for label, name in (("T = 0, native", "lockstep-T0"), ("T = 1, native", "lockstep-T1"),
                        ("T = 0, held to AVX2", "lockstep-avx2-T0"), ("T = 1, held to AVX2", "lockstep-avx2-T1")):
        run = json.loads((root / "assets/bench" / f"{name}.json").read_text())
        assert run["prompts"] == 80 and run["greedy_mismatches"] == [] and "--limit 80" in run["command"]
        assert run["pairing"] == "step" and "--lockstep" in run["command"]
        held = "avx2" in name
        assert ("emulating avx2" in run["machine"]["cpu"]) == held == ("EAGLEVIZ_CPU=avx2" in run["command"])
        assert f"T = {run['sampling']['temperature']:g}" in label
        eagle, (low, high) = run["rows"]["eagle-tree"], run["rows"]["eagle-tree"]["vs_plain_ci95"]
        quoted = [cell.replace("**", "") for cell in rows[label][:3]]
        assert quoted == [f"{run['rows']['plain']['tokens_per_s']:.1f}",
                          f"{eagle['vs_plain']:.3f}x ({low:.3f}-{high:.3f})", f"{eagle['tau']:.2f}"], label


def test_the_figures_formerly_in_the_readme_are_the_committed_runs():
    """docs/performance.md keeps, under "Figures formerly in the README", what the README said of the default against
    plain decoding in lockstep (entries 40, 42 and 43: the Intel Xeon, natively and held to AVX2, and the AVX2-only
    AMD EPYC) and of the H100 run (entry 41): each figure, within its own subsection, as the bench wrote it."""
    root = Path(__file__).resolve().parents[1]
    log = (root / "docs" / "performance.md").read_text()
    kept = log[log.index("\n## Figures formerly in the README\n"):]

    def subsection(title: str) -> str:
        start = kept.index(f"\n### {title}\n")
        return " ".join(kept[start:kept.index("\n### ", start + 1)].split())

    def run(name: str) -> dict:
        return json.loads((root / "assets/bench" / f"{name}.json").read_text())

    lockstep = subsection("How it works: the cost-aware tree against plain decoding")
    missing = []
    for name in ("lockstep-T0", "lockstep-T1", "lockstep-avx2-T0", "lockstep-avx2-T1", "lockstep-epyc-e88a1c8-T0",
                 "lockstep-epyc-fc92047-T1"):
        row = run(name)["rows"]["eagle-tree"]
        low, high = row["vs_plain_ci95"]
        missing += [q for q in (f"{row['vs_plain']:.3f}x", f"{low:.3f}-{high:.3f}") if q not in lockstep]
    gpu = subsection("How it works: on a GPU")
    t0, t1 = run("gpu/bench-h100-T0"), run("gpu/bench-h100-T1")
    missing += [q for q in (f"plain decoding runs at {t0['rows']['plain']['tokens_per_s']:.0f} tokens/s",
                            f"{t0['rows']['eagle-tree']['vs_plain']:.2f}x plain at T = 0",
                            f"(tau {t0['rows']['eagle-tree']['tau']:.2f})",
                            f"{t1['rows']['eagle-tree']['vs_plain']:.2f}x at T = 1") if q not in gpu]
    assert missing == []


def test_a_plain_control_runs_plain_decoding_again_beside_the_others(tiny_cli, capsys):
    """`--methods plain,plain-control,...`: plain decoding a second time, stepped in lockstep like the others, so
    its ratio to plain (which should be 1) shows the measurement's own spread beside the tree's; it writes plain
    decoding's tokens."""
    result, _ = tiny_bench(tiny_cli, "plain,plain-control,eagle-tree", "--lockstep")
    control = result["rows"]["plain-control"]
    assert list(result["rows"]) == ["plain", "plain-control", "eagle-tree"] and result["pairing"] == "step"
    assert result["greedy_mismatches"] == [] and control["tau"] is None
    low, high = control["vs_plain_ci95"]
    assert low <= control["vs_plain"] <= high and len(control["vs_plain_per_prompt"]) == 2
    assert "| plain-control |" in capsys.readouterr().out


def test_rates_after_the_prefill_and_the_decode_path_taken_are_reported(monkeypatch):
    """The same prefill in every method caps a whole run's ratio: the bench reports the rate after it too, and
    warns where a method's steps took another path than the engine's (a failed capture)."""
    from eagleviz.config import SamplingConfig, TreeConfig

    engine = tiny_engine("llama", vocab=8)
    rates = {"plain": 1.0, "eagle-tree": 2.0}  # tokens a second after the prefill
    monkeypatch.setattr(bench, "run_method", lambda eng, m, ids, sampling, tree, tuned=None, peers=None: bench.Sample(
        tokens=[1] * 11, seconds=0.5 + 10 / rates[m], prefill_ms=500.0,
        decode="static" if m == "eagle-tree" else engine.decode))
    result = bench.bench(engine, ["ab", "cd"], SamplingConfig(max_new_tokens=4), TreeConfig.create(2, 2, 4), 1,
                         tuple(rates), progress=lambda line: None)
    rows = result["rows"]
    assert rows["plain"]["decode_tokens_per_s"] == pytest.approx(1.0)
    assert rows["eagle-tree"]["decode_vs_plain"] == pytest.approx(2.0)
    assert rows["eagle-tree"]["vs_plain"] == pytest.approx((11 / 5.5) / (11 / 10.5))  # the prefill in both
    lines = bench.decode_lines(result, engine.decode)
    assert lines[0] == "after the prefill: plain 1.0 tokens/s (1.00x plain), eagle-tree 2.0 tokens/s (2.00x plain)"
    assert lines[1:] == [f"warning: eagle-tree's steps ran static, not {engine.decode} as asked (a capture failed: "
                         "the runs' notes say why)"]
