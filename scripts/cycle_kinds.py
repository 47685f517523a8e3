"""The default's cycles split by kind, timed by their phases, beside plain decoding on the same prompts.

    python scripts/cycle_kinds.py --temperature 1 --limit 12

Kinds: "alone" (the root alone: the head resting, no lookup), "lookupN" (N lookup candidates verified, the
head not run) and "drafted" (the head ran). For each: its share of the cycles, the mean of its phases' ms, the
tokens it committed and ms a token; for the head's cycles, the tokens its forecast expected, their drafting and
verifying ms and how many verified the root alone (none of the head's nodes worth it). Per prompt, what its
lookup cycles won or lost in resting cycles (their tokens less their time over a resting cycle's). Then both runs' ms a token after the prefill, and the ms a cycle
spent outside its phases.
"""

from __future__ import annotations

import argparse

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.prompts import mtbench_first_turns


def kind(c) -> str:
    return "drafted" if c.draft_levels > 0 else "alone" if len(c.tokens) == 1 else f"lookup{len(c.tokens) - 1}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine()
    prompts = mtbench_first_turns(args.limit)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    engine.generate(prompts[0], TreeConfig.create(), sampling)  # one untimed run: a process's first pays more
    kinds: dict[str, list] = {}
    drafted: list[tuple[float, float, float, int]] = []  # the head's cycles: forecast tokens, draft ms, verify ms, tree
    plain_s = spec_s = phases = 0.0
    plain_n = spec_n = cycles = 0
    for prompt in prompts:
        plain = engine.generate(prompt, None, sampling)
        spec = engine.generate(prompt, TreeConfig.create(), sampling)
        plain_s += plain.wall_s - plain.prefill_ms / 1e3
        spec_s += spec.wall_s - spec.prefill_ms / 1e3
        plain_n, spec_n = plain_n + len(plain.output) - 1, spec_n + len(spec.output) - 1
        cycles += len(spec.cycles)
        rest_ms, rests, look_ms, look_tokens, looks = 0.0, 0, 0.0, 0, 0
        for c in spec.cycles:
            ms = sum(c.timings_ms.values())
            phases += ms
            k = kind(c)
            entry = kinds.setdefault(k, [0, 0.0, 0])
            entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + ms, entry[2] + len(c.committed)
            if k == "drafted":
                drafted.append((c.expected_accept + 1, c.timings_ms["draft"], c.timings_ms["verify"], len(c.tokens)))
            if k == "alone":
                rest_ms, rests = rest_ms + ms, rests + 1
            elif k != "drafted":
                look_ms, look_tokens, looks = look_ms + ms, look_tokens + len(c.committed), looks + 1
        one = rest_ms / rests if rests else float("nan")
        print(f"{prompt[:30]!r}: {looks} lookup cycles, {look_tokens} tokens for {look_ms / one:.1f} resting cycles' "
              f"time ({look_tokens - look_ms / one:+.1f})", flush=True)
    total = sum(v[0] for v in kinds.values())
    for k, (n, ms, tok) in sorted(kinds.items()):
        print(f"{k:10s} {n / total:6.1%}  ms a cycle {ms / n:6.2f}  tokens a cycle {tok / n:5.2f}  ms a token "
              f"{ms / tok:5.2f}")
    if drafted:
        n = len(drafted)
        print(f"drafted: forecast {sum(d[0] for d in drafted) / n:.2f} tokens a cycle, drafting "
              f"{sum(d[1] for d in drafted) / n:.2f} ms, verifying {sum(d[2] for d in drafted) / n:.2f} ms, "
              f"{sum(d[3] == 1 for d in drafted) / n:.0%} of them verified the root alone")
    print(f"plain {plain_s * 1e3 / plain_n:.3f} ms a token, the default {spec_s * 1e3 / spec_n:.3f}; outside the "
          f"phases {(spec_s * 1e3 - phases) / cycles:.3f} ms a cycle over {cycles} cycles")


if __name__ == "__main__":
    main()
