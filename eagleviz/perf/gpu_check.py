"""`python -m eagleviz gpu-check`: one command that shows, on the visible GPU, whether the CUDA path works.

It writes one JSON report (docs/gpu-check.md says what to expect in it):
    environment   the GPU, its compute capability and memory; torch, CUDA and Triton versions
    self_check    the Triton kernel against PyTorch attention on a small tree in fp32, fp16 and bf16: the check
                  `auto` makes before it takes the kernel (kernels/self_check.py)
    kernel_grid   the kernel against a float64 reference over the test suite's grid (kernels/cases.py), also in
                  bf16, which the CPU interpreter cannot test
    lossless      greedy EAGLE against plain greedy decoding on the embedded SmolLM2-135M with the shipped head,
                  in fp32 (identical outputs expected) and bf16 (every difference must sit at a near-tie)
    bench         plain decoding and EAGLE, tokens/s and tau, with the Triton kernel and with PyTorch attention
    ok            whether every check passed
Without CUDA it refuses in one line (exit status 2). `--device cpu` runs the same sections on the CPU (the
kernel in Triton's interpreter when TRITON_INTERPRET=1 is set, else its sections are skipped): a dry run that
proves the command and the report, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.errors import UserFacingError

DTYPE_NAMES = ("float32", "float16", "bfloat16")
NEAR_TIE_STEPS = 2.0     # a bf16 difference is explained when the top-2 logits are within 2 rounding steps
FP32_TIE_GAP = 1e-3      # ... and an fp32 one when they are within this many logit units
FALLBACK_PROMPTS = ("Write a Python function that returns the factorial of n, with a docstring.",
                    "Explain why the sky is blue in three sentences.",
                    "Give three tips for a first marathon.", "What is the capital of Australia, and why not Sydney?")
EngineFor = Callable[[str, str], object]  # (dtype name, attention impl) -> Engine


def environment(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "triton": _version("triton"),
            "triton_interpret": os.environ.get("TRITON_INTERPRET", "")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                 "memory_gib": round(props.total_memory / 2**30, 1), "sms": props.multi_processor_count}
    return info


def _version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def kernel_runs_here(device: torch.device) -> bool:
    """Whether the Triton kernel can run on `device`: a GPU, or the CPU under the interpreter."""
    from kernels import tree_attention as ta

    return ta.tl is not None and (device.type == "cuda" or ta._interpreting())


def self_checks(device: torch.device, dtypes=DTYPE_NAMES) -> dict:
    """`kernels.self_check.self_check` per dtype (the real kernel, uncached)."""
    from kernels.self_check import self_check

    out = {}
    for name in dtypes:
        result = self_check(device, getattr(torch, name))
        out[name] = {"ok": result.ok, "relative_error": result.error, "note": result.note}
    return out


def kernel_grid(device: torch.device, dtypes=DTYPE_NAMES, every: int = 1) -> dict:
    """The kernel against float64 over the grid in `dtypes` (`every`: every n-th case only)."""
    from kernels import cases

    grid = cases.grid(tuple(getattr(torch, n) for n in dtypes))
    chosen = range(0, len(grid), every)
    worst: dict[str, float] = {}
    failed = []
    start = time.perf_counter()
    for index in chosen:
        result = cases.run_case(grid[index], seed=index, device=device)
        dtype = str(grid[index][-1]).removeprefix("torch.")
        worst[dtype] = max(worst.get(dtype, 0.0), result.error)
        if not result.ok:
            failed.append({"case": result.case, "relative_error": result.error, "lse_error": result.lse_error})
    return {"cases": len(chosen), "failed": len(failed), "failures": failed[:20], "max_relative_error": worst,
            "tolerance": {str(k).removeprefix("torch."): v for k, v in cases.TOLERANCE.items()},
            "seconds": round(time.perf_counter() - start, 1), "ok": not failed}


def lossless(engine_for: EngineFor, prompts: list[str], tree: TreeConfig, max_new_tokens: int,
             dtypes=("float32", "bfloat16")) -> dict:
    """Greedy EAGLE against plain greedy decoding, per dtype (`eagleviz.decoding.race`): identical outputs, or a first
    difference at a near-tie of the target's two best logits (fp32: within FP32_TIE_GAP; bf16/fp16: within
    NEAR_TIE_STEPS rounding steps)."""
    from eagleviz.decoding.race import race

    out = {}
    for name in dtypes:
        engine = engine_for(name, "auto")
        rows = []
        for prompt in prompts:
            run = engine.generate(prompt, tree, SamplingConfig(max_new_tokens=max_new_tokens))
            result = race(engine, run)
            d = result.divergence
            row = {"identical": result.identical, "tokens": len(run.output), "tau": round(run.summary()["tau"], 3)}
            if d is not None:
                tie = d.gap <= FP32_TIE_GAP if name == "float32" else d.rounding_steps <= NEAR_TIE_STEPS
                row |= {"position": d.position, "top2_gap": d.gap, "rounding_steps": round(d.rounding_steps, 2),
                        "near_tie": tie}
            rows.append(row)
        out[name] = {"attn_impl": engine.attn_impl, "notes": list(engine.notes), "prompts": rows,
                     "identical": sum(r["identical"] for r in rows),
                     "ok": all(r["identical"] or r.get("near_tie", True) for r in rows)}
    return out


def bench(engine_for: EngineFor, prompts: list[str], tree: TreeConfig, max_new_tokens: int, dtype: str = "bfloat16",
          impls=("triton", "torch")) -> dict:
    """Plain decoding and EAGLE per attention implementation: median tokens/s over the prompts (after one
    warm-up run of each), mean tau, and EAGLE's speedup over plain decoding with the same attention."""
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    out = {}
    for impl in impls:
        engine = engine_for(dtype, impl)
        engine.generate(prompts[0], None, sampling)
        engine.generate(prompts[0], tree, sampling)
        plain = [engine.generate(p, None, sampling).summary() for p in prompts]
        spec = [engine.generate(p, tree, sampling).summary() for p in prompts]
        plain_tps = statistics.median(s["tokens_per_s"] for s in plain)
        spec_tps = statistics.median(s["tokens_per_s"] for s in spec)
        out[impl] = {"plain_tokens_per_s": round(plain_tps, 1), "eagle_tokens_per_s": round(spec_tps, 1),
                     "speedup": round(spec_tps / plain_tps, 3) if plain_tps else None,
                     "tau": round(statistics.mean(s["tau"] for s in spec), 3),
                     "mean_phase_ms": {k: round(statistics.mean(s["mean_phase_ms"][k] for s in spec), 3)
                                       for k in spec[0]["mean_phase_ms"]}}
    out["settings"] = {"dtype": dtype, "tree": [tree.steps, tree.topk, tree.draft_tokens],
                       "max_new_tokens": max_new_tokens, "prompts": len(prompts)}
    return out


