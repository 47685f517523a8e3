#!/usr/bin/env python3
"""How long the C attention (kernels/cpu_ops.c) takes for a verification's rows: query rows of SmolLM2-135M's shape
(9 query heads over 3 KV heads of 64) against a prefix and a causal tree of as many tokens as rows, for each of 30
layers, on one thread, with ordered sums as decoding runs them; the median of --repeats passes. With --against, a
second library built from another copy of the file, timed pass for pass in turn with this one, its outputs checked
bit for bit against this one's.

    python scripts/attention_rows.py                                  # 16 rows over a 56-token prefix
    python scripts/attention_rows.py --rows 1 --prefix 200            # a plain step's
    git show 98f2381:kernels/cpu_ops.c > old.c
    python scripts/attention_rows.py --prefix 200 --against old.c

Prints the milliseconds of the 30 layers' attention for each library (and the ratio), and the CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    import torch

    from eagleviz.paths import cache_dir
    from eagleviz.perf.provenance import provenance
    from kernels import cpu_ops

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prefix", type=int, default=56, help="context tokens before the tree")
    p.add_argument("--against", type=Path, help="another cpu_ops.c to build and time in turn with this one's")
    args = p.parse_args(argv)
    where = cache_dir() / "kernels"  # where the engine builds and keeps its C layer
    libraries = {"this": cpu_ops.load(where)}
    if libraries["this"] is None:
        print(f"no C attention here: {cpu_ops.last_error(where)}", file=sys.stderr)
        return 2
    if args.against is not None:
        with tempfile.TemporaryDirectory() as build:
            path = cpu_ops.build_library(args.against.resolve(), Path(build), cpu_ops.FLAGS)
            libraries["against"] = cpu_ops.CpuOps(ctypes.CDLL(str(path)))
    g = torch.Generator().manual_seed(0)
    rows, keys, layers = args.rows, args.prefix + args.rows, 30
    q = torch.randn(rows, 9, 64, generator=g)
    k = torch.randn(layers, 3, keys + 8, 64, generator=g)
    v = torch.randn_like(k)
    mask = torch.ones(rows, rows, dtype=torch.bool).tril()

    def one_pass(ops) -> tuple[float, torch.Tensor]:
        start = time.perf_counter()
        for layer in range(layers):
            out = ops.attention(q, k, v, layer, keys, mask, torch.float32, 0.125, True, threads=1)
        return time.perf_counter() - start, out

    outputs = {name: one_pass(ops)[1] for name, ops in libraries.items()}
    if "against" in outputs and not torch.equal(outputs["this"], outputs["against"]):
        print("the two libraries' outputs differ", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {name: [] for name in libraries}
    for _ in range(2 + args.repeats):
        for name, ops in libraries.items():
            times[name].append(one_pass(ops)[0])
    ms = {name: statistics.median(t[2:]) * 1e3 for name, t in times.items()}
    machine = provenance(torch.device("cpu"))
    shown = "; ".join(f"{name} {value:.2f} ms" for name, value in ms.items())
    ratio = f" (this / against {ms['this'] / ms['against']:.2f}x, the same bits)" if "against" in ms else ""
    print(f"{layers} layers' attention, {rows} rows x {keys} keys, 1 thread, median of {args.repeats}: {shown}{ratio}; "
          f"{machine['cpu_model']}, {' '.join(machine['cpu_flags'])}, commit {str(machine['commit'])[:7]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
