"""The fused small operations of a decoder layer on CPU (`kernels/cpu_ops.c`), built once per machine.

A CPU decode step of a small model is bound by its matrix products' weight traffic plus a long tail of
small operations: SmolLM2-135M runs ~65 PyTorch operations per layer besides its 4 products, each a few
microseconds of dispatch (docs/performance.md entry 20). `CpuOps` does that work in 4 C calls per layer:
RMSNorm (with the residual add), RoPE plus the KV-cache write, attention over the cache, SiLU-and-multiply.

The C file is compiled with the system's C compiler (`CC`, default `cc`) for this CPU (`-march=native`, or the
CPU `kernels.capability` emulates) into `build_dir`, under a name that hashes the source, the flags, the compiler's version and the CPU's
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
import shlex
import stat
import subprocess
import tempfile
from pathlib import Path

import torch

from kernels import capability

SOURCE = Path(__file__).with_suffix(".c")
DTYPES = (torch.bfloat16, torch.float32)
# Forwards of up to this many tokens are worth the compiled layer: over a 200-token prefix it was 1.36x
# PyTorch's operations for 1 token, 1.10x for 16, 1.02x for 32 and 0.94x for 64 (PyTorch's threads win on
# long inputs such as a prefill; docs/performance.md entry 20).
MAX_ROWS = 32

MAX_HEAD_DIM = 256  # the C attention's register tiles (MAX_CHUNKS vectors of 16 floats)
FLAGS = ("-fopenmp", "-ffp-contract=off")  # threads for attention; no fused multiply-add the source does not write
_ERRORS = {-1: (MemoryError, "out of memory"), -2: (ValueError, "shapes the C code refuses")}

_loaded: dict[tuple[str, str], object] = {}
_errors: dict[tuple[str, str], str] = {}


def last_error(build_dir: str | Path, source: Path = SOURCE) -> str | None:
    """Why the last `load(build_dir)` (or `load_library(source, build_dir, ...)`) returned None."""
    return _errors.get((source.name, str(build_dir)))


def load(build_dir: str | Path) -> CpuOps | None:
    """The compiled operations, building them into `build_dir` on first use; None when they cannot be built
    or `build_dir` is not safe to load code from (`last_error` says why). A success is cached per process
    (later calls cost a dict lookup); a failure is not, so a later call tries again (e.g. once a compiler
    is installed)."""
    return load_library(SOURCE, build_dir, FLAGS, CpuOps)


def load_library(source: Path, build_dir: str | Path, extra: tuple[str, ...], wrap):
    """`wrap(ctypes.CDLL)` of `source` compiled with `extra` flags into `build_dir`, as `load` does it."""
    key = (source.name, str(build_dir))
    if key not in _loaded:
        try:
            path = build_library(source, Path(build_dir), extra)
            _check_private(path)
            _loaded[key] = wrap(ctypes.CDLL(str(path)))
            _errors.pop(key, None)
        except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as err:
            _errors[key] = f"{type(err).__name__}: {err}"
            return None
    return _loaded[key]


def _check_private(path: Path) -> None:
    """Loading a library runs its code: refuse one that another user could have written or replaced (the
    file, or any folder from the build folder up to the user's own, writable by group or others, or owned
    by someone else). Sticky folders such as /tmp protect their entries and are accepted."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is None:  # no POSIX ownership (Windows): nothing to check against
        return
    for place in (path, *path.parents):
        st = place.stat()
        if place != path and st.st_mode & stat.S_ISVTX:
            break  # a sticky folder: others cannot rename or replace what we own inside it
        if st.st_uid not in (uid, 0):
            raise RuntimeError(f"refusing to load {path}: {place} belongs to another user (uid {st.st_uid})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise RuntimeError(f"refusing to load {path}: {place} is writable by other users "
                               f"(mode {stat.S_IMODE(st.st_mode):o}); make it private (chmod go-w) or set "
                               "EAGLEVIZ_CACHE to a folder of your own")
        if st.st_uid == 0 and place != path and uid != 0:
            break  # a root-owned folder that only root can write: above it lies the system


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next((ln for ln in lines if ln.startswith(("flags", "Features"))), "") + platform.machine()
    except OSError:
        return platform.processor() + platform.machine()


