"""scripts/: the few commands kept as scripts, each run on tiny sizes by the test `RUN_BY` names; and what the README
and docs/ cite: every script, `python -m eagleviz` verb and make target they name exists, or, for a script removed
once its question was answered, is cited at a commit that holds it (`git show SHA:scripts/NAME`, as
docs/performance.md's introduction says). A figure's command that a refactor broke, or that ran on import, fails
here rather than when someone reruns it."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagleviz.paths import cache_dir
from kernels import cpu_ops

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMED = re.compile(r"scripts/([\w-]+\.(?:py|c))")
CITED = re.compile(r"git show ([0-9a-f]{7,40}):scripts/([\w-]+\.(?:py|c))")

RUN_BY = {  # each script -> the test that runs its work on tiny sizes
    "attention_rows.py": "tests/test_scripts.py::test_attention_rows_times_two_builds_and_finds_them_bit_equal",
    "device_cycle_switches.py": "tests/test_scripts.py::test_device_cycle_switches_runs_every_tree_of_a_switch",
    "follower_costs.py": "tests/test_scripts.py::test_follower_costs_times_both_forms_of_a_push_and_a_redraw",
    "measure_concurrency.py":
        "tests/test_reliability.py::test_the_concurrency_measurement_runs_whole_and_logs_the_servers_steps",
    "measure_ui_latency.py": "tests/test_scripts.py::test_measure_ui_latency_times_the_pages_handlers",
    "profile_gpu.py": "tests/test_scripts.py::test_profile_gpu_dry_runs_every_section_on_a_cpu",
    "quant_matmul_ab.c": "tests/test_scripts.py::test_quant_matmul_ab_times_two_builds_and_finds_them_bit_equal",
    "record_gallery.py": "tests/test_scripts.py::test_record_gallery_records_a_gallery_the_page_reads",
    "spaces_rehearsal.py": "tests/test_scripts.py::test_spaces_rehearsal_lays_out_the_hub_cache_and_the_pushed_files",
}


def script(name: str):
    """scripts/NAME, imported (its work waits under `main()`)."""
    spec = importlib.util.spec_from_file_location(f"script_{Path(name).stem}", ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_script_is_run_by_a_test():
    assert sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file()) == sorted(RUN_BY)
    for test in RUN_BY.values():
        path, name = test.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), f"{test} is not there"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_script_imports_without_running_and_says_how_it_is_run(path):
    environ, search = dict(os.environ), list(sys.path)
    try:
        module = script(path.name)  # a script that did its work on import would run (or fail) here
    finally:  # what a script sets up for itself on import stays there
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = search
    assert callable(getattr(module, "main", None)), f"{path.name}: its work belongs in main()"
    assert re.search(r'^if __name__ == "__main__":\n    (sys\.exit\()?main\(\)', path.read_text(), re.M)
    assert module.__doc__ and f"scripts/{path.name}" in module.__doc__, f"{path.name}: no usage line"


def test_record_gallery_records_a_gallery_the_page_reads(tmp_path, monkeypatch, capsys):
    """Every preset (its prompt cut to fit the tiny model's context) and the fastest tree's entry, recorded on a tiny
    engine into --out: an index and one compact trace per entry, which the gallery reads back."""
    from dataclasses import replace

    from eagleviz.app import gallery, presets
    from eagleviz.app.session import FastestTree
    from eagleviz.config import TreeConfig
    from tiny import tiny_engine

    m = script("record_gallery.py")
    monkeypatch.setattr(m, "load_engine", lambda: tiny_engine("llama", chat=True))
    monkeypatch.setattr(m, "default_head", lambda model: "a trained head")
    monkeypatch.setattr(m, "fastest_tree", lambda: FastestTree(TreeConfig.create(2, 1, 3, adaptive=False), "tune"))
    monkeypatch.setattr(presets, "PRESET_TOKENS", 8)
    monkeypatch.setattr(presets, "PRESETS", tuple(replace(p, prompt=p.prompt[:80]) for p in presets.PRESETS))
    monkeypatch.setattr(sys, "argv", ["record_gallery.py", "--out", str(tmp_path)])
    m.main()
    recorded = gallery.entries(tmp_path)
    assert len(recorded) == len(presets.PRESETS) + 1 and recorded[1].id.endswith("-fastest-tree")
    assert all(len(gallery.load(e.id, tmp_path).output) == 8 for e in recorded)
    for e in recorded:  # compact JSON: no separator's space
        text = (tmp_path / e.file).read_text()
        assert text == json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":")), e.file
    assert capsys.readouterr().out.count(" kB)") == len(recorded)


def test_measure_ui_latency_times_the_pages_handlers(monkeypatch, capsys):
    """The server-side budgets on a tiny engine: the first figures after Run, a step, a pick, a phase and a tour
    stop, each over every cycle of the run. Its --browser and --room parts need Chromium: the browser suites run
    the room (tests/test_room_browser.py)."""
    from tiny import tiny_engine

    m = script("measure_ui_latency.py")
    monkeypatch.setattr(m, "load_engine", lambda: tiny_engine("llama"))
    monkeypatch.setattr(sys, "argv", ["measure_ui_latency.py", "--max-new-tokens", "6", "--repeats", "1"])
    m.main()
    out = capsys.readouterr().out
    assert "server: first cycle's figures after Run: median" in out
    for what in ("step between cycles", "pick a token", "one phase of a cycle", "one stop of the guided tour"):
        assert re.search(rf"server: {what}.*: median \d+ ms, p95 \d+ ms, max \d+ ms over [1-9]", out), (what, out)


def test_follower_costs_times_both_forms_of_a_push_and_a_redraw(capsys):
    """Both parts on tiny sizes: two followers' pushes of one move, each form once; the four views redrawn over two
    cycles in Chromium, each form once; and the redraw's other form is Plotly's default overflow, the page's left
    as it is."""
    m = script("follower_costs.py")
    assert m.main(["push", "--followers", "2", "--moves", "1", "--rounds", "2"]) == 0
    assert re.search(r"2 followers' pushes, ms a move \(median\): as sent [\d.]+, slider as an update [\d.]+",
                     capsys.readouterr().out)
    figure = {"data": [], "layout": {"template": {"layout": {"xaxis": {"ticklabeloverflow": "allow", "ticks": ""}}}}}
    assert m._axes(figure, False)["layout"]["template"]["layout"]["xaxis"] == {"ticks": ""}
    assert m._axes(figure, True)["layout"]["template"]["layout"]["yaxis"] == {"ticklabeloverflow": "allow"}
    assert figure["layout"]["template"]["layout"]["xaxis"]["ticklabeloverflow"] == "allow"   # not changed in place
    assert m.main(["redraw", "--cycles", "2", "--rounds", "2"]) == 0
    assert re.search(r"redrawn, ms a step \(median\): as the page sets the axes [\d.]+, Plotly's default overflow "
                     r"[\d.]+", capsys.readouterr().out)


def test_measure_ui_latency_writes_the_rooms_figures_with_their_provenance():
    """`--room N --out FILE` (the measurement is the browser suite's): per series the median, p90 and max of the
    values it holds, the room's size, the command and where it ran."""
    m = script("measure_ui_latency.py")
    times = {"server+network": [0.3, 0.1, 0.2, 0.9], "browser paint": [], "end to end": [1.5, 2.5]}
    summary = json.loads(json.dumps(m.room_summary(times, 30, 2, 5, "python scripts/measure_ui_latency.py --room 30")))
    assert summary["series"]["server+network"] | {"values": None} == {"median": 0.25, "p90": 0.3, "max": 0.9, "n": 4,
                                                                      "values": None}
    assert summary["series"]["browser paint"] == {"n": 0} and summary["series"]["end to end"]["max"] == 2.5
    assert (summary["followers"], summary["pages"], summary["clicks"]) == (30, 2, 5)
    assert {"commit", "cpu_model", "versions"} <= summary["machine"].keys() and summary["date"]


def test_the_docs_room_latency_is_the_committed_measurement():
    """docs/operations.md and docs/app.md quote assets/bench/room-latency.json sentence by sentence (each series'
    median and max, in the sentence that names it), and say the 1 s target is met only as far as the file says."""
    room = json.loads((ROOT / "assets" / "bench" / "room-latency.json").read_text())
    series = room["series"]
    assert room["followers"] == 30 and room["pages"] == 2 and room["machine"]["commit"]

    def s(name: str, stat: str) -> str:
        return f"{series[name][stat]:.2f} s"

    ops = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    sentence = ops[ops.index("Latency, committed as `assets/bench/room-latency.json`"):]
    sentence = sentence[:sentence.index("The target")]
    assert (f"median {s('server+network', 'median')}, p90 {s('server+network', 'p90')}, max "
            f"{s('server+network', 'max')} over {series['server+network']['n']} (server and network)") in sentence
    assert f"drawing of it, median {s('browser paint', 'median')}, max {s('browser paint', 'max')}" in sentence
    assert f"end to end median {s('end to end', 'median')}, max {s('end to end', 'max')}." in sentence
    met = [name for name in ("server+network", "end to end") if series[name]["max"] < 1.0]
    verdict = ops[ops.index("The target, under 1 s median and max"):].split(".")[0]
    assert ("is met by the server's median alone" in verdict) == (met == [] and series["server+network"]["median"] < 1)
    app = " ".join((ROOT / "docs" / "app.md").read_text().split())
    assert (f"took a median {s('server+network', 'median')} and at most {s('server+network', 'max')}" in app
            and f"a median {s('end to end', 'median')} and at most {s('end to end', 'max')}" in app)


def test_attention_rows_times_two_builds_and_finds_them_bit_equal(tmp_path, capsys):
    """scripts/attention_rows.py times this checkout's C attention against another copy of the file in turn: the
    same source gives the same bits, and a copy whose softmax is off by an ulp is refused."""
    if cpu_ops.load(cache_dir() / "kernels") is None:
        pytest.skip("no C layer here")
    run = script("attention_rows.py").main
    assert run(["--repeats", "1", "--rows", "3", "--prefix", "5", "--against", str(cpu_ops.SOURCE)]) == 0
    out = capsys.readouterr().out
    assert "3 rows x 8 keys" in out and "against" in out and "the same bits" in out
    wrong = tmp_path / "wrong.c"
    text = cpu_ops.SOURCE.read_text()
    assert "inv_sum[r] = 1.0f / sum;" in text
    wrong.write_text(text.replace("inv_sum[r] = 1.0f / sum;", "inv_sum[r] = nextafterf(1.0f / sum, 0.0f);"))
    assert run(["--repeats", "1", "--rows", "3", "--prefix", "5", "--against", str(wrong)]) == 1


def test_quant_matmul_ab_times_two_builds_and_finds_them_bit_equal(tmp_path):
    """The C harness of the int8 products, as its usage line builds it, on a small part-filled weight: this CPU's
    vector build and the plain C one side by side, both formats, and over a forward's products (FORWARD=); and a
    library whose product is off by a bit is caught."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the plain build is -march=x86-64")
    cc = shutil.which(os.environ.get("CC", "cc")) or pytest.skip("no C compiler")
    source, flags = ROOT / "kernels" / "quant_ops.c", ["-O3", "-fopenmp", "-ffp-contract=fast", "-shared", "-fPIC"]
    wrong = tmp_path / "wrong.c"  # the products plus one ulp in the first output
    wrong.write_text(source.read_text().replace("int quant_matmul_i8(", "static int product_i8(") + """
int quant_matmul_i8(int fmt, const float *x, const uint8_t *q, const uint16_t *d, const uint16_t *m, const float *bias,
                    float *y, int rows, int k, int n_out, int threads) {
    int code = product_i8(fmt, x, q, d, m, bias, y, rows, k, n_out, threads);
    y[0] = nextafterf(y[0], INFINITY);
    return code;
}
""")
    for name, src, march in (("vector", source, "native"), ("plain", source, "x86-64"), ("wrong", wrong, "native")):
        subprocess.run([cc, *flags, f"-march={march}", str(src), "-o", str(tmp_path / f"{name}.so"), "-lm"], check=True)
    subprocess.run([cc, "-O2", str(ROOT / "scripts" / "quant_matmul_ab.c"), "-o", str(tmp_path / "ab"), "-ldl"],
                   check=True)
    env = {**os.environ, "N": "40", "K": "64", "REPS": "2"}
    for fmt in ("0", "1"):
        done = subprocess.run([tmp_path / "ab", "5", fmt, "3", tmp_path / "vector.so", tmp_path / "plain.so"],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0 and f"rows 5 fmt {fmt} 40x64 threads 1:" in done.stdout, done.stdout
        assert "the same bits" in done.stdout
    done = subprocess.run([tmp_path / "ab", "5", "0", "1", tmp_path / "vector.so", tmp_path / "wrong.so"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "MISMATCH" in done.stdout
    forward = {**env, "FORWARD": "1", "REPS": "1"}   # a layer's seven products and the LM head, each weight its own
    for other, code in (("plain", 0), ("wrong", 1)):
        done = subprocess.run([tmp_path / "ab", "2", "0", "2", tmp_path / "vector.so", tmp_path / f"{other}.so"],
                              capture_output=True, text=True, env=forward)
        assert done.returncode == code, done.stdout
        assert ("rows 2 forward of 1 layers threads 1:" in done.stdout and "the same bits" in done.stdout
                if code == 0 else "MISMATCH" in done.stdout), done.stdout


def test_profile_gpu_dry_runs_every_section_on_a_cpu(tmp_path):
    """`--tiny-cpu`: every section of the GPU profile on a tiny random model on this CPU, none failing, and the
    report, tables and trace written. The GPU's own figures (kernels, syncs, Triton, cuDNN) need a CUDA device."""
    out = tmp_path / "profile"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_gpu.py"), "--tiny-cpu", "-", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))  # a tiny model: threads only wait on each other
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    sections = {k: v for k, v in report.items() if isinstance(v, dict) and k not in ("summary", "triton_hooks")}
    assert {"env", "load", "warmup", "timing", "profile_plain_torch", "profile_eagle_torch", "triton"} <= set(sections)
    assert [k for k, v in sections.items() if "error" in v] == []
    assert {k: v["skipped"] for k, v in sections.items() if "skipped" in v} == {"graph_floor": "CUDA only",
                                                                             "sdpa": "CUDA only"}
    assert report["timing"]["torch_eagle"]["tokens"] > 0 and report["summary"]["plain_torch_tok_s"] > 0
    assert (out / "plain_torch_by_self_cpu.txt").is_file() and (out / "trace_short_plain_torch.json.gz").is_file()


def test_spaces_rehearsal_lays_out_the_hub_cache_and_the_pushed_files(tmp_path):
    """The rehearsal's steps that take seconds: the README's sdk_version, the Hub cache `preload_from_hub` leaves
    (here from two small files, which Hugging Face's own lookup finds offline) and the files a push sends. The
    whole rehearsal (a new venv with PyTorch, `python app.py`, a run through the API and the browser) runs under
    `-m slow`: tests/test_spaces.py."""
    from huggingface_hub import try_to_load_from_cache

    m = script("spaces_rehearsal.py")
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", m.sdk_version())
    source = tmp_path / "snapshot"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}')
    (source / "tokenizer.json").write_text("{}")
    snap = m.hub_cache(tmp_path / "hf", source)
    found = Path(try_to_load_from_cache(m.HUB_ID, "config.json", cache_dir=tmp_path / "hf" / "hub"))
    assert found.parent == snap and found.is_symlink() and found.read_text() == '{"model_type": "llama"}'
    m.copy_repository(tmp_path / "space")
    pushed = tmp_path / "space"
    assert (pushed / "app.py").is_file() and (pushed / "requirements.txt").is_file()
    assert (pushed / "scripts" / "spaces_rehearsal.py").is_file() and not (pushed / ".venv").exists()


def test_every_script_the_docs_name_exists_or_is_cited_at_a_commit():
    """A script the README or a doc names is in scripts/, or that doc cites it as `git show SHA:scripts/NAME`
    (a removed script: its figures stay with the commit that holds it)."""
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        cited = {name for _, name in CITED.findall(text)}
        missing += [f"{doc.name}: scripts/{name}" for name in sorted(set(NAMED.findall(text)))
                    if not (ROOT / "scripts" / name).exists() and name not in cited]
    assert missing == []


def test_a_removed_script_is_cited_at_a_commit_that_holds_it():
    cites = sorted({(sha, name) for doc in DOCS for sha, name in CITED.findall(doc.read_text())})
    assert cites, "docs/performance.md cites its removed scripts"
    git = shutil.which("git")
    shallow = git and subprocess.run([git, "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip()
    if not git or shallow != "false":
        pytest.skip("no full git history here: the cited commits cannot be looked up")
    absent = [f"{sha}:scripts/{name}" for sha, name in cites
              if subprocess.run([git, "cat-file", "-e", f"{sha}:scripts/{name}"], cwd=ROOT,
                                capture_output=True).returncode != 0]
    assert absent == []


def test_every_command_verb_and_make_target_the_docs_name_exists():
    from eagleviz import cli

    texts = " ".join(doc.read_text() for doc in DOCS)
    verbs = set(re.findall(r"python -m eagleviz ([a-z][\w-]*)", texts))
    assert verbs and sorted(verbs - {"generate", *cli.DELEGATED}) == []
    targets = set(re.findall(r"`make ([a-z][\w-]*)", texts))
    makefile = (ROOT / "Makefile").read_text()
    assert targets and sorted(t for t in targets if not re.search(rf"^{t}:", makefile, re.M)) == []


def test_device_cycle_switches_runs_every_tree_of_a_switch(monkeypatch):
    """One switch's runs, in process, on a tiny fp32 engine over a CPU's uncaptured static steps standing in for
    the GPU's random target: every tree's greedy tokens plain decoding's, with the device's choice asked for."""
    import eagleviz.decoding.load as load
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.target import TargetModel
    from tiny import tiny_engine

    base = tiny_engine()
    target = TargetModel(base.target.hf, base.target.tokenizer, base.target.name, fused=False)
    made = []
    monkeypatch.setattr(load, "load_engine", lambda *a, **k: made.append(k) or Engine(target, base.head, "random",
                                                                                      decode="static"))
    row = script("device_cycle_switches.py").one("base", 12)
    assert made[0]["device"] == "cuda" and made[0]["dtype"] == "bfloat16"  # what a GPU's run loads
    trees = ("6-8-64", "5-4-16", "5-4-16+lookup", "default")
    assert all(row[t] == {"equal": True, "first_difference": None} for t in trees), row
