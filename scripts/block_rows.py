"""Time the embedded SmolLM2-135M's forward of n new tokens over a 200-token prefix (the cost curve verify(n)
of a tree's verification; n = 1 is a plain decode step) with its weights as fp32 linears, as bf16 linears
(where oneDNN packs bf16 here) and as the GGUF's own Q4_1/Q8_0 blocks (`eagleviz.models.quantized`), with
fp32 activations and with int8 activations.

    OMP_WAIT_POLICY=ACTIVE python scripts/block_rows.py --threads 2 [--rows 1 2 4 8 16 32] [--repeats 15]

The three variants are timed interleaved, round after round; medians in milliseconds, and each one's cost
relative to its own single-token step. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from eagleviz.models.loading import cpu_description, load_target
from eagleviz.models.quantized import find_blocks
from eagleviz.models.target import TargetModel
from kernels import capability

PREFIX = 200


def variants() -> dict[str, TargetModel]:
    fp32 = load_target("embedded", dtype="float32", weights="dense")
    blocks = find_blocks(fp32.hf.state_dict())
    out = {"fp32": fp32, "blocks-fp32": TargetModel(fp32.hf, fp32.tokenizer, fp32.name, blocks=blocks, activations="fp32"),
           "blocks-int8": TargetModel(fp32.hf, fp32.tokenizer, fp32.name, blocks=blocks, activations="int8")}
    if capability.detect().bf16_packing:
        out["bf16"] = load_target("embedded", dtype="bfloat16", weights="dense")
    return out


def forward_ms(target: TargetModel, cache, rows: int) -> float:
    ids = torch.randint(0, 1000, (rows,), generator=torch.Generator().manual_seed(rows))
    mask = torch.ones(rows, rows, dtype=torch.bool).tril() if rows > 1 else None
    begin = time.perf_counter()
    target.forward(ids, torch.arange(PREFIX, PREFIX + rows), cache, mask)
    elapsed = time.perf_counter() - begin
    cache.length -= rows
    return elapsed * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    models = variants()
    caches = {}
    for name, target in models.items():
        caches[name] = target.new_cache(PREFIX + max(args.rows))
        prompt = torch.randint(0, 1000, (PREFIX,), generator=torch.Generator().manual_seed(0))
        target.forward(prompt, torch.arange(PREFIX), caches[name], torch.ones(PREFIX, PREFIX, dtype=torch.bool).tril(),
                       logit_rows=None)
    times = {name: {n: [] for n in args.rows} for name in models}
    for round_ in range(args.repeats + 2):
        for n in args.rows:
            for name, target in models.items():
                ms = forward_ms(target, caches[name], n)
                if round_ >= 2:
                    times[name][n].append(ms)
    result = {"cpu": cpu_description(), "threads": args.threads, "prefix": PREFIX,
              "median_ms": {name: {n: round(statistics.median(v), 2) for n, v in per.items()}
                            for name, per in times.items()}}
    for name, per in result["median_ms"].items():
        one = per[args.rows[0]]
        print(f"{name:11s}" + "".join(f"  n={n}: {ms:6.1f} ms ({ms / one:4.2f})" for n, ms in per.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
