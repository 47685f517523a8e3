"""The fused small operations of a decoder layer on CPU (`kernels/cpu_ops.c`), built once per machine.

A CPU decode step of a small model is bound by its matrix products' weight traffic plus a long tail of
small operations: SmolLM2-135M runs ~65 PyTorch operations per layer besides its 4 products, each a few
microseconds of dispatch (docs/performance.md entry 20). `CpuOps` does that work in 4 C calls per layer:
RMSNorm (with the residual add), RoPE plus the KV-cache write, attention over the cache, SiLU-and-multiply.

The C file is compiled with the system's C compiler (`CC`, default `cc`) for this CPU (`-march=native`)
into `build_dir`, under a name that hashes the source, the flags, the compiler's version and the CPU's
flags, so a cache directory shared between machines never loads a library built for another CPU. Loading
returns None, with the reason in `last_error()`, when there is no compiler or the build fails; callers then
keep PyTorch's operations.

Layouts: hidden states (T, H) contiguous bf16 or fp32; the KV cache (layers, Hkv, capacity, D) contiguous
fp32; queries (T, Hq, D) fp32; the tree mask (T, Tk) bool over the last Tk keys.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_suffix(".c")
FLAG_SETS = (("-O3", "-march=native", "-fopenmp-simd"), ("-O3", "-fopenmp-simd"))  # the second where -march=native is unknown
DTYPES = (torch.bfloat16, torch.float32)
# Forwards of up to this many tokens are worth the compiled layer: over a 200-token prefix it was 1.36x
# PyTorch's operations for 1 token, 1.10x for 16, 1.02x for 32 and 0.94x for 64 (PyTorch's threads win on
# long inputs such as a prefill; docs/performance.md entry 20).
MAX_ROWS = 32

_loaded: dict[str, CpuOps | None] = {}
_errors: dict[str, str] = {}


def last_error(build_dir: str | Path) -> str | None:
    """Why `load(build_dir)` returned None (None when it did not)."""
    return _errors.get(str(build_dir))


def load(build_dir: str | Path) -> CpuOps | None:
    """The compiled operations, building them into `build_dir` on first use; None when they cannot be built.
    Cached per process: later calls cost a dict lookup."""
    key = str(build_dir)
    if key not in _loaded:
        try:
            _loaded[key] = CpuOps(ctypes.CDLL(str(_build(Path(build_dir)))))
        except (OSError, subprocess.SubprocessError, RuntimeError) as err:
            _loaded[key], _errors[key] = None, f"{type(err).__name__}: {err}"
    return _loaded[key]


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next((ln for ln in lines if ln.startswith(("flags", "Features"))), "") + platform.machine()
    except OSError:
        return platform.processor() + platform.machine()


def _build(build_dir: Path) -> Path:
    compiler = os.environ.get("CC", "cc")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = SOURCE.read_bytes()
    failures = []
    for flags in FLAG_SETS:
        digest = hashlib.sha256(source + repr(flags).encode() + version.encode() + _cpu_signature().encode())
        target = build_dir / f"cpu_ops-{digest.hexdigest()[:16]}.so"
        if target.exists():
            return target
        build_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
            out = Path(tmp) / target.name
            done = subprocess.run([compiler, *flags, "-shared", "-fPIC", str(SOURCE), "-o", str(out), "-lm"],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.replace(out, target)  # atomic: a concurrent build of the same library is harmless
                return target
            failures.append(f"{' '.join(flags)}: {done.stderr.strip()[-500:]}")
    raise RuntimeError("could not compile kernels/cpu_ops.c: " + " | ".join(failures))


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class CpuOps:
    """Thin typed wrappers over the C functions. They check layouts cheaply (these run ~120 times per
    decode step) and leave shape agreement to the caller, `eagleviz.models.target.TargetModel`."""

    def __init__(self, lib: ctypes.CDLL):
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        signatures = {
            "rms_norm": [p, p, p, p, i, i, f, i],
            "rope_to_cache": [p, p, p, p, p, p, i, i, i, i, i, i, i],
            "attention": [p, p, p, p, p, i, i, i, i, i, i, i, f, i],
            "silu_mul": [p, p, i, i, i],
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, None
        self._lib = lib

    def __deepcopy__(self, memo: dict) -> CpuOps:
        return self  # a handle on a loaded library, with no state: copies of a model share it

    @staticmethod
    def _is_bf16(x: torch.Tensor) -> int:
        if x.dtype not in DTYPES or not x.is_contiguous() or x.device.type != "cpu":
            raise ValueError(f"expected a contiguous bf16 or fp32 CPU tensor, got {x.dtype} {tuple(x.stride())} on {x.device}")
        return int(x.dtype == torch.bfloat16)

    def rms_norm(self, h: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of h (T, H) with `weight` (H,), all one dtype. With `delta`, h += delta first, in place
        (the residual add before the norm). Returns the normed rows (into `out` when given)."""
        bf = self._is_bf16(h)
        out = torch.empty_like(h) if out is None else out
        self._lib.rms_norm(_ptr(h), None if delta is None else _ptr(delta), _ptr(weight), _ptr(out), h.shape[0],
                           h.shape[1], eps, bf)
        return out

    def rope_to_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, layer: int, start: int, num_heads: int, num_kv_heads: int) -> torch.Tensor:
        """qkv (T, (Hq + 2 Hkv) D) fused projection output; cos, sin (T, D). Writes the rotated keys and the
        values at slots [start, start + T) of `layer` in the caches (layers, Hkv, capacity, D) fp32 and
        returns the rotated queries (T, Hq, D) fp32."""
        bf = self._is_bf16(qkv)
        t, d = qkv.shape[0], k_cache.shape[3]
        if start + t > k_cache.shape[2]:
            raise RuntimeError(f"KV cache overflow: need {start + t} slots, capacity {k_cache.shape[2]}")
        q = torch.empty(t, num_heads, d, dtype=torch.float32)
        stride = k_cache.stride(0) * 4
        self._lib.rope_to_cache(_ptr(qkv), _ptr(cos), _ptr(sin), _ptr(q), _ptr(k_cache) + layer * stride,
                                _ptr(v_cache) + layer * stride, t, num_heads, num_kv_heads, d, k_cache.shape[2],
                                start, bf)
        return q

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int, n_keys: int,
                  tree_mask: torch.Tensor | None, out_dtype: torch.dtype, scale: float) -> torch.Tensor:
        """q (T, Hq, D) fp32 over keys [0, n_keys) of `layer`; the last tree_mask.shape[1] keys are seen
        through tree_mask (T, Tk) bool (None: all keys visible). Returns (T, Hq * D) in `out_dtype`."""
        t, hq, d = q.shape
        out = torch.empty(t, hq * d, dtype=out_dtype)
        tree = 0 if tree_mask is None else tree_mask.shape[1]
        mask = None if tree_mask is None else tree_mask.contiguous()
        stride = k_cache.stride(0) * 4
        self._lib.attention(_ptr(q), _ptr(k_cache) + layer * stride, _ptr(v_cache) + layer * stride,
                            None if mask is None else _ptr(mask), _ptr(out), t, hq, k_cache.shape[1], d,
                            k_cache.shape[2], n_keys, n_keys - tree, scale, self._is_bf16(out))
        return out

    def self_attention(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, layer: int, start: int, tree_mask: torch.Tensor | None,
                       num_heads: int, num_kv_heads: int) -> torch.Tensor:
        """`rope_to_cache` then `attention` of the T new tokens over slots [0, start + T) of `layer`: the
        attention of one layer from its fused q|k|v output. Returns (T, Hq * D) in qkv's dtype."""
        q = self.rope_to_cache(qkv, cos, sin, k_cache, v_cache, layer, start, num_heads, num_kv_heads)
        return self.attention(q, k_cache, v_cache, layer, start + qkv.shape[0], tree_mask, qkv.dtype,
                              q.shape[-1] ** -0.5)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up (T, 2 I) = [gate | up] -> silu(gate) * up (T, I)."""
        bf = self._is_bf16(gate_up)
        t, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(t, inter, dtype=gate_up.dtype)
        self._lib.silu_mul(_ptr(gate_up), _ptr(out), t, inter, bf)
        return out
