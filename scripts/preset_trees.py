"""Which fixed tree shows each preset's lesson: every preset of eagleviz/app/presets.py run with candidate trees
(SGLang's fixed tree, no cost-aware pruning), as the page runs it (the shipped head, the CPU's dtype, the
presets' 48 new tokens), printing tau, the cycles whose accepted path went through a node other than its parent's
best-scored child (`visuals.selection.took_other_branch`: what a chain would have missed), and the text.

    python scripts/preset_trees.py                          # the candidates below, every preset
    python scripts/preset_trees.py --trees 5/4/16 4/2/8     # other trees
    python scripts/preset_trees.py --preset Code

The tree each preset carries (`Preset.tree`) was chosen from this printout; tests/test_presets.py checks the
tau its note quotes.
"""

from __future__ import annotations

import argparse

from eagleviz.app import presets
from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.models.loading import cpu_description
from eagleviz.visuals.selection import took_other_branch

CANDIDATES = ("5/4/16", "6/4/24", "4/4/12", "5/3/12", "4/3/10", "4/2/8", "5/2/10", "3/4/10")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", nargs="+", default=list(CANDIDATES), help="steps/topk/draft_tokens")
    p.add_argument("--preset", default=None, help="one preset's name (default: all)")
    args = p.parse_args()
    engine = load_engine()
    print(f"{cpu_description()}; dtype {engine.target.dtype}; head {engine.head_name}")
    for preset in presets.PRESETS:
        if args.preset and preset.name != args.preset:
            continue
        sampling = SamplingConfig(temperature=preset.temperature, max_new_tokens=presets.PRESET_TOKENS)
        print(f"\n== {preset.name}")
        for spec in args.trees:
            steps, topk, budget = (int(x) for x in spec.split("/"))
            tree = TreeConfig.create(steps, topk, budget, adaptive=False)
            run = engine.generate(preset.prompt, tree, sampling)
            s = run.summary()
            branched = sum(took_other_branch(c) for c in run.cycles)
            text = engine.target.tokenizer.decode(run.token_ids, skip_special_tokens=True)
            print(f"{spec:>8}: tau {s['tau']:.2f}  cycles {len(run.cycles):2d}  other branch accepted {branched:2d}  "
                  f"{s['tokens_per_s']:5.1f} tok/s  {text[:90]!r}", flush=True)


if __name__ == "__main__":
    main()
