"""eagleviz/perf/gpu_check.py (and the sections it reports, eagleviz/perf/sections.py) on a CPU: the report's
structure from every section with tiny engines and the kernel in Triton's interpreter, a broken section reported
without hiding the others, a section that cannot run here skipped with its reason, the default grid's sample, the
time budget (spent: what has not started is skipped, never run over), the prompts it picks, the command's
one-line refusals (no GPU, a bad device, a negative budget), and its dry run writing the report with the
defaults. The bare machine's runs, in subprocesses: tests/test_bare_box.py."""

import json
from types import SimpleNamespace

import pytest
import torch

from eagleviz import cli

from eagleviz.perf import gpu_check
from eagleviz.config import TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.errors import UserFacingError
from eagleviz.perf.sections import Budget
from kernels import cases
from tiny import reverse_kept, tiny_engine

TREE = TreeConfig.create(3, 2, 6)


@pytest.fixture(scope="module")
def engine_for():
    base = tiny_engine("llama", vocab=8, layers=2)
    return lambda dtype, impl: Engine(base.target, base.head, "random", impl)


def _quiet(_line):
    pass


@pytest.mark.triton
def test_the_report_has_every_section_and_passes_on_tiny_models(engine_for):
    report = gpu_check.run_gpu_check(torch.device("cpu"), engine_for, ["abcde", "xyz"], TREE, max_new_tokens=10,
                                     grid_every=149, progress=_quiet)
    json.dumps(report)  # plain JSON all through
    assert set(report) == {"environment", "started", "self_check", "kernel_grid", "lossless", "device_cycle", "bench",
                           "time", "summary", "ok"}
    assert report["time"]["budget_s"] is None and list(report["time"]["seconds"]) == list(gpu_check.SECTIONS)
    assert sum(report["time"]["seconds"].values()) <= report["time"]["total_s"] + 0.5  # each rounded to 0.1 s
    assert report["environment"]["device"] == "cpu" and report["environment"]["torch"] == torch.__version__
    assert set(report["self_check"]) == {"float32", "float16", "bfloat16"}
    assert all(c["ok"] and c["relative_error"] is not None for c in report["self_check"].values())
    grid = report["kernel_grid"]
    assert grid["cases"] == grid["chosen"] == len(range(0, len(cases.grid(cases.GPU_DTYPES)), 149))
    assert grid["grid"] == len(cases.grid(cases.GPU_DTYPES)) and "rest" not in grid
    assert grid["failed"] == 0 and set(grid["max_relative_error"]) == {"float32", "float16", "bfloat16"}
    for dtype in ("float32", "float16", "bfloat16"):
        section = report["lossless"][dtype]
        assert section["ok"] and section["identical"] == 2 and len(section["prompts"]) == 2
        assert section["attn_impl"] == "torch" and section["notes"] == [] and section["head"] == "random"
    assert "GPU's captured steps" in report["device_cycle"]["skipped"]  # tested below over a CPU's static steps
    bench = report["bench"]
    assert set(bench) == {"triton", "torch", "settings"}
    assert "on a GPU only" in bench["triton"]["skipped"]  # the engine runs the kernel on CUDA only
    assert bench["torch"]["tau"] >= 1.0 and bench["torch"]["plain_tokens_per_s"] > 0
    # a CPU's path: the eager forward, one read of the device's (here the CPU's) values a plain token
    assert bench["torch"]["decode"] == "eager" and bench["torch"]["reads_per_plain_token"] == 1.0
    assert bench["torch"]["decode_taken"] == ["eager"] and bench["torch"]["fallbacks"] == []
    assert bench["torch"]["reads_per_cycle"] > 0
    assert set(bench["torch"]["mean_phase_ms"]) == {"draft", "verify", "accept", "rewind"}
    assert report["summary"] == {"passed": ["self_check", "kernel_grid", "lossless", "bench"], "failed": [],
                                 "skipped": [f"device_cycle: {report['device_cycle']['skipped']}",
                                             f"bench.triton: {bench['triton']['skipped']}"]}
    assert report["ok"] is True


