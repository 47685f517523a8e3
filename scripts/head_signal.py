"""Whether anything the engine knows before the head drafts tells when its guess will be accepted: a policy could
wake a resting head only there, on a CPU where its average guess does not pay.

    OMP_WAIT_POLICY=ACTIVE python scripts/head_signal.py --temperature 0 --limit 12 \
        --out assets/bench/head-signal-epyc-T0.json

Runs a fixed chain of one (the head drafts one token every cycle; the target verifies it with the root) on
MT-bench prompts, and tabulates how often that guess was accepted by two reads made before the cycle drafts: the
target's confidence where the cycle before chose the root (the probability of its most likely token there, which
greedy is the root; a greedy plain step reads the argmax alone, so this read would cost a pass over the
vocabulary) and whether the cycle before's guess was accepted. Beside them, the acceptance a chain of one needs to beat a resting cycle on this machine's price
list: verify(2) + overhead + one draft level over a resting cycle, less one. `--out`: the table as JSON, with the
command and the machine (README quotes such a file; tests/test_bench.py holds the quote).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.perf.bench import machine_info
from eagleviz.prompts import mtbench_first_turns

BINS = 10  # the root's probability in tenths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the table here as JSON")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    eng = load_engine()
    chain = TreeConfig.create(1, 1, 2, adaptive=False).with_(source="eagle")
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    table: dict[tuple[str, object], list[int]] = defaultdict(lambda: [0, 0])  # (cycles, accepted)
    for i, text in enumerate(mtbench_first_turns(args.limit)):
        run = eng.generate(text, chain, sampling)
        confidence, accepted_before = None, None
        for c in run.cycles:
            accepted = c.accept_length >= 1
            if confidence is not None and len(c.tokens) == 2:  # the guess verified (not cut at the run's end)
                for key in (("root probability", min(int(confidence * BINS), BINS - 1)),
                            ("guess before accepted", accepted_before), ("all", None)):
                    table[key][0] += 1
                    table[key][1] += accepted
            last = c.target_probs[c.path[-1]] if c.target_probs else None
            confidence, accepted_before = last, accepted
        print(f"prompt {i + 1}/{args.limit}", flush=True)
    total = table[("all", None)][0]
    costs = eng.costs.at(args.temperature)
    needed = (costs.verify_cost(2) + costs.overhead + costs.draft_cost(1)) / costs.rest_cost() - 1
    rows = [{"read": read, "bin": value, "cycles": n, "accepted": accepted / n}
            for (read, value), (n, accepted) in sorted(table.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))]
    print(f"{'read before drafting':24s} {'bin':>10s} {'cycles':>7s} {'share':>6s} {'accepted':>8s}")
    for row in rows:
        value = row["bin"]
        label = f"{value / BINS:.1f}-{(value + 1) / BINS:.1f}" if row["read"] == "root probability" else str(value)
        print(f"{row['read']:24s} {label:>10s} {row['cycles']:7d} {row['cycles'] / total:6.2f} {row['accepted']:8.2f}")
    print(f"a chain of one beats a resting cycle here from an acceptance of {needed:.2f} "
          f"(verify(2) {costs.verify_cost(2):.2f} + overhead {costs.overhead:.3f} + a level "
          f"{costs.draft_cost(1):.3f}, over a resting cycle {costs.rest_cost():.3f}); "
          f"{args.limit} MT-bench prompts x {args.max_new_tokens} tokens, T = {args.temperature:g}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": shlex.join(["python", "scripts/head_signal.py", *sys.argv[1:]]), "machine": machine_info(eng),
            "prompts": args.limit, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "bins": BINS, "rows": rows, "needed": needed,
            "prices": {"verify2": costs.verify_cost(2), "overhead": costs.overhead, "level": costs.draft_cost(1),
                       "rest": costs.rest_cost()}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
