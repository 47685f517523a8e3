"""Reading a target distribution on CPU (`kernels/sample_ops.c`), built once per machine as `cpu_ops` is.

A sampled speculation cycle reads the target's distribution several times beside its forward: the argmax of
every verified row, the root's most likely tokens (the page's rejection-sampling view) and a draw. In
PyTorch each is a call that dispatches, may wake its threads and allocates. These do each in one pass over the
row, on the calling thread: under 1% of a sampled run (`python -m eagleviz bench --ab sample-ops`,
docs/performance.md entry 27), since the rows are read cold after the forward either way. `draw` is bitwise
the inverse CDF of `eagleviz.decoding.verify.draw` (fp64 sums in index order), so a seed draws the same
tokens with or without them. `load` returns None where nothing can be compiled; callers keep PyTorch.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels import cpu_ops

SOURCE = Path(__file__).with_suffix(".c")


def _row(x: torch.Tensor, name: str) -> torch.Tensor:
    if not (x.dtype == torch.float32 and x.is_cpu and x.dim() in (1, 2) and x.shape[-1] > 0):
        raise ValueError(f"sample_ops: {name} must be fp32 CPU rows (n,) or (rows, n), got {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}")
    return x.contiguous()


class SampleOps:
    """Typed wrappers: every tensor is checked before its pointer reaches C."""

    def __init__(self, lib: ctypes.CDLL):
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.argmax_rows.argtypes, lib.argmax_rows.restype = [p, i, i, p, p], i
        lib.top_k.argtypes, lib.top_k.restype = [p, i, i, p, p], i
        lib.draw_index.argtypes, lib.draw_index.restype = [p, i, ctypes.c_double, p, p, p], ctypes.c_long
        lib.prob_at.argtypes = [p, i, ctypes.c_long, ctypes.c_float, ctypes.c_float]
        lib.prob_at.restype = ctypes.c_double
        self._lib = lib

    def __deepcopy__(self, memo: dict) -> SampleOps:
        return self

    def argmax(self, x: torch.Tensor) -> tuple[list[int], list[float]]:
        """Each row's first index of its largest value (torch.argmax's choice) and that value, as lists."""
        x = _row(x, "x")
        rows = 1 if x.dim() == 1 else x.shape[0]
        index, value = torch.empty(rows, dtype=torch.int64), torch.empty(rows, dtype=torch.float32)
        code = self._lib.argmax_rows(x.data_ptr(), rows, x.shape[-1], index.data_ptr(), value.data_ptr())
        if code:
            raise ValueError(f"sample_ops.argmax: refused (code {code})")
        return index.tolist(), value.tolist()

    def top_k(self, x: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
        """The k largest values of a row (n,), descending, and their indices (equal values: lower index
        first); k is cut to n."""
        x = _row(x, "x")
        if x.dim() != 1:
            raise ValueError(f"sample_ops.top_k takes one row, got {tuple(x.shape)}")
        k = min(k, x.shape[0])
        index, value = torch.empty(k, dtype=torch.int64), torch.empty(k, dtype=torch.float32)
        code = self._lib.top_k(x.data_ptr(), x.shape[0], k, index.data_ptr(), value.data_ptr())
        if code:
            raise ValueError(f"sample_ops.top_k: refused (code {code})")
        pairs = [(i, v) for i, v in zip(index.tolist(), value.tolist()) if i >= 0]
        return [i for i, _ in pairs], [v for _, v in pairs]

    def prob_at(self, x: torch.Tensor, index: int, top: float, temperature: float = 1.0) -> float:
        """softmax(x / temperature)[index] of one row whose largest value is `top` (`argmax`'s value), in one
        pass and no row written (relative error about 1e-7)."""
        x = _row(x, "x")
        if x.dim() != 1:
            raise ValueError(f"sample_ops.prob_at takes one row, got {tuple(x.shape)}")
        p = self._lib.prob_at(x.data_ptr(), x.shape[0], int(index), float(top), 1.0 / float(temperature))
        if p < 0:
            raise ValueError(f"sample_ops.prob_at: index {index} outside a row of {x.shape[0]}")
        return p

    def draw(self, weights: torch.Tensor, u01: float) -> int:
        """The index whose cumulative weight (fp64, in index order) first exceeds u01 * the total; with u01
        rounded up to the total, the last index with weight. A ValueError when every weight is 0."""
        return self._draw(weights, u01, None, None)

    def draw_and_top(self, weights: torch.Tensor, u01: float) -> tuple[int, int, float]:
        """`draw`'s index, the first index of the largest weight and that weight (one call, the row read while in
        cache)."""
        top, value = ctypes.c_int64(), ctypes.c_float()
        i = self._draw(weights, u01, ctypes.byref(top), ctypes.byref(value))
        return i, top.value, value.value

    def _draw(self, weights: torch.Tensor, u01: float, top, value) -> int:
        w = _row(weights, "weights")
        if w.dim() != 1:
            raise ValueError(f"sample_ops.draw takes one row, got {tuple(w.shape)}")
        cdf = torch.empty(w.shape[0], dtype=torch.float64)
        i = self._lib.draw_index(w.data_ptr(), w.shape[0], float(u01), cdf.data_ptr(), top, value)
        if i < 0:
            raise ValueError("sample_ops.draw: every weight is 0")
        return i


def load(build_dir: str | Path) -> SampleOps | None:
    """The compiled operations, built into `build_dir` on first use; None when they cannot be built
    (`last_error` says why)."""
    return cpu_ops.load_library(SOURCE, build_dir, (), SampleOps)


def last_error(build_dir: str | Path) -> str | None:
    return cpu_ops.last_error(build_dir, SOURCE)
