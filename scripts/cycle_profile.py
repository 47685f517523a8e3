"""Where a speculative run's time goes outside the target's forward: cProfile over the default tree.

    python scripts/cycle_profile.py --prompts 6 --temperature 1 --tokens 128 --threads 2
    python scripts/cycle_profile.py --decode static --no-ledger --temperature 0   # the CUDA path's host work

Runs the first --prompts MT-bench first turns through the default (cost-aware) EAGLE tree after two untimed
runs, and prints the engine's functions by cumulative time, with the number of cycles and how many drafted.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.perf.bench import run_ours
from eagleviz.prompts import mtbench_first_turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode", choices=("eager", "static"), default="eager",
                   help="static: the CUDA path's steps and drafting, uncaptured (what a GPU's host runs)")
    p.add_argument("--no-ledger", action="store_true", help="judge the head by the forecast alone (no clock)")
    p.add_argument("--top", type=int, default=40, help="how many functions to print")
    p.add_argument("--sort", choices=("cumtime", "tottime"), default="cumtime",
                   help="tottime: by each function's own time (what a cycle's Python spends where)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine().with_decode(args.decode) if args.decode != "eager" else load_engine()
    engine.ledger = not args.no_ledger
    sampling = SamplingConfig(max_new_tokens=args.tokens, temperature=args.temperature)
    prompts, tree = mtbench_first_turns(args.prompts), TreeConfig.create()
    for prompt in prompts[:2]:  # untimed: first-call costs
        run_ours(engine, engine.encode_prompt(prompt), tree, sampling)
    profile, cycles, drafted = cProfile.Profile(), 0, 0
    for prompt in prompts:
        ids = engine.encode_prompt(prompt)
        profile.enable()
        run = engine.new_run(prompt, ids, tree, sampling)
        for cycle in engine.speculate(ids, tree, sampling, run):
            pass
        profile.disable()
        cycles += len(run.cycles)
        drafted += sum(c.draft_levels > 0 for c in run.cycles)
    print(f"{cycles} cycles, {drafted} drafted ({drafted / max(cycles, 1):.1%})")
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
