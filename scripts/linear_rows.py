"""Time one SmolLM2-135M layer's linear products (fused qkv, o, fused gate+up, down) for 1-256 rows, with
`torch.nn.functional.linear` and with oneDNN's packed product (`eagleviz.models.dense`), per dtype: the
measurement behind `FP32_PACKED_FROM` (from how many rows the packed fp32 product is the faster one).

    OMP_WAIT_POLICY=ACTIVE python scripts/linear_rows.py --threads 2 [--dtype float32 bfloat16]

Prints microseconds per layer (the four products) for each row count. Random weights: the time does not
depend on the values. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import time

import torch

# (out, in) of the fused products of one SmolLM2-135M layer (hidden 576, MLP 1536, 9 query + 3 KV heads of 64)
SHAPES = ((576 + 2 * 192, 576), (576, 576), (2 * 1536, 576), (576, 1536))
ROWS = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256)


def time_us(fn, repeats: int) -> float:
    for _ in range(10):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def layer_us(dtype: torch.dtype, rows: int, packed: bool, repeats: int) -> float:
    total = 0.0
    for out_features, in_features in SHAPES:
        w = torch.randn(out_features, in_features).to(dtype)
        x = torch.randn(rows, in_features).to(dtype)
        if packed:
            p = torch.ops.mkldnn._reorder_linear_weight(w)
            total += time_us(lambda: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), repeats)
        else:
            total += time_us(lambda: torch.nn.functional.linear(x, w), repeats)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=100)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; microseconds per layer (4 products)")
    print(f"{'dtype':<10}{'product':<9}" + "".join(f"{f'{r} rows':>9}" for r in ROWS))
    with torch.inference_mode():
        for name in args.dtype:
            dtype = getattr(torch, name)
            for label, packed in (("linear", False), ("packed", True)):
                times = [layer_us(dtype, r, packed, args.repeats) for r in ROWS]
                print(f"{name:<10}{label:<9}" + "".join(f"{t:9.0f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
