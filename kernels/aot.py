"""Ahead-of-time compilation of the tree-attention kernels for Ampere (sm_80) and Hopper (sm_90), no GPU needed.

`python -m kernels.aot` compiles `_tree_attention_kernel` at its default tilings (`kernel_config`) for fp16 and
bf16, D = 64 and 128, each as an engine's eager forward launches it and as a captured step does (P read from
device memory: `tree_attention_static`), plus the split-K merge kernel, the fused layer kernels
(`kernels.layer_ops`), the five-kernel layer's products and a draft head's logits (`kernels.layer_products`) and a draft
level's children and frontier (`kernels.draft_select`), and prints registers per thread and spill bytes read
from each cubin with the cuobjdump that ships with Triton (`--json` prints one JSON object per line).

The signature mirrors what the JIT sees at a real launch with contiguous tensors: unit strides are
specialised to the constant 1 and pointers and multiple-of-16 strides carry the divisibility hint.
Run it without TRITON_INTERPRET (the interpreter replaces the compiled kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from kernels import draft_select as ds
from kernels import layer_ops as lo
from kernels import layer_products as lp
from kernels import tree_attention as ta

ARCHS = (80, 90)
DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128)
ROWS = (16, 32, 64, 128)  # packed rows Tq * G selecting BLOCK_M = 16 ... 128: every default tiling

_DIVISIBLE = [["tt.divisibility", 16]]


@dataclasses.dataclass(frozen=True)
class AotResult:
    """Resources of one compiled kernel, as reported by `cuobjdump --dump-resource-usage`."""

    kernel: str
    arch: int
    dtype: str
    head_dim: int
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    registers: int
    stack_bytes: int  # spills land in the stack frame (local memory)
    local_bytes: int
    shared_bytes: int
    cubin_bytes: int

    @property
    def spill_bytes(self) -> int:
        return self.stack_bytes + self.local_bytes


def _resource_usage(cubin: bytes) -> dict[str, int]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], check=True, capture_output=True,
                              text=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {key: int(value) for key, value in fields.items()}


def _compile(fn, signature: dict, constexprs: dict, divisible: list[str], arch: int, num_warps: int,
             num_stages: int):
    attrs = {(fn.arg_names.index(name),): _DIVISIBLE for name in divisible}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _result(name: str, compiled, arch: int, dtype: str, head_dim: int, block_m: int, block_n: int,
            num_warps: int, num_stages: int) -> AotResult:
    cubin = compiled.asm["cubin"]
    use = _resource_usage(cubin)
    return AotResult(name, arch, dtype, head_dim, block_m, block_n, num_warps, num_stages, use["REG"],
                     use.get("STACK", 0), use.get("LOCAL", 0), compiled.metadata.shared, len(cubin))


def compile_attention(arch: int, dtype: str, head_dim: int, rows: int, static: bool = False) -> AotResult:
    """Compile `_tree_attention_kernel` at the default tiling for `rows` packed rows (single-split output);
    `static`: the variant a captured step launches, P read from device memory (`tree_attention_static`)."""
    cfg = ta.kernel_config(rows, head_dim)
    ptr = f"*{dtype}"
    signature = {
        "Q": ptr, "K": ptr, "V": ptr, "MaskWords": "*i32", "Out": ptr, "Lse": "*fp32", "PrefixLen": "*i32",
        "qk_scale": "fp32",
        "prefix_len": "i32", "tree_len": "i32", "num_rows": "i32", "group": "i32", "split_len": "i32",
        "num_splits": "i32",
        "stride_qt": "i32", "stride_qh": "i32", "stride_qd": "constexpr",
        "stride_kn": "i32", "stride_kh": "i32", "stride_kd": "constexpr",
        "stride_vn": "i32", "stride_vh": "i32", "stride_vd": "constexpr",
        "stride_mt": "i32",
        "stride_os": "i32", "stride_ot": "i32", "stride_oh": "i32", "stride_od": "constexpr",
        "stride_ls": "i32", "stride_lt": "i32", "stride_lh": "constexpr",
        "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_D": "constexpr",
        "UPCAST": "constexpr", "DOT_PRECISION": "constexpr", "PREFIX_IN_MEMORY": "constexpr",
    }
    constexprs = {
        "stride_qd": 1, "stride_kd": 1, "stride_vd": 1, "stride_od": 1, "stride_lh": 1,
        "HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_D": cfg.block_d,
        "UPCAST": False, "DOT_PRECISION": "tf32", "PREFIX_IN_MEMORY": static,
    }
    divisible = ["Q", "K", "V", "MaskWords", "Out", "Lse", "stride_qt", "stride_qh", "stride_kn", "stride_kh",
                 "stride_vn", "stride_vh", "stride_os", "stride_ot", "stride_oh"]
    compiled = _compile(ta._tree_attention_kernel, signature, constexprs, divisible, arch, cfg.num_warps,
                        cfg.num_stages)
    return _result("tree_attention_static" if static else "tree_attention", compiled, arch, dtype, head_dim, cfg.block_m, cfg.block_n, cfg.num_warps,
                   cfg.num_stages)


def compile_merge(arch: int, dtype: str, head_dim: int, block_r: int = 16) -> AotResult:
    """Compile `_merge_splits_kernel` as the launcher runs it (BLOCK_R = 16, 4 warps)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    signature = {
        "Part": "*fp32", "PartLse": "*fp32", "Out": f"*{dtype}", "Lse": "*fp32",
        "num_rows": "i32", "num_heads": "i32", "num_splits": "i32",
        "stride_ps": "i32", "stride_pt": "i32", "stride_ph": "i32", "stride_pd": "constexpr",
        "stride_xs": "i32", "stride_xt": "i32", "stride_xh": "constexpr",
        "stride_ot": "i32", "stride_oh": "i32", "stride_od": "constexpr",
        "stride_lt": "i32", "stride_lh": "constexpr",
        "HEAD_DIM": "constexpr", "BLOCK_R": "constexpr", "BLOCK_D": "constexpr",
    }
    constexprs = {"stride_pd": 1, "stride_xh": 1, "stride_od": 1, "stride_lh": 1,
                  "HEAD_DIM": head_dim, "BLOCK_R": block_r, "BLOCK_D": block_d}
    divisible = ["Part", "PartLse", "Out", "Lse", "stride_ps", "stride_pt", "stride_ph", "stride_ot", "stride_oh"]
    compiled = _compile(ta._merge_splits_kernel, signature, constexprs, divisible, arch, 4, 1)
    return _result("merge_splits", compiled, arch, dtype, head_dim, block_r, 0, 4, 1)