def test_a_failing_section_is_reported_and_the_others_still_run(engine_for, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(gpu_check, "lossless", broken)
    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: "Triton is not installed")
    report = gpu_check.run_gpu_check(torch.device("cpu"), engine_for, ["abc"], TREE, max_new_tokens=6,
                                     progress=_quiet)
    assert report["lossless"] == {"ok": False, "error": "RuntimeError: out of memory"}
    assert report["self_check"] == report["kernel_grid"] == {"skipped": "Triton is not installed"}
    assert report["bench"]["triton"] == {"skipped": "Triton is not installed"} and "torch" in report["bench"]
    assert report["summary"]["failed"] == ["lossless"] and report["ok"] is False
    assert gpu_check.describe(report["lossless"]) == "FAILED (RuntimeError: out of memory)"


def test_different_outputs_with_no_located_difference_fail(engine_for, monkeypatch):
    """A run whose outputs differ is ok only when a near-tie explains its first difference; one whose first
    difference was not found has no explanation and fails."""
    from eagleviz.decoding import race

    monkeypatch.setattr(race, "race", lambda engine, run: SimpleNamespace(identical=False, divergence=None))
    section = gpu_check.lossless(engine_for, ["abcde"], TREE, max_new_tokens=6, dtypes=("float32",))["float32"]
    row = section["prompts"][0]
    assert (row["identical"], row["near_tie"], row["divergence"]) == (False, False, "not located")
    assert section["ok"] is False


@pytest.mark.parametrize("error, ok", [(0.1, False), (0.2, True)])
def test_a_half_precision_parting_is_judged_by_the_dtypes_bound(engine_for, monkeypatch, error, ok):
    """bf16's first difference is explained only within the bound (`eagleviz.perf.rounding`): the two tokens' fp32
    logits 0.3 apart, the dtype's own logits off fp32's by 0.1 (a bound of 0.2: a fault) or 0.2 (0.4: rounding can
    part them); the fp32 logits come from the fp32 engine, asked for after the bf16 runs, and the row says why."""
    from eagleviz.decoding import race

    asked, calls, fake = [], [], {}

    def fake_race(engine, run):  # plain decoding parts at new token 1
        plain = list(run.token_ids)
        plain[1] = fake["plain"] = (plain[1] + 1) % 8
        return SimpleNamespace(identical=False, plain=SimpleNamespace(token_ids=plain),
                               divergence=SimpleNamespace(position=1, gap=0.0, rounding_steps=0.0))

    def logits(engine, ids):  # the bf16 engine's logits first, then the fp32 engine's
        reference = torch.zeros(8)
        reference[fake["plain"]] = 0.3
        calls.append(len(ids))
        return reference + error if len(calls) == 1 else reference

    def recording(dtype, impl):
        asked.append(dtype)
        return engine_for(dtype, impl)

    monkeypatch.setattr(race, "race", fake_race)
    monkeypatch.setattr(race, "logits_after", logits)
    section = gpu_check.lossless(recording, ["abcde"], TREE, max_new_tokens=6, dtypes=("bfloat16",))["bfloat16"]
    row = section["prompts"][0]
    assert asked == ["bfloat16", "float32"] and len(calls) == 2 and calls[0] == calls[1]
    parting = row["parting"]
    assert (parting["position"], parting["plain"]) == (1, fake["plain"])
    assert abs(parting["reference_gap"] - 0.3) < 1e-6 and abs(parting["dtype_error"] - error) < 1e-6
    assert row["near_tie"] is ok and parting["explained"] is ok and section["ok"] is ok


def test_an_error_in_one_dtype_fails_that_dtype_only(engine_for):
    def fp16_broken(dtype, impl):
        if dtype == "float16":
            raise RuntimeError("CUDA out of memory")
        return engine_for(dtype, impl)

    section = gpu_check.lossless(fp16_broken, ["abc"], TREE, max_new_tokens=6)
    assert section["float16"] == {"ok": False, "error": "RuntimeError: CUDA out of memory"}
    assert section["float32"]["ok"] and section["bfloat16"]["ok"]
    assert gpu_check.summary({"lossless": section})["failed"] == ["lossless"]


