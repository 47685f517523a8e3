"""How well the cost-aware tree's values forecast acceptance, with the head's calibration as shipped and as each
run corrects it (`eagleviz.decoding.calibration.RunAcceptance`).

    python scripts/forecast_check.py [--limit 20] [--max-new-tokens 128] [--temperature 0] [--threads 2]

The default tree (cost-aware, head and lookup candidates) on MT-bench's first prompts, once with `learn` off and
once on. For every verified node, by who proposed it (head, lookup, both) and its depth: how many, the mean
value the policy gave it (the chance it lies on the accepted path) and the share that did. Then per cycle: the
forecast tokens (`expected_accept`) against the accepted ones. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import copy
from collections import defaultdict

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.prompts import load_prompts


def tally(engine, prompts: list[str], sampling: SamplingConfig) -> tuple[dict, float, float, int]:
    """Per (source, depth): [nodes, sum of values, on the path]; the cycles' summed forecast and accepted
    lengths, and the number of cycles."""
    nodes: dict = defaultdict(lambda: [0, 0.0, 0])
    forecast = accepted = 0.0
    cycles = 0
    for prompt in prompts:
        run = engine.generate(prompt, TreeConfig.create(), sampling)
        for cycle in run.cycles:
            on_path = set(cycle.path)
            for node in cycle.nodes:
                if node.kept:
                    entry = nodes[(node.source, min(node.depth, 3))]
                    entry[0] += 1
                    entry[1] += node.value
                    entry[2] += node.slot in on_path
            forecast += cycle.expected_accept
            accepted += cycle.accept_length
            cycles += 1
    return nodes, forecast, accepted, cycles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine("embedded")
    shipped = copy.copy(engine)
    shipped.learn = False
    prompts = load_prompts("mtbench", args.limit)
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    results = {"as shipped": tally(shipped, prompts, sampling), "corrected per run": tally(engine, prompts, sampling)}
    print(f"{len(prompts)} MT-bench prompts, {args.max_new_tokens} tokens, T = {args.temperature:g}\n")
    print("| calibration | source | depth | verified | mean value | accepted |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (nodes, _, _, _) in results.items():
        for (source, depth), (n, value, hits) in sorted(nodes.items()):
            print(f"| {name} | {source} | {depth if depth < 3 else '3+'} | {n} | {value / n:.3f} | {hits / n:.3f} |")
    print("\n| calibration | cycles | forecast accepted per cycle | accepted per cycle |")
    print("|---|---:|---:|---:|")
    for name, (_, forecast, accepted, cycles) in results.items():
        print(f"| {name} | {cycles} | {forecast / cycles:.3f} | {accepted / cycles:.3f} |")


if __name__ == "__main__":
    main()