def compile_layer_ops(arch: int, dtype: str, head_dim: int, hidden: int = 576, inter: int = 1536) -> list[AotResult]:
    """Compile the fused layer kernels (`kernels.layer_ops`) as a step of a model of this width launches them
    (SmolLM2-135M's by default), with the launchers' block sizes and Triton's default 4 warps."""
    ptr = f"*{dtype}"
    norm = _compile(lo._add_rms_norm_kernel,
                    {"H": ptr, "Delta": ptr, "W": ptr, "X": ptr, "stride_h": "i32", "stride_d": "i32",
                     "stride_x": "i32", "n": "i32", "eps": "fp32", "HAS_DELTA": "constexpr", "BLOCK": "constexpr"},
                    {"HAS_DELTA": True, "BLOCK": triton.next_power_of_2(hidden)}, ["H", "Delta", "W", "X"], arch, 4, 3)
    rope = _compile(lo._rope_store_kernel,
                    {"QKV": ptr, "Cos": ptr, "Sin": ptr, "Slots": "*i64", "Q": ptr, "KCache": ptr, "VCache": ptr,
                     "stride_qkv": "i32", "stride_cs": "i32", "stride_kh": "i32", "stride_kc": "i32", "hq": "i32",
                     "hkv": "i32", "HEAD_DIM": "constexpr", "HALF": "constexpr"},
                    {"HEAD_DIM": head_dim, "HALF": triton.next_power_of_2(head_dim // 2)},
                    ["QKV", "Cos", "Sin", "Q", "KCache", "VCache"], arch, 4, 3)
    silu = _compile(lo._silu_mul_kernel,
                    {"GU": ptr, "Out": ptr, "stride_gu": "i32", "stride_o": "i32", "inter": "i32",
                     "BLOCK": "constexpr"}, {"BLOCK": 1024}, ["GU", "Out"], arch, 4, 3)
    return [_result(name, compiled, arch, dtype, head_dim, 0, 0, 4, 3)
            for name, compiled in (("add_rms_norm", norm), ("rope_store", rope), ("silu_mul", silu))]


def compile_layer_products(arch: int, dtype: str, head_dim: int) -> list[AotResult]:
    """Compile the five-kernel layer's products (`kernels.layer_products`) with their launchers' tiles (the column
    tiled ones at both widths `columns` picks) and Triton's default 4 warps and 3 stages."""
    ptr, tiles = f"*{dtype}", {"BLOCK_T": lp.BLOCK_T, "BLOCK_K": lp.BLOCK_K, "DOT_PRECISION": "tf32"}
    tiled = {"BLOCK_T": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "DOT_PRECISION": "constexpr"}
    by_columns = (
        ("norm_gate_up", lp._norm_gate_up_kernel, lp.BLOCK_N_GATE,
         {"H": ptr, "NW": ptr, "W": ptr, "Out": ptr, "t": "i32", "k_dim": "i32", "inter": "i32", "eps": "fp32",
          "stride_h": "i32", "stride_w": "i32", "stride_o": "i32"}, {}, ["H", "NW", "W", "Out"]),
        ("matmul_residual", lp._matmul_residual_kernel, lp.BLOCK_N,
         {"X": ptr, "W": ptr, "H": ptr, "t": "i32", "k_dim": "i32", "n": "i32", "stride_x": "i32", "stride_w": "i32",
          "stride_h": "i32"}, {}, ["X", "W", "H"]),
        ("norm_matmul", lp._norm_matmul_kernel, lp.BLOCK_N,
         {"H": ptr, "NW": ptr, "W": ptr, "Out": "*fp32", "t": "i32", "k_dim": "i32", "n": "i32", "eps": "fp32",
          "stride_h": "i32", "stride_w": "i32", "stride_o": "i32", "NORM": "constexpr"}, {"NORM": True},
         ["H", "NW", "W", "Out"]),
    )
    results = []
    for name, kernel, widest, signature, fixed, divisible in by_columns:
        for block_n in (widest, lp.BLOCK_N_FEW):
            compiled = _compile(kernel, signature | tiled, fixed | {"BLOCK_N": block_n} | tiles, divisible, arch, 4, 3)
            results.append(_result(name, compiled, arch, dtype, head_dim, lp.BLOCK_T, block_n, 4, 3))
    qkv_signature = {"A": ptr, "NWA": ptr, "AIds": "*i64", "B2": ptr, "NWB": ptr, "W": ptr, "Bias": ptr, "CosT": ptr,
                     "SinT": ptr, "Pos": "*i64", "Prefix": "*i64", "Q": ptr, "KCache": ptr, "VCache": ptr, "t": "i32",
                     "k_a": "i32", "k_b": "i32", "eps": "fp32", "pos_stride": "i32", "pos_add": "i32",
                     "slot_add": "i32", "stride_a": "i32", "stride_b": "i32", "stride_w": "i32", "stride_cs": "i32",
                     "stride_kh": "i32", "stride_kc": "i32", "hq": "i32", "hkv": "i32", "GATHER": "constexpr",
                     "NORM_A": "constexpr", "TWO": "constexpr", "NORM_B": "constexpr", "HAS_BIAS": "constexpr",
                     "HEAD_DIM": "constexpr", "BLOCK_T": "constexpr", "BLOCK_K": "constexpr",
                     "DOT_PRECISION": "constexpr"}
    # a target layer's form (one normed input, a q/k/v bias as Qwen2's) and a draft head's EAGLE-3 midlayer's (two
    # normed parts, the embeddings gathered by id: the most state a program holds)
    for gather, bias in ((False, True), (True, False)):
        qkv = _compile(lp._norm_qkv_rope_kernel, qkv_signature,
                       {"GATHER": gather, "NORM_A": True, "TWO": gather, "NORM_B": gather, "HAS_BIAS": bias,
                        "HEAD_DIM": head_dim} | tiles,
                       ["A", "NWA", "B2", "NWB", "W", "CosT", "SinT", "Q", "KCache", "VCache"], arch,
                       lp.qkv_warps(head_dim), 3)
        results.append(_result("norm_qkv_rope", qkv, arch, dtype, head_dim, lp.BLOCK_T, head_dim // 2,
                               lp.qkv_warps(head_dim), 3))
    return results


def compile_draft_select(arch: int, k: int = 8) -> AotResult:
    """Compile a draft level's children (`kernels.draft_select`) for topk `k`, with a draft vocabulary's map."""
    compiled = _compile(ds._log_softmax_topk_kernel,
                        {"Logits": "*fp32", "D2T": "*i64", "Values": "*fp32", "Ids": "*i64", "v": "i32",
                         "stride_l": "i32", "stride_o": "i32", "K": "constexpr", "K_PAD": "constexpr",
                         "HAS_MAP": "constexpr", "BLOCK_V": "constexpr"},
                        {"K": k, "K_PAD": triton.next_power_of_2(k), "HAS_MAP": True, "BLOCK_V": ds.BLOCK_V},
                        ["Logits", "D2T", "Values", "Ids"], arch, 4, 1)
    return _result("log_softmax_topk", compiled, arch, "fp32", 0, 1, ds.BLOCK_V, 4, 1)


def compile_frontier(arch: int, dtype: str, k: int = 8) -> AotResult:
    """Compile a draft level's frontier (`kernels.draft_select.frontier`) for topk `k` from the second level on
    (k^2 children, their rows normed: the most work), rows of `dtype`."""
    ptr, pad = f"*{dtype}", lambda n: max(16, triton.next_power_of_2(n))
    compiled = _compile(ds._frontier_kernel,
                        {"LP": "*fp32", "Ids": "*i64", "Score": "*fp64", "HS": ptr, "NW": ptr, "WordsIn": "*i32",
                         "Order": "*i64", "FTok": "*i64", "FScore": "*fp64", "G": ptr, "WordsOut": "*i32",
                         "n": "i32", "h_dim": "i32", "eps": "fp32", "w_in": "i32", "w_out": "i32",
                         "expand_at": "i32", "stride_hs": "i32", "stride_g": "i32", "stride_wi": "i32",
                         "stride_wo": "i32", "K": "constexpr", "N_PAD": "constexpr", "K_PAD": "constexpr",
                         "FIRST": "constexpr", "NORM": "constexpr", "BLOCK_H": "constexpr", "W_PAD": "constexpr"},
                        {"K": k, "N_PAD": pad(k * k), "K_PAD": pad(k), "FIRST": False, "NORM": True, "BLOCK_H": 64,
                         "W_PAD": 16}, ["LP", "Ids", "Score", "HS", "NW", "G"], arch, 4, 1)
    return _result("frontier", compiled, arch, dtype, 0, 1, pad(k * k), 4, 1)


# Four of the eight (arch, dtype, head dim) targets, in which each architecture meets both dtypes and both head
# dimensions, D = 128 (the most registers) on both: a check of every kernel at half the compile time.
COVERING = ((80, "fp16", 64), (80, "bf16", 128), (90, "fp16", 128), (90, "bf16", 64))


def compile_all(archs=ARCHS, dtypes=DTYPES, head_dims=HEAD_DIMS, rows=ROWS, targets=None) -> list[AotResult]:
    """Every distinct default tiling the given row counts select, plus the merge kernel, per target: each of
    `targets` ((arch, dtype, head dim) triples), or by default every combination of archs, dtypes and head_dims."""
    results = []
    for arch, dtype, head_dim in targets or itertools.product(archs, dtypes, head_dims):
        configs = {ta.kernel_config(r, head_dim): r for r in rows}  # rows selecting the same tiling: once
        results += [compile_attention(arch, dtype, head_dim, r, static)
                    for r in configs.values() for static in (False, True)]
        results.append(compile_merge(arch, dtype, head_dim))
        results += compile_layer_ops(arch, dtype, head_dim)
        results += compile_layer_products(arch, dtype, head_dim)
    chosen = sorted({t[0] for t in targets} if targets else archs)
    results += [compile_draft_select(arch) for arch in chosen]
    results += [compile_frontier(arch, dtype) for arch in chosen for dtype in (DTYPES if not targets else
                                                                                 sorted({t[1] for t in targets}))]
    return results


def _table(results: list[AotResult]) -> str:
    lines = ["| kernel | target | dtype | D | BLOCK_M | BLOCK_N | warps | stages | registers | spill bytes "
             "| shared bytes |", "|" + "---|" * 11]
    for r in results:
        lines.append(f"| {r.kernel} | sm_{r.arch} | {r.dtype} | {r.head_dim} | {r.block_m} | {r.block_n or '-'} "
                     f"| {r.num_warps} | {r.num_stages} | {r.registers} | {r.spill_bytes} | {r.shared_bytes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", help="compute capability, e.g. 80 or 90 (repeatable)")
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--head-dim", type=int, action="append")
    parser.add_argument("--rows", type=int, action="append", help="packed rows Tq * G selecting the tiling")
    parser.add_argument("--covering", action="store_true",
                        help="only the four targets of COVERING (every arch with both dtypes and head dims)")
    parser.add_argument("--json", action="store_true", help="one JSON object per compiled kernel")
    args = parser.parse_args(argv)
    if ta._interpreting():
        parser.error("unset TRITON_INTERPRET: the interpreter replaces the kernels this command compiles")
    if args.covering and (args.arch or args.dtype or args.head_dim):
        parser.error("--covering chooses the targets: give it without --arch, --dtype or --head-dim")
    results = compile_all(args.arch or ARCHS, args.dtype or DTYPES, args.head_dim or HEAD_DIMS, args.rows or ROWS,
                          targets=COVERING if args.covering else None)
    if args.json:
        for r in results:
            print(json.dumps(dataclasses.asdict(r)))
    else:
        print(_table(results))
    return 0 if all(r.spill_bytes == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
