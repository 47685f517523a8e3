"""eagleviz/perf/gpu_check.py on a CPU: the report's structure from every section with tiny engines and the kernel in
Triton's interpreter, a broken section reported without hiding the others, the command's refusal where no
GPU is visible, and its dry run writing the report."""

import json

import pytest
import torch

from eagleviz import cli

from eagleviz.perf import gpu_check
from eagleviz.config import TreeConfig
from eagleviz.decoding.engine import Engine
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
    assert set(report) == {"environment", "started", "self_check", "kernel_grid", "lossless", "bench", "ok"}
    assert report["environment"]["device"] == "cpu" and report["environment"]["torch"] == torch.__version__
    assert set(report["self_check"]) == {"float32", "float16", "bfloat16"}
    assert all(c["ok"] and c["relative_error"] is not None for c in report["self_check"].values())
    grid = report["kernel_grid"]
    assert grid["cases"] == len(range(0, len(cases.grid(cases.GPU_DTYPES)), 149))
    assert grid["failed"] == 0 and set(grid["max_relative_error"]) == {"float32", "float16", "bfloat16"}
    for dtype in ("float32", "bfloat16"):
        section = report["lossless"][dtype]
        assert section["ok"] and section["identical"] == 2 and len(section["prompts"]) == 2
        assert section["attn_impl"] == "torch" and section["notes"] == []
    bench = report["bench"]
    assert set(bench) == {"torch", "settings"}  # the engine runs the kernel on CUDA only
    assert bench["torch"]["tau"] >= 1.0 and bench["torch"]["plain_tokens_per_s"] > 0
    assert set(bench["torch"]["mean_phase_ms"]) == {"draft", "verify", "accept", "rewind"}
    assert report["ok"] is True


def test_a_failing_section_is_reported_and_the_others_still_run(engine_for, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(gpu_check, "lossless", broken)
    monkeypatch.setattr(gpu_check, "kernel_runs_here", lambda device: False)
    report = gpu_check.run_gpu_check(torch.device("cpu"), engine_for, ["abc"], TREE, max_new_tokens=6,
                                     progress=_quiet)
    assert report["lossless"] == {"ok": False, "error": "RuntimeError: out of memory"}
    assert report["self_check"] is None and report["kernel_grid"] is None  # skipped: no kernel here
    assert "torch" in report["bench"] and report["ok"] is False


def test_without_a_gpu_the_command_refuses_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the refusal cannot happen here")
    assert cli.main(["gpu-check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: gpu-check needs a CUDA GPU") and "\n" not in err


def test_the_dry_run_writes_its_report(engine_for, monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "embedded_engines", lambda device: engine_for)
    monkeypatch.setattr(gpu_check, "kernel_runs_here", lambda device: False)
    out = tmp_path / "report.json"
    assert cli.main(["gpu-check", "--device", "cpu", "--quick", "--prompts", "builtin", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["command"].endswith(f"--out {out}")
    assert len(report["lossless"]["float32"]["prompts"]) == 2
