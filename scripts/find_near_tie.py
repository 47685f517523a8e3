"""Look for a prompt on which greedy EAGLE and plain greedy decoding part ways in bf16 at a near-tie, while
agreeing token for token in fp32: the prompt of the near-tie preset (eagleviz/app/presets.py).

    python scripts/find_near_tie.py                    # the candidate prompts below
    python scripts/find_near_tie.py --prompts FILE     # one prompt per line

Each prompt runs as the page runs it (the CPU's dtype, the near-tie preset's tree, the presets' 48 new
tokens, T = 0), then plain decoding races it (`eagleviz.decoding.race`); where the outputs differ, the target's
top-2 logit gap at the first differing token is printed in bf16 rounding steps. The same pair then runs in
fp32, where the algorithm promises identical tokens. bf16 rounding depends on the CPU (AMX, AVX512-BF16,
the compiled layer): a prompt found on one CPU may agree on another.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from eagleviz.models.loading import cpu_description

from eagleviz.decoding.load import load_engine
from eagleviz.app.presets import PRESET_TOKENS
from eagleviz.prompts import load_prompts
from eagleviz.decoding.race import race
from eagleviz.app import presets
from eagleviz.app.session import EngineHub, Knobs, generate

CANDIDATES = (
    "What is the capital of France?",
    "Give three tips for staying healthy.",
    "Write a haiku about the sea.",
    "Name the planets of the solar system.",
    "Describe a cat in one sentence.",
    "What is the boiling point of water?",
    "Write a short poem about autumn leaves.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What are the primary colors?",
    "Write a thank-you note to a teacher.",
    "How do I make a cup of tea?",
    "What is the difference between a virus and a bacterium?",
    "Suggest three names for a pet goldfish.",
    "What does a computer's CPU do?",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "List five fruits that are red.",
    "What is gravity?",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", default=None, help="a prompt file (default: the candidates above)")
    p.add_argument("--max-new-tokens", type=int, default=PRESET_TOKENS)
    args = p.parse_args()
    prompts = load_prompts(args.prompts) if args.prompts else list(CANDIDATES)
    page, fp32 = EngineHub(load_engine()), EngineHub(load_engine(dtype="float32"))
    near_tie = next(p for p in presets.PRESETS if p.shows == "near_tie")
    knobs = presets.knobs(near_tie, Knobs(max_new_tokens=args.max_new_tokens))
    engine = page.get()
    print(f"{cpu_description()}; page dtype {engine.target.dtype}, attention {engine.target.kv_dtype}; "
          f"tree {knobs.steps}/{knobs.topk}/{knobs.draft_tokens}, {args.max_new_tokens} new tokens")
    for prompt in prompts:
        run = generate(page, prompt, replace(knobs, temperature=0.0))
        result = race(engine, run)
        exact = race(fp32.get(), generate(fp32, prompt, knobs)).identical
        line = f"tau {run.summary()['tau']:.2f} fp32-identical {exact} "
        d = result.divergence
        if d is None:
            line += "bf16-identical" if result.identical else "bf16: one output is a prefix of the other"
        else:
            line += (f"DIVERGES at token {d.position}: {d.speculative!r} vs {d.plain!r}, gap {d.gap:.4f} "
                     f"({d.rounding_steps:.1f} rounding steps), top-2 {d.top2}")
        print(f"{prompt!r}: {line}\n    {run.text!r}", flush=True)


if __name__ == "__main__":
    main()
