"""Plain decoding, plain decoding again, and the default in lockstep: how far apart two identical arms land beside
how far the default lands from plain decoding, and which of the default's sources costs what.

    OMP_WAIT_POLICY=ACTIVE python scripts/lockstep_arms.py --temperature 0 --limit 40 \
        --arms plain,control,default,head-only

Arms: "plain" (plain decoding, the reference), "control" (plain decoding again: the spread of a ratio that should
be 1), "default" (the default tree: the head and the context's lookups, as `bench --lockstep` runs it), "head-only"
(the default without the lookups, `--draft-source eagle`; on a CPU whose price list says the head's average
guess does not pay, a run of resting cycles at any temperature), "lookup-only" (`--draft-source lookup`),
"stretch-N" (the default with resting cycles in stretches of at most N, `Engine.speculate`'s rest_batch; the
default's is 16), "unkept" (head-only with each resting cycle's features row dropped rather than kept for the
head: valid only where the head never drafts in the run, to time what keeping them costs), and two arms of plain
decoding with one of the two ways the default's one-token forward call differs from plain decoding's:
"plain-features" (each step also captures the head's features, as the default's steps do) and "plain-slack" (a
cache of the default's capacity: one tree's slots more).
Each prompt's arms step in lockstep as `bench.run_lockstep` steps two (whichever has written the fewest tokens
steps next), the order rotated from one prompt to the next; MT-bench prompts, 128 tokens, 2 threads. Printed per
arm: ms a token (prefill included), the median one-token forward, the median over prompts of plain's time over the
arm's (as `bench` reports speed: above 1 is faster), and the same two for the prefill alone (`RunTrace.prefill_ms`:
from the run's start, its caches' allocation included, to its first token) and for the rest of the run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding import engine
from eagleviz.decoding.load import load_engine
from eagleviz.models import static
from eagleviz.prompts import mtbench_first_turns

SOURCES = {"plain": None, "control": None, "default": "eagle+lookup", "head-only": "eagle", "lookup-only": "lookup",
           "unkept": "eagle", "plain-features": None, "plain-slack": None}


def source(arm: str) -> str | None:
    return "eagle+lookup" if arm.startswith("stretch-") else SOURCES[arm]


KEPT = engine.RestStep


def unkept(*fields) -> KEPT:
    """A resting step's row without its features (the head's input, kept until it next drafts)."""
    return KEPT(*fields[:8], None, *fields[9:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arms", default="plain,control,default,head-only")
    args = p.parse_args()
    arms = args.arms.split(",")
    stretch = {a: int(a.removeprefix("stretch-")) for a in arms if a.startswith("stretch-")
               and a.removeprefix("stretch-").isdigit() and int(a.removeprefix("stretch-")) > 0}
    if arms[0] != "plain" or any(a not in SOURCES and a not in stretch for a in arms):
        p.error(f"arms: plain first, then any of {', '.join(SOURCES)}, stretch-N")
    torch.set_num_threads(args.threads)
    stepping, forwards = [arms[0]], {a: [] for a in arms}
    forward = static.EagerSteps.forward

    def timed(self, tokens, positions, mask):
        start = time.perf_counter()
        out = forward(self, tokens, positions, mask)
        if len(tokens) == 1:
            forwards[stepping[0]].append(time.perf_counter() - start)
        return out

    static.EagerSteps.forward = timed
    eng = load_engine()
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    trees = {a: None if source(a) is None else TreeConfig.create().with_(source=source(a)) for a in arms}

    @torch.inference_mode()
    def plain_variant(arm: str, ids: list[int], run):  # `Engine.plain` over steps that differ as the arm says
        start = time.perf_counter()
        capacity = eng._capacity(len(ids), sampling, TreeConfig.create() if arm == "plain-slack" else None)
        steps = static.EagerSteps(eng.target, capacity, eng.attn_impl,
                                  eng.feature_layers if arm == "plain-features" else None)
        yield from eng._plain(ids, sampling, run, steps, capacity, start)

    def begin(arm: str, ids: list[int]):  # `bench.start_ours`, with the arm's stretches
        run = eng.new_run("", ids, trees[arm], sampling)
        if arm in ("plain-features", "plain-slack"):
            return run, plain_variant(arm, ids, run)
        if trees[arm] is None:
            return run, eng.plain(ids, sampling, run)
        return run, eng.speculate(ids, trees[arm], sampling, run, rest_batch=stretch.get(arm))

    seconds, tokens, ratios = dict.fromkeys(arms, 0.0), dict.fromkeys(arms, 0), {a: [] for a in arms}
    prefills, prefill_ratios, rest_ratios = ({a: [] for a in arms} for _ in range(3))
    prompts = mtbench_first_turns(args.limit)
    for a in arms:  # a warm-up: what a first run pays once (the chat opening's encoding, first calls) paid here
        run, steps = begin(a, eng.encode_prompt(prompts[0]))
        for _ in zip(range(8), steps):
            pass
        steps.close()
    for times in forwards.values():
        times.clear()
    began = time.perf_counter()
    for i, text in enumerate(prompts):
        ids = eng.encode_prompt(text)
        k = i % len(arms)
        order = arms[k:] + arms[:k]
        started = {a: begin(a, ids) for a in order}
        took, live = dict.fromkeys(order, 0.0), list(order)
        while live:
            a = min(live, key=lambda arm: len(started[arm][0].output))
            stepping[0] = a
            engine.RestStep = unkept if a == "unkept" else KEPT
            start = time.perf_counter()
            try:
                next(started[a][1])
            except StopIteration:
                live.remove(a)
            took[a] += time.perf_counter() - start
        for a in arms:
            seconds[a] += took[a]
            tokens[a] += len(started[a][0].output)
            ratios[a].append(took["plain"] / took[a])
            prefill = {b: started[b][0].prefill_ms / 1e3 for b in ("plain", a)}
            prefills[a].append(prefill[a])
            prefill_ratios[a].append(prefill["plain"] / prefill[a])
            rest_ratios[a].append((took["plain"] - prefill["plain"]) / (took[a] - prefill[a]))
        left = (time.perf_counter() - began) / (i + 1) * (len(prompts) - i - 1)
        print(f"prompt {i + 1}/{len(prompts)}  ETA {left:5.0f} s", flush=True)
    for a in arms:
        print(f"{a:12s} {seconds[a] * 1e3 / tokens[a]:7.3f} ms a token, one-token forward "
              f"{statistics.median(forwards[a]) * 1e3:.3f} ms, plain over it {statistics.median(ratios[a]):.4f} "
              f"(median of {len(ratios[a])} prompts); prefill {statistics.median(prefills[a]) * 1e3:.2f} ms, plain "
              f"over it {statistics.median(prefill_ratios[a]):.4f}; after it {statistics.median(rest_ratios[a]):.4f}")
    print(f"{args.limit} MT-bench prompts x {args.max_new_tokens} tokens, T = {args.temperature:g}, lockstep")


if __name__ == "__main__":
    main()
