"""What a decode asks of the device, counted: per plain token and per drafted cycle, the graph replays, the
stream, event and device waits, the copies and the eager kernel launches that torch's profiler records, the
synchronising operations torch's sync debug mode reports (the calls that make the host wait without saying so),
and the wall milliseconds a token or a drafted cycle takes, a tree's cycle decided on the device and on the host
(`Engine.with_device_cycle`), interleaved. A run's first step (its prefill) is left out of every count. The
cost-aware tree ("default": the app's, without the context's lookups) runs without its clock's books
(`Engine.with_ledger`), so its head drafts every cycle.

    python -m eagleviz.perf.cycle_counts --model BUNDLE --device cuda --out counts.json

Every graph is captured before the counted runs (`Engine.prepare`), and each tree runs once uncounted first. On
a CPU the runtime calls are absent and only the operations are counted (a dry run of the command)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from eagleviz.config import SamplingConfig, TreeConfig, kv_slots
from eagleviz.perf.provenance import provenance

PROMPT = "Write a Python function that returns the factorial of n, with a docstring."
RUNTIME = {"graph_launches": ("cudaGraphLaunch",),
           "stream_syncs": ("cudaStreamSynchronize",),
           "event_syncs": ("cudaEventSynchronize",),
           "device_syncs": ("cudaDeviceSynchronize",),
           "copies": ("cudaMemcpyAsync", "cudaMemcpy"),
           "kernel_launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")}


def steps_of(engine, prompt: str, tree: TreeConfig | None, sampling: SamplingConfig):
    """A run's steps as the engine yields them (plain: tokens; a tree: cycles) and its trace."""
    ids = engine.encode_prompt(prompt)
    run = engine.new_run(prompt, ids, tree, sampling, True)
    return (engine.plain(ids, sampling, run) if tree is None else engine.speculate(ids, tree, sampling, run)), run


def units(run, tree: TreeConfig | None, skipped: int) -> int:
    """What a run did after its first `skipped` steps: tokens (plain) or drafted cycles."""
    if tree is None:
        return len(run.output) - skipped
    return sum(c.draft_levels > 0 for c in run.cycles[skipped:])


def after_first(engine, prompt: str, tree: TreeConfig | None, sampling: SamplingConfig, around) -> tuple:
    """One run with its first step (the prefill and the first token or cycle) outside `around` (a context manager
    factory): (the run, the units inside, the seconds inside)."""
    steps, run = steps_of(engine, prompt, tree, sampling)
    next(steps)
    sync(engine)
    with around() as box:
        begin = time.perf_counter()
        for _ in steps:
            pass
        sync(engine)
        seconds = time.perf_counter() - begin
    return run, units(run, tree, 1), seconds, box


def sync(engine) -> None:
    if engine.target.device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def profiled(cuda: bool):
    """torch's profiler around the block; yields a dict that holds the calls counted by `RUNTIME`'s names and the
    kernels' table (by device time) once the block is over."""
    from torch.profiler import ProfilerActivity, profile

    box: dict = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield box
    seen = collections.Counter()
    for event in prof.key_averages():
        seen[event.key] += event.count
    box["calls"] = {k: sum(seen[n] for n in names) for k, names in RUNTIME.items()}
    box["table"] = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=40)


@contextlib.contextmanager
def sync_warnings(cuda: bool):
    """torch's sync debug mode warning around the block; yields a dict that holds the synchronising operations it
    reported and their distinct messages' first lines (none on a CPU, where the mode sees nothing)."""
    box: dict = {"count": 0, "messages": []}
    if not cuda:
        yield box
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode("default")
    lines = [str(w.message).splitlines()[0] for w in caught if "synchronizing CUDA operation" in str(w.message)]
    box["count"], box["messages"] = len(lines), sorted(set(lines))


def counts(engine, prompt: str, tree: TreeConfig | None, max_new_tokens: int, repeats: int = 3) -> dict:
    """One tree's counts (None: plain decoding), its first step left out: per token (plain) or per drafted cycle,
    the runtime calls and sync warnings, and the wall milliseconds (median of `repeats` runs, each arm's runs
    interleaved: for a tree, the device cycle and the host's, `Engine.with_device_cycle`)."""
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    cuda = engine.target.device.type == "cuda"
    if tree is not None and tree.adaptive:
        engine = engine.with_ledger(False)
    engine.prepare(kv_slots(len(engine.encode_prompt(prompt)), max_new_tokens, tree), tree)
    arms = ({"device": engine} if tree is None else
            {"device": engine.with_device_cycle(True), "host": engine.with_device_cycle(False)})
    for arm in arms.values():
        arm.generate(prompt, tree, sampling)
    run, n, _, prof = after_first(arms["device"], prompt, tree, sampling, lambda: profiled(cuda))
    _, m, _, syncs = after_first(arms["device"], prompt, tree, sampling, lambda: sync_warnings(cuda))
    ms = {name: [] for name in arms}
    taus = {name: [] for name in arms}
    for _ in range(repeats):
        for name, arm in arms.items():
            r, k, seconds, _ = after_first(arm, prompt, tree, sampling, contextlib.nullcontext)
            ms[name].append(seconds * 1e3 / max(k, 1))
            taus[name].append(statistics.mean(len(c.committed) for c in r.cycles) if r.cycles else 1.0)
    unit = max(n, 1)
    out = {"decode": run.decode, "notes": list(run.notes), "tokens": len(run.output), "cycles": len(run.cycles),
           "per": "token" if tree is None else "drafted cycle", "units": n,
           "each": {k: round(v / unit, 2) for k, v in prof["calls"].items()}
           | {"sync_warnings": round(syncs["count"] / max(m, 1), 2)},
           "sync_messages": syncs["messages"],
           "ms": {name: round(statistics.median(v), 3) for name, v in ms.items()},
           "tau": {name: round(statistics.median(v), 3) for name, v in taus.items()}}
    return out, prof["table"]


TREES = {"plain": None,
         "fixed-6-8-64": TreeConfig.create(steps=6, topk=8, draft_tokens=64, adaptive=False),
         "fixed-5-4-16": TreeConfig.create(adaptive=False),
         "default": TreeConfig.create(source="eagle")}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eagleviz.perf.cycle_counts", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="a model directory, a bundle, or 'embedded'")
    p.add_argument("--head", default=None, help="the draft head (default: the model's own)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each arm (median)")
    p.add_argument("--trees", default=",".join(TREES), help=f"comma-separated, of {', '.join(TREES)}")
    p.add_argument("--out", type=Path, default=None, help="the report as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    from eagleviz.decoding.load import load_engine

    args = _parser().parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    engine = load_engine(args.model, args.head, dtype=dtype, device=args.device)
    settings = vars(args) | {"dtype": dtype, "out": None if args.out is None else str(args.out)}
    command = "python -m eagleviz.perf.cycle_counts " + " ".join(sys.argv[1:] if argv is None else argv)
    report = {"provenance": provenance(engine.target.device), "settings": settings, "command": command.strip()}
    for name in args.trees.split(","):
        try:
            report[name], table = counts(engine, args.prompt, TREES[name], args.max_new_tokens, args.repeats)
            if args.out:
                args.out.with_name(f"{args.out.stem}-{name}-kernels.txt").write_text(table)
        except Exception as exc:  # one tree's failure must not hide the others'
            report[name] = {"error": f"{exc.__class__.__name__}: {exc}"}
        print(name, json.dumps({k: report[name][k] for k in ("each", "ms", "tau")} if "each" in report[name]
                               else report[name]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
