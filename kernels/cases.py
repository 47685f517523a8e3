"""The tree-attention kernel's test grid and its float64 reference, shared by the test suite (under Triton's
interpreter), the kernel's self-check (`kernels.self_check`) and `python -m eagleviz gpu-check` (on a GPU).

A case is (prefix length P, tree size T, head dim D, GQA group G, tree shape, dtype); its inputs are random,
seeded by the case's index, so a failing case is rerun exactly. The reference writes attention out in
float64: scores, -inf where the tree mask forbids, log-sum-exp, weights, weighted values.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from kernels import tree_attention as ta

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # relative to the largest output
PREFIXES = (0, 1, 17, 130)
TREE_SIZES = (1, 2, 5, 16, 33, 64)
HEAD_DIMS = (32, 64, 128)
GROUPS = (1, 3, 4)
SHAPES = ("chain", "star", "random")
DTYPES = (torch.float32, torch.float16)  # the interpreter's; bf16 dots are wrong there (triton #11584)
GPU_DTYPES = DTYPES + (torch.bfloat16,)
GRID = list(itertools.product(PREFIXES, TREE_SIZES, HEAD_DIMS, GROUPS, SHAPES, DTYPES))
DEFAULT_CASES = set(range(0, len(GRID), 7))  # 7 is prime to every axis length: each value recurs in every mix


def grid(dtypes=DTYPES) -> list[tuple]:
    """Every case over `dtypes` (GRID for the interpreter's dtypes)."""
    return list(itertools.product(PREFIXES, TREE_SIZES, HEAD_DIMS, GROUPS, SHAPES, dtypes))


def case_id(case) -> str:
    p, t, d, g, shape, dtype = case
    return f"P{p}-T{t}-D{d}-G{g}-{shape}-{str(dtype).removeprefix('torch.')}"


def parents(shape: str, t: int, gen: torch.Generator) -> torch.Tensor:
    """(t,) parent slots of a chain, a star (every node a child of the root) or a random topological tree."""
    if shape == "chain":
        return torch.arange(-1, t - 1)
    if shape == "star":
        return torch.tensor([-1] + [0] * (t - 1))
    return torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)])


def inputs(tq: int, n: int, hkv: int, g: int, d: int, dtype: torch.dtype, gen: torch.Generator, device="cpu"):
    """q (tq, hkv * g, d), k and v (n, hkv, d): standard normal, drawn on the CPU (reproducible anywhere)."""
    shapes = ((tq, hkv * g, d), (n, hkv, d), (n, hkv, d))
    return tuple(torch.randn(*s, generator=gen).to(dtype).to(device) for s in shapes)


def reference(q, k, v, prefix_len: int, tree_mask, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention on the CPU. Returns (out (Tq, Hq, D), lse (Tq, Hq))."""
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    tq, hq, _ = q.shape
    n, hkv, _ = k.shape
    allowed = torch.ones(tq, n, dtype=torch.bool)
    if tree_mask is not None:
        allowed[:, prefix_len:] = tree_mask.cpu()
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("thd,nhd->htn", q, k) * sm_scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("htn,nhd->thd", torch.exp(scores - lse[..., None]), v)
    return out, lse.transpose(0, 1)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, or inf when `out` has a non-finite element (unwritten or NaN)."""
    out = out.double().cpu()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


@dataclass(frozen=True)
class CaseResult:
    case: str
    error: float          # relative error of the output (relative_error)
    lse_error: float      # max absolute error of the log-sum-exp
    ok: bool


def run_case(case: tuple, seed: int, device="cpu", kernel=None) -> CaseResult:
    """One grid case on `device` through `kernel` (default: `tree_attention_triton`), into a NaN-poisoned
    output so that any element the kernel fails to write fails the case."""
    kernel = kernel or ta.tree_attention_triton
    p, t, d, g, shape, dtype = case
    gen = torch.Generator().manual_seed(seed)  # fresh inputs for every case
    q, k, v = inputs(t, p + t, 1, g, d, dtype, gen, device)
    mask = ta.ancestor_mask(parents(shape, t, gen)).to(device)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=device)
    result, lse = kernel(q, k, v, p, mask, d ** -0.5, out=out)
    ref, ref_lse = reference(q, k, v, p, mask, d ** -0.5)
    error = relative_error(result, ref) if result is out else math.inf
    lse = lse.double().cpu()
    lse_ok = bool(torch.allclose(lse, ref_lse, rtol=1e-5, atol=1e-5))
    return CaseResult(case_id(case), error, (lse - ref_lse).abs().max().item(), error <= TOLERANCE[dtype] and lse_ok)
