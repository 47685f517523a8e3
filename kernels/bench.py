"""Benchmark of the tree-attention kernel: `python -m kernels.bench` on a CUDA GPU.

One attention layer of verification, swept over prefix length P, tree size T and GQA group G at D = 128 in
bf16 with Hkv = 8 KV heads (Llama-3.1-8B's layout, Hq = 8 * G). Columns, in microseconds:
    tree   the Triton kernel on a random tree (split-K chosen by the launcher)
    chain  the Triton kernel on a chain tree (the mask is causal): isolates the cost of the tree shape
    sdpa   torch SDPA with the dense (T, P + T) boolean mask, i.e. the torch path
and the effective bandwidth of the tree kernel, bytes of prefix K and V / time, against the card's peak.

    --roofline   print the predicted time per case for a card (default H100 SXM: 3.35 TB/s, 989 dense
                 bf16 TFLOP/s) without running anything: max(bytes / bandwidth, FLOPs / peak)
    --smoke      tiny shapes under the Triton interpreter on CPU (sets TRITON_INTERPRET=1 when unset),
                 checked against the torch path: proves the benchmark runs, times mean nothing
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import os
import sys
import time

import torch

PREFIXES = (512, 2048, 8192, 32768)
TREE_SIZES = (4, 8, 16, 32, 64)
GROUPS = (1, 4, 8)
HEAD_DIM = 128
KV_HEADS = 8
H100_GBPS = 3350.0
H100_TFLOPS = 989.0


@dataclasses.dataclass(frozen=True)
class Case:
    prefix: int
    tree: int
    group: int
    head_dim: int = HEAD_DIM
    kv_heads: int = KV_HEADS
    itemsize: int = 2  # bf16

    @property
    def prefix_kv_bytes(self) -> int:
        return 2 * self.prefix * self.kv_heads * self.head_dim * self.itemsize

    @property
    def total_bytes(self) -> int:
        """Prefix and tree K/V read once per KV head, queries read and outputs written once."""
        tree_kv = 2 * self.tree * self.kv_heads * self.head_dim * self.itemsize
        q_and_out = 2 * self.tree * self.group * self.kv_heads * self.head_dim * self.itemsize
        return self.prefix_kv_bytes + tree_kv + q_and_out

    @property
    def flops(self) -> int:
        """Two matmuls (QK^T and PV) over every key, for every packed row."""
        return 4 * self.tree * self.group * self.kv_heads * (self.prefix + self.tree) * self.head_dim


def predicted_us(case: Case, gbps: float = H100_GBPS, tflops: float = H100_TFLOPS) -> tuple[float, float]:
    """(memory-bound time, compute-bound time) in microseconds; the roofline is their maximum."""
    return case.total_bytes / (gbps * 1e3), case.flops / (tflops * 1e6)


def roofline_table(gbps: float = H100_GBPS, tflops: float = H100_TFLOPS) -> str:
    """Markdown: predicted microseconds per (P, G) row and T column; '*' marks compute-bound cases."""
    lines = ["| P | G | prefix KV MB | " + " | ".join(f"T={t}" for t in TREE_SIZES) + " |",
             "|" + "---|" * (3 + len(TREE_SIZES))]
    for prefix, group in itertools.product(PREFIXES, GROUPS):
        cells = []
        for tree in TREE_SIZES:
            mem, comp = predicted_us(Case(prefix, tree, group), gbps, tflops)
            cells.append(f"{max(mem, comp):.2f}" + ("*" if comp > mem else ""))
        mb = Case(prefix, 1, group).prefix_kv_bytes / 1e6
        lines.append(f"| {prefix} | {group} | {mb:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _random_parents(t: int, gen: torch.Generator) -> torch.Tensor:
    return torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)])


def _inputs(case: Case, dtype: torch.dtype, device: str, gen: torch.Generator):
    n = case.prefix + case.tree
    q = torch.randn(case.tree, case.kv_heads * case.group, case.head_dim, generator=gen).to(device, dtype)
    k = torch.randn(n, case.kv_heads, case.head_dim, generator=gen).to(device, dtype)
    v = torch.randn(n, case.kv_heads, case.head_dim, generator=gen).to(device, dtype)
    return q, k, v


def _time_us(fn, device: str, reps: int) -> float:
    if device == "cuda":
        import triton.testing

        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return 1e6 * (time.perf_counter() - start) / reps


def run(cases: list[Case], dtype: torch.dtype, device: str, gbps: float, reps: int = 1, check: bool = False):
    """Time every case; print one markdown row each. With `check`, compare the kernel with the torch path."""
    ta = importlib.import_module("kernels.tree_attention")
    gen = torch.Generator().manual_seed(0)
    print("| P | T | G | tree us | chain us | sdpa us | tree GB/s | % of peak | roofline us |")
    print("|" + "---|" * 9)
    for case in cases:
        q, k, v = _inputs(case, dtype, device, gen)
        scale = case.head_dim ** -0.5
        tree_mask = ta.ancestor_mask(_random_parents(case.tree, gen)).to(device)
        chain_mask = torch.ones(case.tree, case.tree, dtype=torch.bool, device=device).tril()
        t_tree = _time_us(lambda: ta.tree_attention_triton(q, k, v, case.prefix, tree_mask, scale), device, reps)
        t_chain = _time_us(lambda: ta.tree_attention_triton(q, k, v, case.prefix, chain_mask, scale), device, reps)
        t_sdpa = _time_us(lambda: ta.tree_attention_torch(q, k, v, case.prefix, tree_mask, scale), device, reps)
        if check:
            out = ta.tree_attention_triton(q, k, v, case.prefix, tree_mask, scale)[0].float()
            ref = ta.tree_attention_torch(q.float(), k.float(), v.float(), case.prefix, tree_mask, scale)
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            if not err < 5e-3:
                raise AssertionError(f"{case}: kernel differs from the torch path by {err:.2e}")
        gb_s = case.prefix_kv_bytes / (t_tree * 1e3)
        roof = max(predicted_us(case, gbps))
        print(f"| {case.prefix} | {case.tree} | {case.group} | {t_tree:.1f} | {t_chain:.1f} | {t_sdpa:.1f} "
              f"| {gb_s:.0f} | {100 * gb_s / gbps:.0f} | {roof:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes in the Triton interpreter on CPU")
    parser.add_argument("--roofline", action="store_true", help="print the predicted times and exit")
    parser.add_argument("--bandwidth-gbps", type=float, default=H100_GBPS, help="card's peak memory bandwidth")
    parser.add_argument("--tflops", type=float, default=H100_TFLOPS, help="card's dense bf16 peak")
    args = parser.parse_args(argv)
    if args.roofline:
        print(roofline_table(args.bandwidth_gbps, args.tflops))
        return 0
    if args.smoke:
        # must precede the first import of kernels.tree_attention: Triton reads it when kernels are decorated
        os.environ.setdefault("TRITON_INTERPRET", "1")
        cases = [Case(p, 4, g, head_dim=32, kv_heads=1) for p, g in itertools.product((0, 40), (1, 2))]
        run(cases, torch.float16, "cpu", args.bandwidth_gbps, reps=1, check=True)
        return 0
    if not torch.cuda.is_available():
        parser.error("the benchmark needs a CUDA GPU (use --smoke or --roofline on CPU)")
    cases = [Case(p, t, g) for p, t, g in itertools.product(PREFIXES, TREE_SIZES, GROUPS)]
    run(cases, torch.bfloat16, "cuda", args.bandwidth_gbps, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