def test_a_model_that_cannot_load_here_is_skipped_with_its_reason(monkeypatch):
    def missing(dtype, impl):
        raise UserFacingError("The embedded model package is not installed")

    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: None)
    monkeypatch.setattr(gpu_check, "self_checks", lambda device, dtypes: {d: {"ok": True} for d in dtypes})
    monkeypatch.setattr(gpu_check, "kernel_grid", lambda device, dtypes, every, budget: {"ok": True})
    report = gpu_check.run_gpu_check(torch.device("cpu"), missing, ["abc"], TREE, max_new_tokens=6,
                                     progress=_quiet)
    assert report["lossless"] == {d: {"skipped": "The embedded model package is not installed"}
                                  for d in gpu_check.DTYPE_NAMES}
    assert report["bench"]["torch"] == {"skipped": "The embedded model package is not installed"}
    assert report["summary"]["passed"] == ["self_check", "kernel_grid"] and report["ok"] is True
    assert report["summary"]["skipped"][0] == "lossless: The embedded model package is not installed"
    assert gpu_check.describe(report["lossless"]).startswith("skipped: The embedded model package")


def test_without_prompts_the_model_sections_say_why(engine_for, monkeypatch):
    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: "Triton is not installed")
    report = gpu_check.run_gpu_check(torch.device("cpu"), engine_for, "no prompts: MT-bench needs its package",
                                     TREE, progress=_quiet)
    assert report["lossless"] == report["bench"] == {"skipped": "no prompts: MT-bench needs its package"}
    assert report["summary"]["passed"] == [] and report["ok"] is True


def test_auto_prompts_prefer_a_bundle_then_mtbench_then_the_builtin_ones(tmp_path, monkeypatch):
    from eagleviz import prompts
    from eagleviz.paths import Bundle

    (tmp_path / Bundle.INDEX).write_text("{}")
    Bundle(tmp_path).mtbench.parent.mkdir()
    Bundle(tmp_path).mtbench.write_text('{"turns": ["first?"]}\n{"turns": ["second?"]}\n')
    assert gpu_check.choose_prompts("auto", str(tmp_path), 8) == (["first?", "second?"], str(Bundle(tmp_path).mtbench))
    monkeypatch.setattr(prompts, "_package_dir", lambda package: None)  # no MT-bench package here
    assert gpu_check.choose_prompts("auto", "random", 2) == (list(gpu_check.FALLBACK_PROMPTS[:2]), "builtin")
    why, source = gpu_check.choose_prompts("mtbench", "random", 2)
    assert source == "mtbench" and why.startswith("no prompts: MT-bench questions need the package")


