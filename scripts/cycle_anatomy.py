"""A speculation cycle's anatomy in units of one plain decoding step, for one or more trees.

    python scripts/cycle_anatomy.py [--threads 2] [--limit 8] [--max-new-tokens 96] [--trees adaptive,5/4/16]

For each tree: the mean per cycle of the draft (and per draft level), the verification forward (and its tree
size), the acceptance, the KV rewind and the rest (the host's bookkeeping between phases: building the tree,
the trace), each divided by the mean time of one token of our plain loop measured in the same process on the
same prompts (interleaved). Also the price of the target's LM head inside a verification forward (the same
forward with and without logits), the lever of computing logit rows only where acceptance needs them.
`--by-size` also splits each tree's cycles by what was verified (the head resting, or n draft nodes): how
often, their phases' time in plain steps, the tokens they committed and the rate that gives (tokens per plain
step: below 1 such a cycle loses to the plain loop).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.prompts import load_prompts


def parse_tree(spec: str) -> TreeConfig:
    """"adaptive" (the cost-aware tree under 5/4/16), "adaptive:S/K/M", or "S/K/M" (SGLang's fixed tree), each
    optionally followed by "+lookup" (candidates from the head and prompt lookup) or "@lookup" (lookup only)."""
    shape, _, extra = spec.replace("@", "+@").partition("+")
    source = {"": "eagle", "lookup": "eagle+lookup", "@lookup": "lookup"}[extra]
    adaptive = shape.startswith("adaptive")
    knobs = shape.split(":")[1] if ":" in shape else ("5/4/16" if adaptive else shape)
    s, k, m = (int(x) for x in knobs.split("/"))
    return TreeConfig.create(s, k, m, adaptive=adaptive, source=source)


def lm_head_ms(engine, n: int, prefix: int = 200, repeats: int = 15) -> tuple[float, float]:
    """Median ms of a verification-sized forward of n tokens with every logit row, and with none."""
    t = engine.target
    cache = t.new_cache(prefix + n + 1)
    ids = torch.arange(prefix) % t.vocab_size
    t.forward(ids, torch.arange(prefix), cache, torch.ones(prefix, prefix, dtype=torch.bool).tril(), logit_rows=None)
    pos = torch.arange(n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    out = {}
    for rows in (slice(None), None):
        runs = []
        for _ in range(repeats + 1):
            cache.length = prefix
            start = time.perf_counter()
            t.forward(pos % t.vocab_size, prefix + pos, cache, mask, logit_rows=rows)
            runs.append(time.perf_counter() - start)
        out[rows is None] = statistics.median(runs[1:]) * 1e3
    return out[False], out[True]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--trees", default="adaptive,5/4/16")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--by-size", action="store_true", help="split each tree's cycles by what was verified")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine("embedded")
    trees = {spec: parse_tree(spec) for spec in args.trees.split(",")}
    prompts = load_prompts("mtbench", args.limit)
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    engine.generate(prompts[0], None, SamplingConfig(max_new_tokens=8))
    plain_ms, rows = [], {spec: [] for spec in trees}
    for prompt in prompts:
        run = engine.generate(prompt, None, sampling)
        plain_ms.append((run.wall_s * 1e3 - run.prefill_ms) / max(len(run.output) - 1, 1))
        for spec, tree in trees.items():
            rows[spec].append(engine.generate(prompt, tree, sampling))
    step = statistics.mean(plain_ms)
    print(f"plain step {step:.2f} ms ({torch.get_num_threads()} threads, {len(prompts)} prompts, "
          f"{args.max_new_tokens} new tokens, T = {args.temperature:g})")
    print("| tree | tau | tree tokens | levels | draft | per level | verify | accept | rewind | rest | cycle | "
          "speed vs plain |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for spec, runs in rows.items():
        cycles = [c for r in runs for c in r.cycles]
        n = len(cycles)
        phase = {k: sum(c.timings_ms.get(k, 0.0) for c in cycles) / n / step
                 for k in ("draft", "verify", "accept", "rewind")}
        wall = sum(r.wall_s * 1e3 - r.prefill_ms for r in runs) / n / step
        rest = wall - sum(phase.values())
        levels = statistics.mean(c.draft_levels for c in cycles)
        tau = sum(c.accept_length + 1 for c in cycles) / n
        tokens = statistics.mean(c.num_tree_tokens for c in cycles)
        per_level = f"{phase['draft'] / levels:.3f}" if levels > 0 else "-"  # lookup alone drafts no level
        print(f"| {spec} | {tau:.2f} | {tokens:.1f} | {levels:.2f} | {phase['draft']:.3f} | "
              f"{per_level} | {phase['verify']:.3f} | {phase['accept']:.3f} | "
              f"{phase['rewind']:.3f} | {rest:.3f} | {wall:.3f} | {tau / wall:.3f}x |")
    if args.by_size:
        for spec, runs in rows.items():
            by_size(spec, [c for r in runs for c in r.cycles], step)
    for n in (4, 8, 16):
        full, none = lm_head_ms(engine, n)
        print(f"verify forward of {n} tokens: {full:.2f} ms with every logit row, {none:.2f} ms without "
              f"(LM head {(full - none) / step:.3f} of a plain step)")


def by_size(spec: str, cycles, step: float) -> None:
    """One row per kind of cycle: the head resting, or n draft nodes verified."""
    groups: dict[str, list] = {}
    for c in cycles:
        kind = "head resting" if c.decision.startswith("The head rests") else f"{c.num_tree_tokens - 1} nodes"
        groups.setdefault(kind, []).append(c)
    print(f"\n{spec}, by what was verified (phases only, in plain steps):")
    print("| cycles | share | draft | verify | accept | phases | tokens | tokens per plain step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, group in sorted(groups.items(), key=lambda kv: (kv[0] != "head resting", kv[0].zfill(12))):
        ph = {k: statistics.mean(c.timings_ms.get(k, 0.0) for c in group) / step for k in ("draft", "verify", "accept")}
        total = statistics.mean(sum(c.timings_ms.values()) for c in group) / step
        tokens = statistics.mean(len(c.committed) for c in group)
        print(f"| {kind} | {len(group) / len(cycles):.0%} | {ph['draft']:.2f} | {ph['verify']:.2f} | "
              f"{ph['accept']:.2f} | {total:.2f} | {tokens:.2f} | {tokens / total:.2f} |")


if __name__ == "__main__":
    main()
