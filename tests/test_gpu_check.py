"""eagleviz/perf/gpu_check.py on a CPU: the report's structure from every section with tiny engines and the kernel in
Triton's interpreter, a broken section reported without hiding the others, a section that cannot run here
skipped with its reason, the prompts it picks, the command's one-line refusals (no GPU, a bad device), and
its dry run writing the report. The bare machine's runs, in subprocesses: tests/test_bare_box.py."""

import json
from types import SimpleNamespace

import pytest
import torch

from eagleviz import cli

from eagleviz.perf import gpu_check
from eagleviz.config import TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.errors import UserFacingError
from kernels import cases
from tiny import tiny_engine

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
    assert set(report) == {"environment", "started", "self_check", "kernel_grid", "lossless", "bench", "summary", "ok"}
    assert report["environment"]["device"] == "cpu" and report["environment"]["torch"] == torch.__version__
    assert set(report["self_check"]) == {"float32", "float16", "bfloat16"}
    assert all(c["ok"] and c["relative_error"] is not None for c in report["self_check"].values())
    grid = report["kernel_grid"]
    assert grid["cases"] == len(range(0, len(cases.grid(cases.GPU_DTYPES)), 149))
    assert grid["failed"] == 0 and set(grid["max_relative_error"]) == {"float32", "float16", "bfloat16"}
    for dtype in ("float32", "float16", "bfloat16"):
        section = report["lossless"][dtype]
        assert section["ok"] and section["identical"] == 2 and len(section["prompts"]) == 2
        assert section["attn_impl"] == "torch" and section["notes"] == [] and section["head"] == "random"
    bench = report["bench"]
    assert set(bench) == {"triton", "torch", "settings"}
    assert "on a GPU only" in bench["triton"]["skipped"]  # the engine runs the kernel on CUDA only
    assert bench["torch"]["tau"] >= 1.0 and bench["torch"]["plain_tokens_per_s"] > 0
    assert set(bench["torch"]["mean_phase_ms"]) == {"draft", "verify", "accept", "rewind"}
    assert report["summary"] == {"passed": ["self_check", "kernel_grid", "lossless", "bench"], "failed": [],
                                 "skipped": [f"bench.triton: {bench['triton']['skipped']}"]}
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
    monkeypatch.setattr(gpu_check, "kernel_grid", lambda device, dtypes, every: {"ok": True})
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
    assert report["bench"]["settings"]["dtype"] == "float32"
