"""The Triton kernel earns `auto`: a check against the PyTorch path on a small random tree, before it verifies.

`choose_attention(impl, device)` is what an engine asks once at start. `auto` means the Triton kernel on
CUDA, but only if the kernel compiles on this GPU and agrees with `tree_attention_torch` on a random
8-token tree over a 40-token prefix (a few milliseconds, once per process and device). Otherwise the
choice falls back to PyTorch attention with a note saying why, for the run trace and the page. An explicit
`triton` or `torch` is taken as asked: the user chose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import cases
from kernels import tree_attention as ta

CHECK_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # kernel vs fp32 PyTorch


@dataclass(frozen=True)
class KernelCheck:
    """The outcome of one self-check: ok, or a one-line note of what failed."""

    ok: bool
    error: float | None   # relative error against the PyTorch path, None when the kernel did not run
    note: str


@dataclass(frozen=True)
class AttentionChoice:
    """The attention implementation a run uses and the notes that explain a fallback (empty when none)."""

    impl: str
    notes: tuple[str, ...] = ()


def self_check(device: torch.device | str, dtype: torch.dtype = torch.float16, kernel: Callable | None = None,
               seed: int = 0) -> KernelCheck:
    """Run `kernel` (default `tree_attention_triton`) on a small random tree on `device` and compare it with
    `tree_attention_torch` in fp32. A kernel that raises (no compiler, no GPU backend, a launch error) or
    disagrees beyond `CHECK_TOLERANCE` fails the check."""
    device = torch.device(device)
    kernel = kernel or ta.tree_attention_triton
    gen = torch.Generator().manual_seed(seed)
    prefix, tree, kv_heads, group, head_dim = 40, 8, 2, 2, 64
    q, k, v = cases.inputs(tree, prefix + tree, kv_heads, group, head_dim, dtype, gen, device)
    mask = ta.ancestor_mask(cases.parents("random", tree, gen)).to(device)
    scale = head_dim ** -0.5
    name = str(dtype).removeprefix("torch.")
    try:
        out, _ = kernel(q, k, v, prefix, mask, scale)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # launch errors surface here
    except Exception as exc:  # a compile or launch failure of any kind: fall back, saying what happened
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return KernelCheck(False, None, f"the Triton tree-attention kernel failed on {device} ({exc.__class__.__name__}"
                                        f": {first}); verification uses PyTorch attention")
    want = ta.tree_attention_torch(q.float(), k.float(), v.float(), prefix, mask, scale)
    error = cases.relative_error(out, want.double().cpu())
    if error > CHECK_TOLERANCE[dtype]:
        return KernelCheck(False, error, f"the Triton tree-attention kernel disagreed with PyTorch attention on "
                                         f"{device} ({name}: relative error {error:.1e}, tolerance "
                                         f"{CHECK_TOLERANCE[dtype]:.0e}); verification uses PyTorch attention")
    return KernelCheck(True, error, f"the Triton kernel agreed with PyTorch attention on {device} ({name}: relative "
                                    f"error {error:.1e})")


@functools.cache
def _checked_once(device: str, dtype: torch.dtype) -> KernelCheck:
    """`self_check` with the real kernel, once per process, device and dtype."""
    return self_check(device, dtype)


def choose_attention(impl: str, device: torch.device | str, dtype: torch.dtype = torch.float16,
                     check: Callable[[torch.device, torch.dtype], KernelCheck] | None = None) -> AttentionChoice:
    """The implementation an engine on `device` attends with (see the module docstring). `check` replaces
    the cached real self-check (tests inject a failing kernel through it)."""
    device = torch.device(device)
    resolved = ta.resolve_impl(impl, device)
    if impl != "auto" or device.type != "cuda":
        return AttentionChoice(resolved)
    if resolved == "torch":  # auto on CUDA without Triton installed
        return AttentionChoice("torch", ("Triton is not installed: verification uses PyTorch attention",))
    result = (check or (lambda d, t: _checked_once(str(d), t)))(device, dtype)
    return AttentionChoice("triton") if result.ok else AttentionChoice("torch", (result.note,))
