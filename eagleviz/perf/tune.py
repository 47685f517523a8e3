"""`python -m eagleviz tune`: the verification cost curve cost(n) / cost(1) on this machine (why verifying 16
tokens costs about as much as 1), then a sweep of steps x topk x draft_tokens on a few prompts, interleaved
with our plain loop; the fastest tree is saved for this machine (the app's default; `eagleviz.measured` is its
one reader). `tune --temperature T` (T > 0) saves the fastest tree when sampling, which `bench --temperature T`
runs as eagle-tuned. `tune --curve-only` measures just the curve and writes it to --out (default
<cache>/verify-cost.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.costs import SIZES, forward_ms, load_or_measure
from eagleviz.measured import tuned_name, user_verify_cost_path
from eagleviz.paths import cache_dir
from eagleviz.perf.bench import Sample, check_knobs, common_args, machine_info, run_ours, setup


def tuned_path(temperature: float = 0.0) -> Path:
    """Where `tune` at this temperature saves its result."""
    return cache_dir() / tuned_name(temperature)


def verify_cost_curve(engine, prefix: int = 200, sizes=SIZES, repeats: int = 7) -> dict:
    """Median time of one target forward of n chain tokens after a `prefix`-token prompt, relative to n = 1."""
    times = forward_ms(engine, prefix, sizes, repeats)
    return {"prefix": prefix, "ms": times, "relative": {n: t / times[sizes[0]] for n, t in times.items()}}

def write_curve(engine, out: Path, prefix: int = 200, command: str = "") -> dict:
    """Measure only the verification cost curve and write it, with the machine, as JSON to `out` (the shape
    `eagleviz.measured.latest_verify_cost` reads: {"verify_cost", "machine", "command"})."""
    result = {"verify_cost": verify_cost_curve(engine, prefix), "machine": machine_info(engine), "command": command}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result


def tune_grid() -> list[TreeConfig]:
    grid = []
    for steps in (3, 4, 5, 6, 8):
        for topk in (1, 2, 4, 8):
            budgets = [steps + 1] if topk == 1 else [8, 16, 24, 32, 48]
            for m in budgets:
                cfg = TreeConfig.create(steps, topk, m, adaptive=False)
                if not cfg.adjustments and cfg not in grid:
                    grid.append(cfg)
    return grid





def tune(engine, prompts: list[str], sampling: SamplingConfig, prefix: int = 200, progress=print,
         grid: list[TreeConfig] | None = None) -> dict:
    """The verification cost curve, then every tree of `grid` (default `tune_grid()`) on every prompt,
    interleaved like `bench`: per prompt, our plain loop and each tree once, in an order rotated from prompt
    to prompt, so that a machine drifting during the sweep slows every configuration alike. A tree's score is
    its median per-prompt speedup over the plain loop; the best score wins."""
    curve = verify_cost_curve(engine, prefix)
    grid = grid or tune_grid()
    encoded = [engine.encode_prompt(p) for p in prompts]
    runs: list[TreeConfig | None] = [None, *grid]
    samples: dict[int, list[Sample]] = {i: [] for i in range(len(runs))}
    start, done, total = time.perf_counter(), 0, len(runs) * len(encoded)
    for p, ids in enumerate(encoded):
        shift = p * len(runs) // max(len(encoded), 1)
        for i in [(j + shift) % len(runs) for j in range(len(runs))]:
            samples[i].append(run_ours(engine, ids, runs[i], sampling))
            done += 1
        eta = (time.perf_counter() - start) / done * (total - done)
        progress(f"[tune] prompt {p + 1}/{len(encoded)}: {len(runs)} runs  ETA {eta:4.0f} s")
    plain = samples[0]
    results = []
    for i, cfg in enumerate(grid, start=1):
        mine = samples[i]
        results.append({"steps": cfg.steps, "topk": cfg.topk, "draft_tokens": cfg.draft_tokens,
                        "speedup_vs_plain": statistics.median(m.tokens_per_s / max(q.tokens_per_s, 1e-9)
                                                              for m, q in zip(mine, plain)),
                        "tokens_per_s": sum(len(m.tokens) for m in mine) / sum(m.seconds for m in mine),
                        "tau": statistics.mean(m.tau for m in mine)})
    results.sort(key=lambda r: r["speedup_vs_plain"], reverse=True)
    for r in results[:5]:
        progress(f"[tune] steps={r['steps']} topk={r['topk']} draft_tokens={r['draft_tokens']}: "
                 f"{r['speedup_vs_plain']:.3f}x plain, {r['tokens_per_s']:.1f} tok/s, tau {r['tau']:.2f}")
    best = results[0]
    return {"verify_cost": curve, "grid": results, "interleaved": True,
            "plain_tokens_per_s": sum(len(q.tokens) for q in plain) / sum(q.seconds for q in plain),
            "best": {k: best[k] for k in ("steps", "topk", "draft_tokens")}, "machine": machine_info(engine)}


def _print_curve(curve: dict) -> None:
    print("verify cost cost(n)/cost(1): " + ", ".join(f"n={n}: {r:.2f}" for n, r in curve["relative"].items()))


def tune_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz tune", description="fastest tree on this machine")
    common_args(p)
    p.set_defaults(limit=4, max_new_tokens=64)
    p.add_argument("--no-save", action="store_true",
                   help=f"do not save the best configuration to {tuned_path()} (with --temperature T > 0, to "
                        f"{tuned_path().with_name('tuned-T{T}.json')}: the tree `bench` runs as eagle-tuned at T)")
    p.add_argument("--curve-only", action="store_true",
                   help="only measure the verification cost curve and write it to --out (no sweep, no tuned tree)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"with --curve-only: the JSON file to write (default {user_verify_cost_path()})")
    p.add_argument("--prefix", type=int, default=200, help="prompt tokens before the n verified ones")
    p.add_argument("--costs", action="store_true",
                   help="only measure afresh the price list the cost-aware tree uses here (verify(n), a draft level, "
                        "a cycle's overhead, a resting cycle, the last two at T = 0 and T = 1, in plain steps) and "
                        "keep it for this model, dtype and thread count")
    args = p.parse_args(argv)
    if args.out is not None and not args.curve_only:
        p.error("--out goes with --curve-only")
    sampling, _ = check_knobs(args)
    engine, prompts = setup(args, with_prompts=not (args.curve_only or args.costs))
    if args.costs:
        start = time.perf_counter()
        costs = load_or_measure(engine, fresh=True)
        sampled = costs.at(1.0)
        print(f"measured in {time.perf_counter() - start:.1f} s")
        print("verify(n) in plain steps: " + ", ".join(f"n={n}: {c:.2f}" for n, c in costs.verify)
              + f"; a drafting cycle's fixed part {costs.draft_fixed:.3f}, a draft level {costs.draft_level:.3f}, "
              f"a cycle's overhead {costs.overhead:.3f}, a resting cycle {costs.rest_cost():.3f}; at T > 0 "
              f"the overhead {sampled.overhead:.3f}, a resting cycle {sampled.rest_cost():.3f}; {costs.source}")
        return 0
    if args.curve_only:
        out = args.out or user_verify_cost_path()
        result = write_curve(engine, out, args.prefix, "python -m eagleviz tune " + " ".join(argv))
        _print_curve(result["verify_cost"])
        print(f"wrote {out}")
        return 0
    result = tune(engine, prompts, sampling, args.prefix)
    _print_curve(result["verify_cost"])
    print(f"fastest: {result['best']}")
    best = result["grid"][0]["speedup_vs_plain"] if result["grid"] else 1.0
    if best < 1.0:
        print(f"note: no tree beat plain decoding here (the fastest ran at {best:.2f}x plain): at these settings, "
              "speculation costs this machine more than it saves (the fastest tree is saved all the same, "
              "for `bench` to show)")
    if not args.no_save:
        path = tuned_path(args.temperature)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(result, sampling=vars(sampling)), indent=2))
        use = ("the app's default on this machine" if args.temperature == 0
               else f"`bench`'s eagle-tuned at T = {args.temperature:g}")
        print(f"saved to {path} ({use})")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(tune_main(sys.argv[1:]))
