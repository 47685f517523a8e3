"""Wall time per speculation cycle and per plain-decoding token on the embedded model: a before/after check
for changes to the decode loop (run it at both commits, interleaved, on an otherwise idle machine).

    python scripts/cycle_ms.py [--threads 1] [--repeats 5]

EAGLE: SGLang's default fixed tree (5/4/16), greedy, 48 new tokens, three prompts, median over repeats x prompts of
(run wall time / cycles). Plain: the same model, one prompt, median of the repeats of (wall time / tokens).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine

PROMPTS = ("Write a Python function that returns the factorial of n, with a docstring.",
           "Explain why the sky is blue in three sentences.", "List five fruits and their colours.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine("embedded")
    sampling = SamplingConfig(max_new_tokens=48)
    for prompt in PROMPTS:  # warm-up
        engine.generate(prompt, TreeConfig(adaptive=False), sampling)
    cycle_ms, token_ms = [], []
    for _ in range(args.repeats):
        for prompt in PROMPTS:
            run = engine.generate(prompt, TreeConfig(adaptive=False), sampling)
            cycle_ms.append(run.wall_s / max(len(run.cycles), 1) * 1e3)
        plain = engine.generate(PROMPTS[1], None, sampling)
        token_ms.append(plain.wall_s / max(len(plain.output), 1) * 1e3)
    print(f"EAGLE 5/4/16: ms per cycle median {statistics.median(cycle_ms):.2f} (n={len(cycle_ms)}); "
          f"plain: ms per token median {statistics.median(token_ms):.2f} (n={len(token_ms)}); "
          f"{torch.get_num_threads()} thread(s)")


if __name__ == "__main__":
    main()
