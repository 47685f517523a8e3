"""What speculation could reach on this machine: a perfect drafter's speed, and the acceptance a head would need.

    python -m eagleviz ceiling [--limit 80] [--max-new-tokens 128] [--threads 2] [--chains 1 2 3 4 6 8]
                               [--target 1.5] [--out runs/ceiling]

EAGLE's speedup over plain decoding is tau (tokens a cycle commits) over what a cycle costs in plain steps: the
draft, one verification forward of the tree, the acceptance and the bookkeeping. Greedy, per MT-bench prompt,
interleaved in an order rotated per prompt:

    plain            our plain loop; its output is the reference every other method must equal (checked)
    foresight-k      a chain of the reference's next k tokens (`eagleviz.decoding.lookup.Foresight`): each is
                     accepted and nothing is drafted, so a cycle commits k + 1 tokens for one verification of
                     k + 1 tokens and the engine's bookkeeping: the fastest a chain of k can go on this machine
    eagle-chain-k    the head drafting a chain of k (a fixed tree): the same verification plus k draft levels,
                     accepted as often as the head guesses right
    eagle            the default tree (cost-aware, head and lookup candidates)

Reported per method: tokens per second, the median of per-prompt speed ratios to plain with a 95% bootstrap
interval, tau, a cycle's decode time in plain steps (decode time per cycle over the plain loop's time per
token; prefills left out), and the tau that cycle price would need for `--target` times the plain loop
(target x price). From weight blocks on a CPU a foresight chain must be accepted whole (every cycle but a run's
last) and every output must be plain decoding's: a token whose logits moved because it was verified among
others would be rejected, so this checks batch invariance end to end too. Where the numerics depend on the
batch (dense products, CUDA) such near-tie flips are counted per method instead.
The result goes to `--out` and to where the page's "Measured speed" looks first (`eagleviz.measured`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from eagleviz.config import LIMITS, SamplingConfig, TreeConfig
from eagleviz.decoding.lookup import Foresight
from eagleviz.errors import UserFacingError
from eagleviz.measured import user_ceiling_path
from eagleviz.perf.bench import bootstrap_ci, check_knobs, common_args, machine_info, publish, run_ours, setup

CHAINS = (1, 2, 3, 4, 6, 8)
FORESIGHT, HEAD_CHAIN, DEFAULT = "foresight", "eagle-chain", "eagle"


def methods(chains, head: bool = True) -> dict[str, TreeConfig | None]:
    """Every method's tree, plain first (None); without a draft head, plain and the foresight chains only."""
    trees: dict[str, TreeConfig | None] = {"plain": None}
    trees |= {f"{FORESIGHT}-{k}": TreeConfig.create(k, 1, k + 1, adaptive=False, source="lookup") for k in chains}
    if head:
        trees |= {f"{HEAD_CHAIN}-{k}": TreeConfig.create(k, 1, k + 1, adaptive=False, source="eagle") for k in chains}
        trees[DEFAULT] = TreeConfig.create()
    return trees


def batch_invariant(engine) -> bool:
    """Whether a token's logits are the same whatever the batch it is computed in: from weight blocks on a CPU
    (`docs/performance.md` entry 24), not from dense bf16/fp32 products or on CUDA."""
    return engine.target.weights == "blocks" and engine.target.device.type == "cpu"


