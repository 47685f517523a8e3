"""One hash of what the default path writes, to hold every CPU and every build of the C code to the same tokens.

`python -m eagleviz fingerprint` decodes the first PROMPTS MT-bench questions, TOKENS new tokens each, greedy,
with the embedded model from its weight blocks: plain decoding, and the default (cost-aware) EAGLE tree. Its
fingerprint is the SHA-256 of the plain runs' token ids; EAGLE's must be the same ids (greedy speculation is
lossless, and from blocks bit for bit). The blocks' products, the C layer and the stack sum in one fixed order
whatever the vector unit, and fuse exactly the multiply-adds they write out, so this hash is the same on AVX-512,
AVX2 and plain x86-64 (no FMA) builds: `tests/test_fingerprint.py` checks each against the committed
`assets/bench/fingerprint.json` (written by `--out`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from eagleviz.config import SamplingConfig, TreeConfig

PROMPTS, TOKENS = 8, 64


def fingerprint(engine, prompts: list[str], tokens: int = TOKENS) -> dict:
    """The hash of plain greedy decoding's token ids over `prompts`, whether the default EAGLE tree wrote the
    same ids, and what the numbers depend on."""
    from eagleviz.perf.bench import machine_info

    sampling = SamplingConfig(max_new_tokens=tokens)
    plain = [engine.generate(p, None, sampling).token_ids for p in prompts]
    eagle = [engine.generate(p, TreeConfig.create(), sampling).token_ids for p in prompts]
    digest = hashlib.sha256(json.dumps(plain).encode()).hexdigest()
    machine = machine_info(engine)
    return {"sha256": digest, "eagle_equals_plain": eagle == plain, "prompts": len(prompts), "tokens": tokens,
            "weights": engine.target.weights, "cpu": machine["cpu"], "date": machine["date"],
            "first_tokens": plain[0][:8], "machine": machine}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz fingerprint", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write the result there (assets/bench/fingerprint.json "
                                                           "is the committed one)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    import torch

    from eagleviz.decoding.load import load_engine
    from eagleviz.prompts import mtbench_first_turns

    if args.threads:
        torch.set_num_threads(args.threads)
    result = fingerprint(load_engine(), mtbench_first_turns(PROMPTS))
    result["command"] = "python -m eagleviz fingerprint " + " ".join(argv)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0
