"""A run whose head always rests against plain decoding, on the real forward: what a resting cycle costs.

    OMP_WAIT_POLICY=ACTIVE python scripts/resting_vs_plain.py --temperature 1 --limit 10

The head is held resting (`HeadRest.head_runs` False) and lookups left out (`--source eagle`), so every cycle of
the speculative run verifies the root alone. Each prompt runs both ways, `--rounds` times, the order swapped
every round. Prints each side's ms a token after the prefill, the part of it spent in the target's forwards,
and the median over prompts and rounds of the resting run's tokens per second over plain decoding's. `--as-decided
--source eagle+lookup`: the default as its policy runs it, whole runs against whole runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding import policy
from eagleviz.decoding.load import load_engine
from eagleviz.models import static
from eagleviz.prompts import mtbench_first_turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--source", default="eagle")
    p.add_argument("--as-decided", action="store_true",
                   help="the default as its policy runs it (the head not held resting): whole runs of the default")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine()
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    forward_s, side = {"plain": 0.0, "resting": 0.0}, ["plain"]
    forward = static.EagerSteps.forward

    def timed(self, *a, **k):
        t = time.perf_counter()
        out = forward(self, *a, **k)
        forward_s[side[0]] += time.perf_counter() - t
        return out

    static.EagerSteps.forward = timed
    if not args.as_decided:
        policy.HeadRest.head_runs = lambda self: False
    spent, tokens, ratios = {"plain": 0.0, "resting": 0.0}, {"plain": 0, "resting": 0}, []
    for r in range(args.rounds):
        for prompt in mtbench_first_turns(args.limit):
            speed = {}
            for kind in ("plain", "resting") if r % 2 == 0 else ("resting", "plain"):
                side[0] = kind
                run = engine.generate(prompt, None if kind == "plain" else TreeConfig.create(source=args.source),
                                      sampling)
                s, n = run.wall_s - run.prefill_ms / 1e3, len(run.output) - 1
                spent[kind] += s
                tokens[kind] += n
                speed[kind] = n / s
            ratios.append(speed["resting"] / speed["plain"])
    for kind in spent:
        print(f"{kind}: {spent[kind] * 1e3 / tokens[kind]:.3f} ms a token, forwards "
              f"{forward_s[kind] * 1e3 / tokens[kind]:.3f}")
    print(f"resting over plain, the median per prompt: {statistics.median(ratios):.3f}x "
          f"({args.limit} prompts x {args.rounds} rounds, T = {args.temperature:g})")


if __name__ == "__main__":
    main()
