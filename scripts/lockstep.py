"""Plain decoding and the default in lockstep: one step of each in turn, each step timed, so both see the
machine as it is at that moment.

    OMP_WAIT_POLICY=ACTIVE python scripts/lockstep.py --temperature 1 --limit 16
    EAGLEVIZ_CPU=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        OMP_WAIT_POLICY=ACTIVE python scripts/lockstep.py --temperature 0 --limit 16

`bench` runs each prompt whole with one method, then the other: on a machine whose speed drifts by tens of
percent within minutes, a prompt's two runs meet different machines. Here both runs are generators over the
same engine and prompt; the script advances whichever has written fewer tokens (`bench.run_lockstep`; equals:
the first arm, swapped from one prompt to the next) and adds up the time each spends inside its own steps (the
prefill included). The ratio a prompt gives is the default's tokens per second over plain decoding's. A stretch
of resting cycles runs its plain steps before yielding their traces: its time lands on its first cycle (so the
"first" kind below also holds a sampled run's opening stretch), and the kinds' ms a cycle are averages.

Prints each prompt's ratio, their median with its 95% bootstrap interval (prompts resampled), the pooled
ratio, and the default's cycles by kind (its first, which holds the prefill; then the root alone, lookup
candidates without the head, the head drafted) with their ms a cycle and a token beside plain decoding's ms a
token after its prefill. Greedy, it checks that both
wrote the same tokens. `--out FILE` writes it all as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.perf.bench import bootstrap_ci, run_lockstep
from eagleviz.prompts import mtbench_first_turns


def kind(cycle) -> str:
    return "drafted" if cycle.draft_levels > 0 else "alone" if len(cycle.tokens) == 1 else "lookup"


def lockstep(engine, ids: list[int], tree: TreeConfig, sampling: SamplingConfig, plain_first: bool,
             kinds: dict[str, list]) -> dict:
    """One prompt both ways (`bench.run_lockstep`). Returns each side's seconds, tokens and first step's
    seconds (it holds the prefill); adds the default's cycles to `kinds` (kind -> [cycles, seconds, tokens]),
    its first cycle a kind of its own."""
    first: dict[str, float] = {}

    def step(method: str, item, took: float) -> None:
        opening = method not in first
        first.setdefault(method, took)
        if method == "eagle-tree":
            entry = kinds.setdefault("first" if opening else kind(item), [0, 0.0, 0])
            entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + took, entry[2] + len(item.committed)

    order = ("plain", "eagle-tree") if plain_first else ("eagle-tree", "plain")
    got = run_lockstep(engine, order, ids, sampling, tree, on_step=step)
    return {side: {"seconds": got[m].seconds, "tokens": got[m].tokens, "first": first[m]}
            for side, m in (("plain", "plain"), ("default", "eagle-tree"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine()
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    tree = TreeConfig.create()
    prompts = mtbench_first_turns(args.limit)
    engine.generate(prompts[0], tree, SamplingConfig(max_new_tokens=8))  # a process's first run pays more
    kinds: dict[str, list] = {}
    ratios, rows, same = [], [], True
    total = {"plain": [0.0, 0], "default": [0.0, 0]}
    steps_after = [0.0, 0]  # plain decoding after its prefill: the price of a plain step here
    for i, prompt in enumerate(prompts):
        got = lockstep(engine, engine.encode_prompt(prompt), tree, sampling, i % 2 == 0, kinds)
        speed = {side: len(r["tokens"]) / r["seconds"] for side, r in got.items()}
        ratios.append(speed["default"] / speed["plain"])
        for side, r in got.items():
            total[side][0] += r["seconds"]
            total[side][1] += len(r["tokens"])
        steps_after[0] += got["plain"]["seconds"] - got["plain"]["first"]
        steps_after[1] += len(got["plain"]["tokens"]) - 1
        equal = got["plain"]["tokens"] == got["default"]["tokens"]
        same = same and (equal or not sampling.greedy)
        rows.append({"prompt": prompt[:40], "plain_tok_s": speed["plain"], "default_tok_s": speed["default"],
                     "ratio": ratios[-1]})
        print(f"{i:3d} plain {1e3 / speed['plain']:6.2f} ms a token, the default {1e3 / speed['default']:6.2f}: "
              f"{ratios[-1]:.3f}" + ("" if equal or not sampling.greedy else "  (other tokens)"), flush=True)
    plain_ms = steps_after[0] / steps_after[1] * 1e3
    pooled = (total["default"][1] / total["default"][0]) / (total["plain"][1] / total["plain"][0])
    interval = bootstrap_ci(ratios)
    print(f"the default over plain decoding: median {statistics.median(ratios):.3f} "
          f"(95% interval {interval[0]:.3f}-{interval[1]:.3f}) over {len(ratios)} prompts, pooled {pooled:.3f}"
          + ("" if not sampling.greedy else "; the same tokens" if same else "; OTHER TOKENS"))
    split = {}
    cycles = sum(n for n, _, _ in kinds.values())
    for k, (n, s, t) in sorted(kinds.items()):
        split[k] = {"share": n / cycles, "ms_a_cycle": s / n * 1e3, "tokens_a_cycle": t / n, "ms_a_token": s / t * 1e3}
        print(f"{k:8s} {n / cycles:6.1%} of cycles  {s / n * 1e3:6.2f} ms a cycle  {t / n:4.2f} tokens  "
              f"{s / t * 1e3:6.2f} ms a token (plain decoding's steps after its prefill {plain_ms:.2f})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": "python scripts/lockstep.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                 vars(args).items() if k != "out" and v is not None),
            "machine": platform.processor() or platform.machine(), "temperature": args.temperature,
            "median": statistics.median(ratios), "ci95": interval, "pooled": pooled, "same_tokens": same,
            "plain_ms_a_token": plain_ms, "kinds": split, "per_prompt": rows}, indent=1))


if __name__ == "__main__":
    main()
