#!/usr/bin/env python3
"""How long the C attention (kernels/cpu_ops.c) takes for a verification's rows: 16 query rows of SmolLM2-135M's
shape (9 query heads over 3 KV heads of 64) against 72 keys (a 56-token prefix and a causal 16-token tree), for
each of 30 layers, on one thread, ordered sums as decoding runs them; the median of --repeats passes.

    python scripts/attention_rows.py                    # this checkout's library
    python scripts/attention_rows.py --repeats 50

Prints one line: the milliseconds of the 30 layers' attention, and the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    import torch

    from eagleviz.perf.provenance import provenance
    from kernels import cpu_ops
    from eagleviz.paths import cache_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--rows", type=int, default=16)
    args = p.parse_args(argv)
    where = cache_dir() / "kernels"   # where the engine builds and keeps its C layer
    ops = cpu_ops.load(where)
    if ops is None:
        print(f"no C attention here: {cpu_ops.last_error(where)}", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    rows, keys, layers = args.rows, 56 + args.rows, 30
    q = torch.randn(rows, 9, 64, generator=g)
    k = torch.randn(layers, 3, keys + 8, 64, generator=g)
    v = torch.randn_like(k)
    mask = torch.ones(rows, rows, dtype=torch.bool).tril()

    def one_pass() -> float:
        start = time.perf_counter()
        for layer in range(layers):
            ops.attention(q, k, v, layer, keys, mask, torch.float32, 0.125, True, threads=1)
        return time.perf_counter() - start

    for _ in range(3):
        one_pass()
    ms = statistics.median(one_pass() for _ in range(args.repeats)) * 1e3
    machine = provenance(torch.device("cpu"))
    print(f"{layers} layers' attention, {rows} rows x {keys} keys, 1 thread: {ms:.2f} ms (median of {args.repeats}); "
          f"{machine['cpu_model']}, {' '.join(machine['cpu_flags'])}, commit {str(machine['commit'])[:7]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