def run_gpu_check(device: torch.device, engine_for: EngineFor, prompts: list[str], tree: TreeConfig | None = None,
                  max_new_tokens: int = 96, grid_every: int = 1, dtypes=DTYPE_NAMES, progress=print) -> dict:
    """Every section in order; a section that raises is reported with its error, and the others still run.
    The kernel's sections are skipped (None) where it cannot run; the engine runs it on CUDA only (in the
    interpreter a model's forward would take minutes)."""
    tree = tree or TreeConfig()
    kernel_here = kernel_runs_here(device)
    engine_impls = ("triton", "torch") if kernel_here and device.type == "cuda" else ("torch",)
    sections = {
        "self_check": lambda: self_checks(device, dtypes) if kernel_here else None,
        "kernel_grid": lambda: kernel_grid(device, dtypes, grid_every) if kernel_here else None,
        "lossless": lambda: lossless(engine_for, prompts, tree, max_new_tokens,
                                     [d for d in ("float32", "bfloat16") if d in dtypes]),
        "bench": lambda: bench(engine_for, prompts, tree, max_new_tokens,
                               "bfloat16" if "bfloat16" in dtypes else dtypes[0], engine_impls),
    }
    report = {"environment": environment(device), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for name, section in sections.items():
        progress(f"gpu-check: {name} ...")
        begin = time.perf_counter()
        try:
            report[name] = section()
        except Exception as exc:  # one broken section must not hide the others' results
            report[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        progress(f"gpu-check: {name} done in {time.perf_counter() - begin:.1f} s")
    report["ok"] = all(_section_ok(report[n]) for n in sections)
    return report


def _section_ok(section) -> bool:
    if section is None:  # skipped: the kernel cannot run on this device
        return True
    if "ok" in section:
        return bool(section["ok"])
    return all(_section_ok(v) for v in section.values() if isinstance(v, dict) and ("ok" in v or "error" in v))


def embedded_engines(device: str) -> EngineFor:
    """Engines on the embedded SmolLM2-135M with the shipped head: one target per dtype, loaded on first use
    and shared by the attention implementations (as the app's engine views are)."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.loading import EMBEDDED
    from eagleviz.decoding.load import load_engine

    loaded: dict[str, Engine] = {}

    def engine_for(dtype: str, impl: str) -> Engine:
        if dtype not in loaded:
            loaded.clear()  # one target resident at a time
            loaded[dtype] = load_engine(EMBEDDED, dtype=dtype, device=device, kv_dtype="model")
        return loaded[dtype].with_attention(impl)

    return engine_for


def _prompts(source: str, limit: int) -> list[str]:
    if source == "builtin":
        return list(FALLBACK_PROMPTS[:limit])
    from eagleviz.prompts import load_prompts

    return load_prompts(source, limit)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz gpu-check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    p.add_argument("--out", type=Path, default=None, help="the JSON report (default: runs/gpu-check-<time>.json)")
    p.add_argument("--quick", action="store_true", help="every 20th grid case, 2 prompts, 32 new tokens")
    p.add_argument("--prompts", default="mtbench", help="mtbench, builtin, or a prompt file")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    from eagleviz.models.loading import check_device

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserFacingError(f"gpu-check needs a CUDA GPU and none is visible to PyTorch here (torch "
                              f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); --device cpu runs "
                              "a dry run of the same sections")
    device = check_device(args.device)
    count = 2 if args.quick else args.num_prompts
    prompts = _prompts(args.prompts, count)
    report = run_gpu_check(device, embedded_engines(str(device)), prompts,
                           max_new_tokens=32 if args.quick else args.max_new_tokens,
                           grid_every=20 if args.quick else 1,
                           progress=lambda line: print(line, file=sys.stderr))
    report["command"] = " ".join(["python -m eagleviz gpu-check"] + list(argv or sys.argv[2:]))
    out = args.out or Path("runs") / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu-check: {'all checks passed' if report['ok'] else 'SOME CHECKS FAILED'}; report: {out}")
    return 0 if report["ok"] else 1