def measure(engine, prompts: list[str], sampling: SamplingConfig, chains=CHAINS, target: float = 1.5,
            progress=print) -> dict:
    """The table the module describes, as a dict (`rows` by method). From weight blocks on a CPU, whose products
    do not depend on the batch, an output that differs from plain decoding's or a foresight chain cut short before
    a run's last cycle is a defect: RuntimeError. Elsewhere (bf16 or fp32 dense products, CUDA) rounding in a
    larger batch can flip a near-tie: each row counts the prompts where that happened (`flipped`; a foresight
    chain stops at the first token the run no longer shares with the reference)."""
    trees = methods(chains, engine.head is not None)
    names = list(trees)
    strict = batch_invariant(engine)
    sums = {m: {"ratio": [], "tokens": 0, "seconds": 0.0, "decode_ms": 0.0, "cycles": 0, "flipped": 0} for m in names}
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        ids = engine.encode_prompt(prompt)
        reference = run_ours(engine, ids, None, sampling).tokens  # also warms the caches for this prompt
        speed = {}
        for m in names[i % len(names):] + names[:i % len(names)]:
            tree = trees[m]
            if m.startswith(FORESIGHT):
                sample = run_ours(engine, ids, tree, sampling,
                                  index_of=lambda ctx: Foresight(reference, len(ids), ctx))
            else:
                sample = run_ours(engine, ids, tree, sampling)
            s = sums[m]
            cut = m.startswith(FORESIGHT) and sample.short > 0
            if strict and sample.tokens != reference:
                raise RuntimeError(f"prompt {i}: {m}'s output differs from plain decoding's")
            if strict and cut:
                raise RuntimeError(f"prompt {i}: {m} rejected a token plain decoding chose: a row's logits moved "
                                   "with its tree")
            s["flipped"] += sample.tokens != reference or cut
            s["tokens"] += len(sample.tokens)
            s["seconds"] += sample.seconds
            s["decode_ms"] += sample.seconds * 1e3 - sample.prefill_ms
            s["cycles"] += sample.cycles if tree is not None else len(sample.tokens) - 1
            speed[m] = sample.tokens_per_s
        for m in names:
            sums[m]["ratio"].append(speed[m] / speed["plain"])
        left = (time.perf_counter() - start) / (i + 1) * (len(prompts) - i - 1)
        progress(f"[{i + 1}/{len(prompts)}] ETA {left / 60:.1f} min")
    plain_ms = sums["plain"]["decode_ms"] / max(sums["plain"]["cycles"], 1)  # per decoded token
    rows = {}
    for m in names:
        s = sums[m]
        price = s["decode_ms"] / max(s["cycles"], 1) / plain_ms
        rows[m] = {"tokens_per_s": s["tokens"] / s["seconds"], "speedup": statistics.median(s["ratio"]),
                   "ci": bootstrap_ci(s["ratio"]), "tau": (s["tokens"] - len(prompts)) / max(s["cycles"], 1),
                   "cycle_steps": price, "tau_needed": target * price, "flipped": s["flipped"]}
    return {"prompts": len(prompts), "sampling": vars(sampling), "chains": list(chains), "target": target,
            "plain_ms_per_token": plain_ms, "machine": machine_info(engine), "batch_invariant": strict, "rows": rows}


def markdown(result: dict) -> str:
    target = result["target"]
    lines = [f"| method | tokens/s | vs plain (95% interval) | tau | cycle, plain steps | tau for {target:g}x |",
             "|---|---:|---:|---:|---:|---:|"]
    for m, r in result["rows"].items():
        lo, hi = r["ci"]
        need = "" if m == "plain" else f"{r['tau_needed']:.2f}"
        lines.append(f"| {m} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) | {r['tau']:.2f} | "
                     f"{r['cycle_steps']:.2f} | {need} |")
    return "\n".join(lines)


def ceiling_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz ceiling", description=__doc__.splitlines()[0])
    common_args(p)
    p.add_argument("--chains", type=int, nargs="+", default=list(CHAINS), help="chain lengths k to measure")
    p.add_argument("--target", type=float, default=1.5, help="the speedup whose tau the table reports")
    p.add_argument("--out", type=Path, default=Path("runs/ceiling"))
    args = p.parse_args(argv)
    if args.temperature != 0:
        raise UserFacingError("the ceiling is measured greedily (--temperature 0): a sampled run accepts a known "
                              "token only as often as the target would draw it, so foresight is no perfect drafter "
                              "there")
    low, high = LIMITS["steps"]
    if not all(low <= k <= high for k in args.chains) or args.target <= 0:
        raise UserFacingError(f"--chains must be lengths from {low} to {high} (a chain drafts one token a step) and "
                              "--target a positive speedup")
    sampling, _ = check_knobs(args)
    engine, prompts = setup(args)
    try:
        result = measure(engine, prompts, sampling, sorted(set(args.chains)), args.target)
    except RuntimeError as exc:
        raise UserFacingError(str(exc)) from exc
    result["command"] = "python -m eagleviz ceiling " + " ".join(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "ceiling-T0.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (args.out / "ceiling-T0.md").write_text(table + "\n")
    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens, T = 0, "
          f"{result['machine']['threads']} threads; plain {result['plain_ms_per_token']:.2f} ms a token\n\n{table}")
    print(f"wrote {out}; {publish(result, args.publish, user_ceiling_path())}")
    return 0
