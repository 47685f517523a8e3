"""Greedy EAGLE is plain greedy decoding, bit for bit, from weight blocks: `python -m eagleviz lossless`.

For each MT-bench first turn (--prompts, 80: all of them), plain greedy decoding writes --tokens new tokens; then
each tree of CONFIGS writes its own, which must be the same ids (a chain, SGLang's default tree, a large budget,
the cost-aware tree drafted by the head alone and with prompt-lookup candidates). And the converse: a chain of the
very tokens plain decoding chose (`Foresight`, CHAINS long) is accepted whole in every cycle, so no token's logits
move when it is verified among others. The blocks' products, the C layer and the stack sum in one order whatever
the batch, so there is no near-tie to excuse a difference.

`--out` writes the result as JSON with the version it was measured with (`lossless_version`: every C file of a
CPU's decoding and the engine's Python, `kernels.numerics`); `assets/bench/lossless.json` is the committed one,
and `tests/test_numerics.py` fails when that code changes and it was not run again. Each finished prompt goes
to a journal beside --out, so an interrupted run picks up where it stopped. `tests/test_lossless_blocks.py` runs
the same checks on 8 prompts (20 under `-m slow`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.lookup import Foresight
from eagleviz.journal import Journal

CONFIGS = {"chain": TreeConfig.create(5, 1, 6, adaptive=False, source="eagle"),
           "tree": TreeConfig.create(5, 4, 16, adaptive=False, source="eagle"),
           "large": TreeConfig.create(7, 8, 64, adaptive=False, source="eagle"),
           "cost-aware": TreeConfig.create(5, 4, 16, source="eagle"),
           "cost-aware+lookup": TreeConfig.create(5, 4, 16, source="eagle+lookup")}
CHAINS = (3, 7)  # lengths of the chains of plain decoding's own tokens


def short_cycles(engine, prompt: str, plain: list[int], k: int) -> list[int]:
    """The cycles (but the last, which may run out of tokens) in which a chain of plain decoding's next k tokens
    was not accepted whole; the run must also write plain decoding's tokens (an AssertionError otherwise)."""
    tree = TreeConfig.create(k, 1, k + 1, adaptive=False, source="lookup")
    sampling = SamplingConfig(max_new_tokens=len(plain))
    ids = engine.encode_prompt(prompt)
    run = engine.new_run(prompt, ids, tree, sampling)
    for _ in engine.speculate(ids, tree, sampling, run, index_of=lambda ctx: Foresight(plain, len(ids), ctx)):
        pass
    if run.token_ids != plain:
        raise AssertionError(f"a chain of plain decoding's own tokens wrote other tokens on {prompt[:40]!r}")
    return [c.index for c in run.cycles[:-1] if c.accept_length != k]


def check_prompt(engine, prompt: str, tokens: int) -> dict:
    """One prompt: whether each tree wrote plain decoding's ids, and each chain's short cycles."""
    sampling = SamplingConfig(max_new_tokens=tokens)
    plain = engine.generate(prompt, None, sampling).token_ids
    return {"plain_tokens": len(plain),
            "equal": {name: engine.generate(prompt, tree, sampling).token_ids == plain for name, tree in CONFIGS.items()},
            "short_cycles": {str(k): short_cycles(engine, prompt, plain, k) for k in CHAINS}}


def check(engine, prompts: list[str], tokens: int, journal: Path | None = None, progress=print) -> dict:
    """Every prompt through `check_prompt`, resumed from `journal` when it holds the same settings."""
    from eagleviz.perf.bench import machine_info

    header = {"prompts": prompts, "tokens": tokens, "numerics": lossless_version(), "head": engine.head_name}
    log = Journal(journal, header, "lossless", progress)
    done = log.run(len(prompts), lambda i: check_prompt(engine, prompts[i], tokens))
    machine = machine_info(engine)
    result = {
        "numerics": header["numerics"], "prompts": len(prompts), "tokens": tokens, "weights": engine.target.weights,
        "differ": {name: [i for i, p in enumerate(done) if not p["equal"][name]] for name in CONFIGS},
        "chains_short": {str(k): [i for i, p in enumerate(done) if p["short_cycles"][str(k)]] for k in CHAINS},
        "plain_tokens": sum(p["plain_tokens"] for p in done), "cpu": machine["cpu"], "date": machine["date"],
        "head": engine.head_name, "machine": machine}
    log.close()
    return result


def lossless_version() -> str:
    """The version a lossless result holds for (`kernels.numerics`): every C file a CPU's decoding compiles
    (the forward's, and kernels/sample_ops.c, whose argmax picks each greedy token) with its flags, and the code of
    the engine, the models and the kernels' Python (eagleviz/decoding, eagleviz/models, kernels/*.py)."""
    import eagleviz.decoding
    import eagleviz.models
    import kernels
    from kernels import numerics, sample_ops

    folders = [Path(m.__file__).parent for m in (eagleviz.decoding, eagleviz.models, kernels)]
    python = tuple(sorted((f for folder in folders for f in folder.glob("*.py")),
                          key=lambda f: (f.parent.name, f.name)))
    return numerics.numerics_version(numerics.SOURCES + ((sample_ops.SOURCE, ()),), python)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz lossless", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=80, help="the first N MT-bench first turns (80: all)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None,
                   help="write the result there (assets/bench/lossless.json is the committed one)")
    args = p.parse_args(argv)
    import torch

    from eagleviz.decoding.load import load_engine
    from eagleviz.prompts import mtbench_first_turns

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine(weights="blocks")
    journal = args.out.with_suffix(".journal.jsonl") if args.out else None
    result = check(engine, mtbench_first_turns(args.prompts), args.tokens, journal)
    result["command"] = "python -m eagleviz lossless " + " ".join(argv)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    failed = any(result["differ"].values()) or any(result["chains_short"].values())
    return 1 if failed else 0
