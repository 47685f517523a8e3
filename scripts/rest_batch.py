"""Resting cycles one at a time against resting cycles in stretches, each beside plain decoding, in lockstep.

    OMP_WAIT_POLICY=ACTIVE python scripts/rest_batch.py --temperature 1 --limit 20

Three runs of each prompt over one engine: plain decoding, the default with its resting cycles in stretches of
`engine.REST_BATCH` (16) and the default with stretches of 1 (`speculate`'s rest_batch: one cycle at a time, as
before stretches). Whichever has written the fewest tokens takes the next step (equals: the first arm, rotated
from one prompt to the next), so all three meet the machine at the same point of the text; each step is timed.
Prints the median over prompts of each default's tokens per second over plain decoding's, and of the stretches'
over one at a time, with 95% bootstrap intervals.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import REST_BATCH
from eagleviz.decoding.load import load_engine
from eagleviz.perf.bench import bootstrap_ci
from eagleviz.prompts import mtbench_first_turns

ARMS = {"plain": None, "stretches": REST_BATCH, "one at a time": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine, tree = load_engine(), TreeConfig()
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    ratios: dict[str, list[float]] = {"stretches": [], "one at a time": [], "stretches / one at a time": []}
    for i, prompt in enumerate(mtbench_first_turns(args.limit)):
        ids = engine.encode_prompt(prompt)
        runs = {a: engine.new_run(prompt, ids, None if b is None else tree, sampling) for a, b in ARMS.items()}
        steps = {a: engine.plain(ids, sampling, runs[a]) if b is None else
                 engine.speculate(ids, tree, sampling, runs[a], rest_batch=b) for a, b in ARMS.items()}
        seconds = dict.fromkeys(ARMS, 0.0)
        live = list(ARMS)[i % 3:] + list(ARMS)[:i % 3]
        while live:
            arm = min(live, key=lambda a: len(runs[a].output))
            start = time.perf_counter()
            try:
                next(steps[arm])
            except StopIteration:
                live.remove(arm)
            seconds[arm] += time.perf_counter() - start
        rate = {a: len(runs[a].output) / seconds[a] for a in ARMS}
        ratios["stretches"].append(rate["stretches"] / rate["plain"])
        ratios["one at a time"].append(rate["one at a time"] / rate["plain"])
        ratios["stretches / one at a time"].append(rate["stretches"] / rate["one at a time"])
        print(f"{i:3d} " + "  ".join(f"{k} {v[-1]:.3f}" for k, v in ratios.items()), flush=True)
    for name, values in ratios.items():
        low, high = bootstrap_ci(values)
        print(f"{name}: median {statistics.median(values):.3f} (95% interval {low:.3f}-{high:.3f}) over "
              f"{len(values)} prompts")


if __name__ == "__main__":
    main()
