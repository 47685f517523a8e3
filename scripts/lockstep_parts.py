"""Where the default's time goes beside plain decoding's, in `bench --lockstep` as it runs: each arm's ms a token
and the microseconds a token spent in the engine's host calls, timed around each call.

    OMP_WAIT_POLICY=ACTIVE python scripts/lockstep_parts.py --temperature 1 --limit 10

Plain decoding and the default run each prompt in lockstep (`bench.run_lockstep`, the first arm swapped from one
prompt to the next; MT-bench prompts, 128 tokens, 2 threads). Around each of the calls below a timer adds what the
call took to the arm that was stepping; the forward of one token is also listed as its median (the prefill left
out). A timer costs about a microsecond a call: compare the arms, not the absolute figures of the small calls.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding import costs, engine, lookup, policy
from eagleviz.decoding.load import load_engine
from eagleviz.models import host, static
from eagleviz.perf import bench
from eagleviz.prompts import mtbench_first_turns

CALLS = [(static.EagerSteps, "forward"), (engine.Engine, "_read_out"), (engine.Engine, "_rest_trace"),
         (engine.Engine, "_emit"), (lookup.SuffixIndex, "extend"), (lookup.SuffixIndex, "match"),
         (policy.Ledger, "observe"), (costs.RunCosts, "rest"), (host.PhaseClock, "lap"), (host.PhaseClock, "read"),
         (policy.HeadRest, "head_runs"), (policy.HeadRest, "note")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    spent: dict[tuple[str, str], float] = {}
    one_token: dict[str, list[float]] = {"plain": [], "eagle-tree": []}
    arm = ["plain"]

    def timed(owner, name):
        call = owner.__dict__[name]
        wrapped = call.__func__ if isinstance(call, staticmethod) else call

        @functools.wraps(wrapped)
        def timer(*a, **k):
            t = time.perf_counter()
            try:
                return wrapped(*a, **k)
            finally:
                took = time.perf_counter() - t
                spent[arm[0], name] = spent.get((arm[0], name), 0.0) + took
                if name == "forward" and len(a[1]) == 1:
                    one_token[arm[0]].append(took)

        setattr(owner, name, staticmethod(timer) if isinstance(call, staticmethod) else timer)

    for owner, name in CALLS:
        timed(owner, name)
    start_ours = bench.start_ours

    def started(eng, ids, tree, *a, **k):  # each step of a run marks its arm as the one stepping
        run, steps = start_ours(eng, ids, tree, *a, **k)
        name = "plain" if tree is None else "eagle-tree"

        def marked():
            arm[0] = name
            for item in steps:
                yield item
                arm[0] = name

        return run, marked()

    bench.start_ours = started
    eng = load_engine()
    tree, sampling = TreeConfig.create(), SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    ids = [eng.encode_prompt(text) for text in mtbench_first_turns(args.limit)]
    bench.run_lockstep(eng, ("plain", "eagle-tree"), ids[0], SamplingConfig(max_new_tokens=8), tree)  # warm-up
    spent.clear()
    for times in one_token.values():
        times.clear()
    seconds, tokens = dict.fromkeys(one_token, 0.0), dict.fromkeys(one_token, 0)
    for i, prompt in enumerate(ids):
        order = ("plain", "eagle-tree") if i % 2 == 0 else ("eagle-tree", "plain")
        for m, sample in bench.run_lockstep(eng, order, prompt, sampling, tree).items():
            seconds[m] += sample.seconds
            tokens[m] += len(sample.tokens)
    for m in seconds:
        print(f"{m}: {seconds[m] * 1e3 / tokens[m]:.3f} ms a token (prefill included), one token's forward "
              f"{statistics.median(one_token[m]) * 1e3:.3f} ms (median of {len(one_token[m])})")
        for (who, name), s in sorted(spent.items()):
            if who == m:
                print(f"    {name:12s} {s * 1e6 / tokens[m]:9.1f} us a token")
    print(f"{args.limit} MT-bench prompts x {args.max_new_tokens} tokens, T = {args.temperature:g}, lockstep")


if __name__ == "__main__":
    main()