def test_without_a_gpu_the_command_refuses_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the refusal cannot happen here")
    assert cli.main(["gpu-check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: gpu-check needs a CUDA GPU") and "\n" not in err


def test_a_bad_device_is_one_line(capsys):
    assert cli.main(["gpu-check", "--device", "gpu0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --device 'gpu0' is not a device name (cpu, cuda, cuda:1, ...)"


def test_the_default_grid_holds_every_value_and_every_extreme_of_each_axis():
    grid = cases.grid(cases.GPU_DTYPES)
    chosen = [grid[i] for i in gpu_check.sampled_cases(grid)]
    axes = (cases.PREFIXES, cases.TREE_SIZES, cases.HEAD_DIMS, cases.GROUPS, cases.SHAPES, cases.GPU_DTYPES)
    assert len(chosen) == 216 and len(grid) == 1944
    for k, axis in enumerate(axes):
        assert {case[k] for case in chosen} == set(axis)  # every value, so both ends of each axis
    for k, axis in enumerate(axes[:4]):  # each end of a size axis against the other three at their largest...
        others = [j for j in range(4) if j != k]
        for end in (axis[0], axis[-1]):
            assert any(c[k] == end and all(c[j] == axes[j][-1] for j in others) for c in chosen)
    corners = {(p, t, d, g) for p in (0, 130) for t in (1, 64) for d in (32, 128) for g in (1, 4)}
    for shape in cases.SHAPES:  # ... and the 16 corners for every tree shape and dtype
        for dtype in cases.GPU_DTYPES:
            assert {c[:4] for c in chosen if c[4:] == (shape, dtype)} >= corners


def test_a_budget_of_zero_skips_every_section_with_the_reason(engine_for, monkeypatch):
    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: None)
    report = gpu_check.run_gpu_check(torch.device("cpu"), engine_for, ["abc"], TREE, max_new_tokens=6,
                                     budget=Budget(0), progress=_quiet)
    why = "not started: the time budget (--budget-s 0) was spent"
    assert all(report[name] == {"skipped": why} for name in gpu_check.SECTIONS)
    assert report["summary"] == {"passed": [], "failed": [], "skipped": [f"{n}: {why}" for n in gpu_check.SECTIONS]}
    assert report["time"]["budget_s"] == 0 and set(report["time"]["seconds"]) == set(gpu_check.SECTIONS)


class Clock:
    """Seconds that pass only when told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_budget_spent_during_a_section_stops_it_between_parts(engine_for, monkeypatch):
    """A 15 s budget on a clock where a grid case takes 1 s and loading a model 10 s: with 20 cases, the grid stops
    after 15 and the sections after it are skipped; with 5, the lossless check runs its first dtype (started at
    5 s) and skips the others (not started by 15 s), and the bench is skipped."""
    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: None)
    monkeypatch.setattr(gpu_check, "self_checks", lambda device, dtypes: {d: {"ok": True} for d in dtypes})
    why = "not started: the time budget (--budget-s 15) was spent"

    def run(every: int) -> dict:
        clock = Clock()

        def case(case, seed, device):
            clock.now += 1.0
            return cases.CaseResult(cases.case_id(case), 0.0, 0.0, True)

        def slow_engine(dtype, impl):
            clock.now += 10.0
            return engine_for(dtype, impl)

        monkeypatch.setattr(cases, "run_case", case)
        return gpu_check.run_gpu_check(torch.device("cpu"), slow_engine, ["abc"], TREE, max_new_tokens=6,
                                       grid_every=every, budget=Budget(15, clock), progress=_quiet)

    report = run(every=100)  # 20 of the 1,944 cases
    grid = report["kernel_grid"]
    assert (grid["cases"], grid["chosen"]) == (15, 20) and grid["rest"] == {"skipped": f"5 cases {why}"}
    assert report["lossless"] == report["bench"] == {"skipped": why}
    assert report["summary"] == {"passed": ["self_check", "kernel_grid"], "failed": [],
                                 "skipped": [f"kernel_grid.rest: 5 cases {why}", f"lossless: {why}",
                                             f"device_cycle: {why}", f"bench: {why}"]}

    report = run(every=400)  # 5 cases
    assert report["kernel_grid"]["cases"] == 5 and "rest" not in report["kernel_grid"]
    assert report["lossless"]["float32"]["ok"]
    assert report["lossless"]["float16"] == report["lossless"]["bfloat16"] == {"skipped": why}
    assert report["summary"] == {"passed": ["self_check", "kernel_grid", "lossless"], "failed": [],
                                 "skipped": [f"lossless.float16: {why}", f"lossless.bfloat16: {why}",
                                             f"device_cycle: {why}", f"bench: {why}"]}


def test_the_dry_run_writes_its_report(engine_for, monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(gpu_check, "engines", lambda model, head, device: seen.append((model, head)) or engine_for)
    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: "Triton is not installed")
    out = tmp_path / "report.json"
    assert cli.main(["gpu-check", "--device", "cpu", "--quick", "--model", "random", "--prompts", "builtin",
                     "--dtypes", "float32", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["command"].endswith(f"--out {out}") and seen == [("random", None)]
    assert list(report)[:2] == ["environment", "model"] and set(report["lossless"]) == {"float32"}
    assert report["model"]["model"] == "random" and "stand-in" in report["model"]["tokenizer"]
    assert report["model"]["prompts"] == "builtin" and len(report["lossless"]["float32"]["prompts"]) == 2
    assert report["bench"]["settings"]["dtype"] == "float32" and report["bench"]["settings"]["max_new_tokens"] == 32
    assert report["time"]["budget_s"] == 120 and report["time"]["total_s"] < 120


def test_the_defaults_are_two_prompts_of_48_tokens_and_the_sampled_grid(engine_for, monkeypatch, tmp_path, capsys):
    grids = []

    def grid(device, dtypes, every, budget):
        grids.append(every)
        return {"ok": True}

    monkeypatch.setattr(gpu_check, "engines", lambda model, head, device: engine_for)
    monkeypatch.setattr(gpu_check, "kernel_unavailable", lambda device: None)
    monkeypatch.setattr(gpu_check, "self_checks", lambda device, dtypes: {d: {"ok": True} for d in dtypes})
    monkeypatch.setattr(gpu_check, "kernel_grid", grid)
    args = ["gpu-check", "--device", "cpu", "--model", "random", "--prompts", "builtin", "--dtypes", "float32"]
    assert cli.main(args + ["--out", str(tmp_path / "report.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bench"]["settings"]["max_new_tokens"] == 48 and report["bench"]["settings"]["prompts"] == 2
    assert "s of the 120 s budget" in capsys.readouterr().out
    assert cli.main(args + ["--budget-s", "0", "--full-grid", "--out", str(tmp_path / "none.json")]) == 0
    assert cli.main(args + ["--budget-s", "60", "--full-grid", "--quick", "--out", str(tmp_path / "full.json")]) == 0
    assert cli.main(args + ["--quick", "--out", str(tmp_path / "quick.json")]) == 0
    assert grids == [None, 1, 20]  # the budget of 0 s ran no grid at all
    none = json.loads((tmp_path / "none.json").read_text())
    assert none["summary"]["passed"] == [] and none["time"]["budget_s"] == 0
    assert "not started: the time budget (--budget-s 0) was spent" in capsys.readouterr().out


def test_a_negative_budget_is_refused_in_one_line(capsys):
    assert cli.main(["gpu-check", "--device", "cpu", "--budget-s", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --budget-s: a time budget is 0 s or more, got -1.0"


@pytest.fixture(scope="module")
def static_engine_for():
    """`engine_for`'s engines over static steps (uncaptured here): where the device cycle runs."""
    base = tiny_engine("llama", vocab=8, layers=2)
    return lambda dtype, impl: Engine(base.target, base.head, "random", impl, decode="static")


def test_the_device_cycle_section_runs_every_tree_against_the_hosts_choice(static_engine_for):
    section = gpu_check.device_cycle(static_engine_for, ["abcde", "xyz"], max_new_tokens=10)
    assert set(section) == set(gpu_check.DEVICE_CYCLE_TREES)
    for part in section.values():
        assert part["ok"] and part["identical"] == 2 and part["decode"] == "static", part
    assert gpu_check.summary({"device_cycle": section})["passed"] == ["device_cycle"]


def test_a_device_cycle_mismatch_fails_its_tree_with_the_evidence(static_engine_for, monkeypatch):
    """A tree whose device-decided run ends with a mismatch fails alone, its part holding the error and what a CPU
    needs to replay the device's choice; the other trees still run."""
    reverse_kept(monkeypatch)
    monkeypatch.setattr(gpu_check, "DEVICE_CYCLE_TREES", {"fixed": TreeConfig.create(3, 2, 6, adaptive=False,
                                                                                      source="eagle")})
    section = gpu_check.device_cycle(static_engine_for, ["abcde"], max_new_tokens=10)
    part = section["fixed"]
    assert part["ok"] is False and part["error"].startswith("DeviceVerdictMismatch: the device kept nodes")
    assert part["evidence"]["cpu_kept"] == part["evidence"]["kept"][::-1]
    assert gpu_check.summary({"device_cycle": section})["failed"] == ["device_cycle"]