def flag_sets(extra: tuple[str, ...] = ("-fopenmp-simd",)) -> tuple[tuple[str, ...], ...]:
    """The compiler flags tried in order: for this CPU (or the one `kernels.capability` emulates), then
    without -march where the compiler does not know it."""
    return (("-O3", f"-march={capability.detect().march}", *extra), ("-O3", *extra))


def build_library(source_path: Path, build_dir: Path, extra: tuple[str, ...] = ("-fopenmp-simd",)) -> Path:
    """Compile `source_path` into a shared library in `build_dir` (once per source, flags, compiler and CPU)."""
    compiler = shlex.split(os.environ.get("CC", "cc") or "cc")  # e.g. CC="ccache gcc"
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = source_path.read_bytes()
    failures = []
    for flags in flag_sets(extra):
        digest = hashlib.sha256(source + repr(flags).encode() + version.encode() + _cpu_signature().encode())
        target = build_dir / f"{source_path.stem}-{digest.hexdigest()[:16]}.so"
        if target.exists():
            return target
        build_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
            out = Path(tmp) / target.name
            done = subprocess.run([*compiler, *flags, "-shared", "-fPIC", str(source_path), "-o", str(out), "-lm"],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                os.chmod(out, 0o700)
                os.replace(out, target)  # atomic: a concurrent build of the same library is harmless
                return target
            failures.append(f"{' '.join(flags)}: {done.stderr.strip()[-500:]}")
    raise RuntimeError(f"could not compile kernels/{source_path.name}: " + " | ".join(failures))


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _check(code: int, what: str) -> None:
    if code:
        kind, why = _ERRORS.get(code, (RuntimeError, f"error {code}"))
        raise kind(f"cpu_ops.{what}: {why}")


class CpuOps:
    """Typed wrappers over the C functions. Every pointer handed to C is checked first (dtype, device,
    contiguity, shape and bounds: a mismatch is a ValueError, never an out-of-bounds access). These run ~120
    times per decode step, so each check is a plain comparison and a message is only built on failure."""

    def __init__(self, lib: ctypes.CDLL):
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        signatures = {
            "rms_norm": [p, p, p, p, i, i, f, i, i],
            "rope_to_cache": [p, p, p, p, p, p, i, i, i, i, i, i, i],
            "attention": [p, p, p, p, p, i, i, i, i, i, i, i, f, i, i, i],
            "silu_mul": [p, p, i, i, i],
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self._lib = lib

    def __deepcopy__(self, memo: dict) -> CpuOps:
        return self  # a handle on a loaded library, with no state: copies of a model share it

    @staticmethod
    def _is_bf16(x: torch.Tensor) -> int:
        if x.dtype not in DTYPES or not x.is_contiguous() or not x.is_cpu:
            raise ValueError(f"cpu_ops: expected a contiguous bf16 or fp32 CPU tensor, got {x.dtype} "
                             f"{tuple(x.stride())} on {x.device}")
        return int(x.dtype == torch.bfloat16)

    @staticmethod
    def _like(x: torch.Tensor, ref: torch.Tensor, shape, name: str) -> None:
        """x must have ref's dtype, be a contiguous CPU tensor and have `shape`."""
        if not (x.dtype == ref.dtype and x.shape == shape and x.is_contiguous() and x.is_cpu):
            raise ValueError(f"cpu_ops: {name} must be a contiguous {ref.dtype} CPU tensor of shape "
                             f"{tuple(shape)}, got {x.dtype} {tuple(x.shape)} strides {tuple(x.stride())} on "
                             f"{x.device}")

    @staticmethod
    def _cache(k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int, num_kv_heads: int, d: int) -> int:
        """Check the KV caches (layers, Hkv, capacity, D) fp32 and return the byte offset of `layer`."""
        if not (k_cache.dtype == torch.float32 and k_cache.dim() == 4 and k_cache.is_contiguous()
                and k_cache.is_cpu):
            raise ValueError("cpu_ops: the KV cache must be a contiguous fp32 CPU tensor (layers, Hkv, capacity, "
                             f"D), got {k_cache.dtype} {tuple(k_cache.shape)}")
        if not (v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype and v_cache.is_contiguous()
                and v_cache.is_cpu):
            raise ValueError("cpu_ops: the value cache must match the key cache")
        if k_cache.shape[1] != num_kv_heads or k_cache.shape[3] != d:
            raise ValueError(f"cpu_ops: the KV cache holds {k_cache.shape[1]} heads of {k_cache.shape[3]}, "
                             f"expected {num_kv_heads} of {d}")
        if not 0 <= layer < k_cache.shape[0]:
            raise ValueError(f"cpu_ops: layer {layer} is outside the cache's {k_cache.shape[0]} layers")
        return layer * k_cache.stride(0) * k_cache.element_size()

    def rms_norm(self, h: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, ordered: bool = False) -> torch.Tensor:
        """RMSNorm of h (T, H) with `weight` (H,), all one dtype. With `delta`, h += delta first, in place
        (the residual add before the norm). Returns the normed rows (into `out` when given). ordered: the mean
        of squares in one order on every CPU (kernels/cpu_ops.c, "Batch invariance")."""
        bf = self._is_bf16(h)
        if h.dim() != 2:
            raise ValueError(f"cpu_ops: rms_norm expects (T, H) rows, got {tuple(h.shape)}")
        self._like(weight, h, h.shape[1:], "weight")
        if delta is not None:
            self._like(delta, h, h.shape, "delta")
        if out is None:
            out = torch.empty_like(h)
        else:
            self._like(out, h, h.shape, "out")
        _check(self._lib.rms_norm(_ptr(h), None if delta is None else _ptr(delta), _ptr(weight), _ptr(out),
                                  h.shape[0], h.shape[1], eps, bf, int(ordered)), "rms_norm")
        return out

    def rope_to_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, layer: int, start: int, num_heads: int, num_kv_heads: int) -> torch.Tensor:
        """qkv (T, (Hq + 2 Hkv) D) fused projection output; cos, sin (T, D) in qkv's dtype. Writes the rotated
        keys and the values at slots [start, start + T) of `layer` in the caches (layers, Hkv, capacity, D)
        fp32 and returns the rotated queries (T, Hq, D) fp32. Slots beyond the capacity are a ValueError, as
        every other refused input (and as `eagleviz.models.kv_cache.KVCache.write` says for the PyTorch path)."""
        return self._rope_to_cache(qkv, cos, sin, k_cache, v_cache, layer, start, num_heads, num_kv_heads)[0]

    def _rope_to_cache(self, qkv, cos, sin, k_cache, v_cache, layer, start, num_heads, num_kv_heads):
        """`rope_to_cache`, also returning the byte offset of `layer` in the checked caches."""
        bf = self._is_bf16(qkv)
        d = k_cache.shape[3] if k_cache.dim() == 4 else 0
        offset = self._cache(k_cache, v_cache, layer, num_kv_heads, d)
        t = qkv.shape[0]
        if not (qkv.dim() == 2 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * d and d % 2 == 0):
            raise ValueError(f"cpu_ops: qkv must be (T, (Hq + 2 Hkv) D) = (T, {(num_heads + 2 * num_kv_heads) * d}), "
                             f"got {tuple(qkv.shape)}")
        self._like(cos, qkv, (t, d), "cos")
        self._like(sin, qkv, (t, d), "sin")
        if start < 0 or start + t > k_cache.shape[2]:
            raise ValueError(f"KV cache overflow: need {start + t} slots, capacity {k_cache.shape[2]}")
        q = torch.empty(t, num_heads, d, dtype=torch.float32)
        _check(self._lib.rope_to_cache(_ptr(qkv), _ptr(cos), _ptr(sin), _ptr(q), _ptr(k_cache) + offset,
                                       _ptr(v_cache) + offset, t, num_heads, num_kv_heads, d, k_cache.shape[2],
                                       start, bf), "rope_to_cache")
        return q, offset

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int, n_keys: int,
                  tree_mask: torch.Tensor | None, out_dtype: torch.dtype, scale: float,
                  ordered: bool = False, threads: int | None = None) -> torch.Tensor:
        """q (T, Hq, D) fp32 over keys [0, n_keys) of `layer`; the last tree_mask.shape[1] keys are seen
        through tree_mask (T, Tk) bool (None: all keys visible). Returns (T, Hq * D) in `out_dtype`. ordered:
        sums in one order, whatever the batch, the tree or the CPU (kernels/cpu_ops.c, "Batch invariance").
        threads: default PyTorch's (the result is the same for any count)."""
        if not (q.dtype == torch.float32 and q.dim() == 3 and q.is_contiguous() and q.is_cpu):
            raise ValueError(f"cpu_ops: q must be a contiguous fp32 CPU tensor (T, Hq, D), got {q.dtype} "
                             f"{tuple(q.shape)}")
        hkv = k_cache.shape[1] if k_cache.dim() == 4 else 0
        offset = self._cache(k_cache, v_cache, layer, hkv, q.shape[2])
        return self._attention(q, k_cache, v_cache, offset, n_keys, tree_mask, out_dtype, scale, ordered, threads)

    def _attention(self, q, k_cache, v_cache, offset: int, n_keys: int, tree_mask, out_dtype, scale, ordered=False,
                   threads: int | None = None):
        """`attention` over caches already checked (`_cache`) for q's head size; `offset` locates the layer."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        if d % 16 or not 0 < d <= MAX_HEAD_DIM:
            raise ValueError(f"cpu_ops: head size {d}: the C attention needs a multiple of 16 up to {MAX_HEAD_DIM}")
        if hkv <= 0 or hq % hkv:
            raise ValueError(f"cpu_ops: {hq} query heads cannot share {hkv} KV heads")
        if not 0 < n_keys <= k_cache.shape[2]:
            raise ValueError(f"cpu_ops: {n_keys} keys in a cache of {k_cache.shape[2]} slots")
        tree = 0 if tree_mask is None else tree_mask.shape[-1]
        mask = None if tree_mask is None else tree_mask.contiguous()
        if mask is not None and not (mask.dtype == torch.bool and mask.shape == (t, tree) and tree <= n_keys
                                     and mask.is_cpu):
            raise ValueError(f"cpu_ops: tree_mask must be a bool CPU tensor (T, Tk) with Tk <= {n_keys}, got "
                             f"{mask.dtype} {tuple(mask.shape)}")
        if out_dtype not in DTYPES:
            raise ValueError(f"cpu_ops: out_dtype must be one of {DTYPES}")
        out = torch.empty(t, hq * d, dtype=out_dtype)
        _check(self._lib.attention(_ptr(q), _ptr(k_cache) + offset, _ptr(v_cache) + offset,
                                   None if mask is None else _ptr(mask), _ptr(out), t, hq, hkv, d, k_cache.shape[2],
                                   n_keys, n_keys - tree, scale, int(out_dtype == torch.bfloat16), int(ordered),
                                   threads or torch.get_num_threads()),
               "attention")
        return out

    def self_attention(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, layer: int, start: int, tree_mask: torch.Tensor | None,
                       num_heads: int, num_kv_heads: int, ordered: bool = False) -> torch.Tensor:
        """`rope_to_cache` then `attention` of the T new tokens over slots [0, start + T) of `layer`: the
        attention of one layer from its fused q|k|v output (the caches checked once). Returns (T, Hq * D) in
        qkv's dtype."""
        q, offset = self._rope_to_cache(qkv, cos, sin, k_cache, v_cache, layer, start, num_heads, num_kv_heads)
        return self._attention(q, k_cache, v_cache, offset, start + qkv.shape[0], tree_mask, qkv.dtype,
                               q.shape[-1] ** -0.5, ordered)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up (T, 2 I) = [gate | up] -> silu(gate) * up (T, I)."""
        bf = self._is_bf16(gate_up)
        if gate_up.dim() != 2 or gate_up.shape[1] % 2:
            raise ValueError(f"cpu_ops: gate_up must be (T, 2 I), got {tuple(gate_up.shape)}")
        t, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(t, inter, dtype=gate_up.dtype)
        _check(self._lib.silu_mul(_ptr(gate_up), _ptr(out), t, inter, bf), "silu_mul")
        return out
