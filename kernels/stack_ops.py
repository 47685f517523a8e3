"""A decoder stack from weight blocks in one C call (`kernels/stack_ops.c`), built once per machine.

From blocks a SmolLM2 forward is ~240 Python calls into compiled code (four products per layer from
`kernels.quant_ops`, the norms, RoPE, attention and SiLU from `kernels.cpu_ops`), each through a Python
wrapper that checks its tensors and allocates its output. `Stack` hands the addresses of those same C
functions, the layers' weight blocks and the model's shapes to `decoder_stack` once, which then runs a forward's
layers in one call: the same functions in the same order on the same values, so the results are bitwise the
Python sequence's (`TargetModel._forward_fused`, which stays the reference and the fallback).

`Midlayer` does the same for a one-layer EAGLE-3 draft head from Q8_0 blocks (`draft_midlayer`: fc, its norms,
attention over the head's cache and MLP; `DraftHead._forward_fused` is its reference): a drafting cycle's head
forward was ~12 Python calls; in one it ran EAGLE 1.021x faster here (`python -m eagleviz bench --ab head-layer`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import cpu_ops
from kernels.quant_ops import FORMATS, QuantOps, QuantWeight

SOURCE = Path(__file__).with_suffix(".c")
FLAGS: tuple[str, ...] = ()  # no arithmetic of its own: the default -O3 and this CPU's -march
_P = ctypes.c_void_p


class _Ops(ctypes.Structure):
    _fields_ = [("matmul", _P), ("rms_norm", _P), ("rope_to_cache", _P), ("attention", _P), ("silu_mul", _P)]


class _Product(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int), ("k", ctypes.c_int), ("n_out", ctypes.c_int), ("q", _P), ("d", _P),
                ("m", _P), ("bias", _P)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Product), ("o", _Product), ("gate_up", _Product), ("down", _Product),
                ("post_norm", _P), ("next_norm", _P)]


class _Shape(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_int), ("hidden", ctypes.c_int), ("hq", ctypes.c_int), ("hkv", ctypes.c_int),
                ("d", ctypes.c_int), ("inter", ctypes.c_int), ("ordered", ctypes.c_int), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float)]


class _Midlayer(ctypes.Structure):
    _fields_ = [("fc", _Product), ("qkv", _Product), ("o", _Product), ("gate_up", _Product), ("down", _Product),
                ("hidden_norm", _P), ("input_norm", _P), ("post_norm", _P), ("norm_before_residual", ctypes.c_int)]


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's products (each a single block weight and an optional fp32 bias) and norms."""

    qkv: tuple[QuantWeight, torch.Tensor | None]
    o: tuple[QuantWeight, torch.Tensor | None]
    gate_up: tuple[QuantWeight, torch.Tensor | None]
    down: tuple[QuantWeight, torch.Tensor | None]
    post_norm: torch.Tensor
    next_norm: torch.Tensor


def _fp32(t: torch.Tensor, n: int, what: str) -> int:
    if not (t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() and t.shape == (n,)):
        raise ValueError(f"stack_ops: {what} must be a contiguous fp32 CPU vector of {n}, got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t.data_ptr()


def _product(w: QuantWeight, bias: torch.Tensor | None, name: str) -> _Product:
    """The C descriptor of one product from blocks (the tensors stay owned by the caller)."""
    return _Product(FORMATS[w.fmt], w.shape[1], w.shape[0], w.q.data_ptr(), w.d.data_ptr(),
                    None if w.m is None else w.m.data_ptr(),
                    None if bias is None else _fp32(bias, w.shape[0], f"{name} bias"))


def _functions(cpu: cpu_ops.CpuOps, quant: QuantOps, int8: bool) -> tuple[_Ops, list]:
    """The compiled operations' addresses, and the functions themselves (kept alive beside them)."""
    fns = [quant._lib.quant_matmul_i8 if int8 else quant._lib.quant_matmul, cpu._lib.rms_norm,
           cpu._lib.rope_to_cache, cpu._lib.attention, cpu._lib.silu_mul]
    return _Ops(*(ctypes.cast(f, _P).value for f in fns)), fns


def _cache_and_mask(k_cache: torch.Tensor, v_cache: torch.Tensor, layers: int, s: _Shape, t: int, start: int,
                    mask: torch.Tensor | None, whose: str) -> tuple[int, torch.Tensor | None, int]:
    """Checks caches (layers, Hkv, capacity, D) fp32 with room for t slots from `start`, and a mask (t, Tk) over
    the last Tk keys; returns the capacity, the contiguous mask and Tk (0 without one)."""
    for name, c in (("key", k_cache), ("value", v_cache)):
        if not (c.dtype == torch.float32 and c.is_contiguous() and c.dim() == 4
                and tuple(c.shape[:2]) == (layers, s.hkv) and c.shape[3] == s.d and c.shape == k_cache.shape):
            raise ValueError(f"stack_ops: {whose}{name} cache must be contiguous fp32 ({layers}, {s.hkv}, capacity, "
                             f"{s.d}), got {tuple(c.shape)}")
    cap = k_cache.shape[2]
    if not 0 <= start <= cap - t:
        raise ValueError(f"KV cache overflow: need {start + t} slots, capacity {cap}")
    tree = 0
    if mask is not None:
        mask = mask.contiguous()
        tree = mask.shape[-1]
        if not (mask.dtype == torch.bool and mask.shape == (t, tree) and tree <= start + t):
            raise ValueError(f"stack_ops: the mask must be bool ({t}, Tk <= {start + t}), got {tuple(mask.shape)}")
    return cap, mask, tree


class StackOps:
    """The compiled entry; `stack` binds it to one model's weights."""

    def __init__(self, lib: ctypes.CDLL):
        i, p = ctypes.c_int, _P
        lib.decoder_stack.argtypes = [p, p, p, p, p, p, p, p, p, p, i, ctypes.c_long, i, i, p, i, p, i]
        lib.decoder_stack.restype = i
        lib.draft_midlayer.argtypes = [p, p, p, p, p, p, p, p, p, p, i, i, i, p, i, i, i]
        lib.draft_midlayer.restype = i
        self._lib = lib

    def __deepcopy__(self, memo: dict) -> StackOps:
        return self

    def stack(self, cpu: cpu_ops.CpuOps, quant: QuantOps, int8: bool, layers: list[LayerWeights],
              first_norm: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
              ordered: bool) -> Stack:
        """A model's stack: its layers' weights checked once (every product from blocks, shapes that chain)."""
        hidden = first_norm.shape[0]
        inter = layers[0].down[0].shape[1]
        widths = {"qkv": ((num_heads + 2 * num_kv_heads) * head_dim, hidden), "o": (hidden, num_heads * head_dim),
                  "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
        table = (_Layer * len(layers))()
        for row, layer in zip(table, layers):
            for name, shape in widths.items():
                w, bias = getattr(layer, name)
                if w.shape != shape:
                    raise ValueError(f"stack_ops: the {name} product is {w.shape}, expected {shape}")
                setattr(row, name, _product(w, bias, name))
            row.post_norm = _fp32(layer.post_norm, hidden, "a norm weight")
            row.next_norm = _fp32(layer.next_norm, hidden, "a norm weight")
        ops, fns = _functions(cpu, quant, int8)
        shape = _Shape(len(layers), hidden, num_heads, num_kv_heads, head_dim, inter, int(ordered), eps,
                       head_dim ** -0.5)
        return Stack(self._lib, ops, table, shape, _fp32(first_norm, hidden, "the first norm weight"),
                     (layers, first_norm, fns))

    def midlayer(self, cpu: cpu_ops.CpuOps, quant: QuantOps, int8: bool, products: dict, norms: dict,
                 norm_before_residual: bool, num_heads: int, num_kv_heads: int, head_dim: int, inter: int,
                 eps: float) -> Midlayer:
        """An EAGLE-3 head's midlayer in one call (`draft_midlayer`): products fc, qkv, o, gate_up, down (each a
        single block weight and an optional bias), norms hidden_norm, input_norm, post_norm."""
        hidden = norms["post_norm"].shape[0]
        widths = {"fc": (hidden, None), "qkv": ((num_heads + 2 * num_kv_heads) * head_dim, 2 * hidden),
                  "o": (hidden, num_heads * head_dim), "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
        row = _Midlayer()
        for name, (n_out, k) in widths.items():
            w, bias = products[name]
            if w.shape[0] != n_out or (k is not None and w.shape[1] != k):
                raise ValueError(f"stack_ops: the head's {name} product is {w.shape}, expected ({n_out}, {k})")
            setattr(row, name, _product(w, bias, name))
        for name in ("hidden_norm", "input_norm", "post_norm"):
            setattr(row, name, _fp32(norms[name], hidden, "a norm weight"))
        row.norm_before_residual = int(norm_before_residual)
        ops, fns = _functions(cpu, quant, int8)
        shape = _Shape(1, hidden, num_heads, num_kv_heads, head_dim, inter, 0, eps, head_dim ** -0.5)
        return Midlayer(self._lib, ops, row, shape, products["fc"][0].shape[1], (products, norms, fns))


class Midlayer:
    """One EAGLE-3 head's midlayer. Holds the tensors its table points into (`keep`) for its lifetime."""

    def __init__(self, lib, ops: _Ops, row: _Midlayer, shape: _Shape, fc_in: int, keep):
        self._lib, self._ops, self._row, self._shape, self.fc_in, self._keep = lib, ops, row, shape, fc_in, keep

    def __deepcopy__(self, memo: dict) -> Midlayer:
        return self

    def run(self, features: torch.Tensor, emb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, mask: torch.Tensor | None,
            threads: int) -> torch.Tensor:
        """features (T, fc_in) from the target, or (T, hidden) the head's own outputs; emb (T, hidden), cos and
        sin (T, head_dim), all contiguous fp32; the head's caches (1, Hkv, capacity, D) fp32; mask (T, Tk) bool
        over the last Tk keys or None. Writes keys and values at slots [start, start + T); returns the head's
        output rows (T, hidden)."""
        s = self._shape
        t = features.shape[0]
        use_fc = features.shape[-1] != s.hidden  # hidden wide: a tree's expansion, no fc
        for name, x, width in (("features", features, self.fc_in if use_fc else s.hidden), ("emb", emb, s.hidden),
                               ("cos", cos, s.d), ("sin", sin, s.d)):
            if not (x.dtype == torch.float32 and x.is_contiguous() and x.shape == (t, width)):
                raise ValueError(f"stack_ops: {name} must be contiguous fp32 ({t}, {width}), got {x.dtype} "
                                 f"{tuple(x.shape)}")
        cap, mask, tree = _cache_and_mask(k_cache, v_cache, 1, s, t, start, mask, "the head's ")
        h = torch.empty(t, s.hidden, dtype=torch.float32)
        code = self._lib.draft_midlayer(ctypes.addressof(self._ops), ctypes.addressof(self._row),
                                        ctypes.addressof(self._shape), features.data_ptr(), emb.data_ptr(),
                                        h.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
                                        v_cache.data_ptr(), cap, t, start,
                                        None if mask is None else mask.data_ptr(), tree, int(use_fc), threads)
        if code:
            raise (MemoryError if code == -1 else ValueError)(f"stack_ops.draft_midlayer: refused (code {code})")
        return h


class Stack:
    """One model's decoder stack. Holds the tensors its table points into (`keep`) for its lifetime."""

    def __init__(self, lib, ops: _Ops, table, shape: _Shape, first_norm: int, keep):
        self._lib, self._ops, self._table, self._shape, self._first_norm, self._keep = (
            lib, ops, table, shape, first_norm, keep)

    def __deepcopy__(self, memo: dict) -> Stack:
        return self  # read-only weights shared by every copy of a model

    def run(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, start: int, mask: torch.Tensor | None, capture: tuple[int, ...] | None,
            threads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h (T, hidden) fp32, the embedded tokens (updated in place); cos, sin (T, head_dim) fp32; caches
        (layers, Hkv, capacity, D) fp32; mask (T, Tk) bool over the last Tk keys or None. Writes the keys and
        values at slots [start, start + T) and returns the final normed rows (T, hidden) and the inputs of the
        `capture` layers side by side, in `capture`'s order (T, len(capture) * hidden), or None. One row (a
        decoding step) is copied straight into its place in that tensor; more (or a layer named twice) are
        joined after the call."""
        s = self._shape
        t = h.shape[0]
        if not (h.dtype == torch.float32 and h.is_contiguous() and h.dim() == 2 and h.shape[1] == s.hidden):
            raise ValueError(f"stack_ops: h must be contiguous fp32 (T, {s.hidden}), got {h.dtype} {tuple(h.shape)}")
        for name, x in (("cos", cos), ("sin", sin)):
            if not (x.dtype == torch.float32 and x.is_contiguous() and x.shape == (t, s.d)):
                raise ValueError(f"stack_ops: {name} must be contiguous fp32 ({t}, {s.d})")
        cap, mask, tree = _cache_and_mask(k_cache, v_cache, s.layers, s, t, start, mask, "the ")
        features = torch.empty(t, len(capture) * s.hidden, dtype=h.dtype) if capture else None
        direct = capture and t == 1 and len(set(capture)) == len(capture)  # each layer's input row in its place
        if direct:
            at = {i: features.data_ptr() + j * s.hidden * h.element_size() for j, i in enumerate(capture)}
        else:
            captured = {i: torch.empty_like(h) for i in capture or ()}
            at = {i: x.data_ptr() for i, x in captured.items()}
        slots = (_P * s.layers)(*(at.get(i) for i in range(s.layers)))
        x = torch.empty_like(h)
        code = self._lib.decoder_stack(ctypes.addressof(self._ops), ctypes.addressof(self._table),
                                       ctypes.addressof(self._shape), self._first_norm, h.data_ptr(), x.data_ptr(),
                                       cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cap,
                                       k_cache.stride(0), t, start, None if mask is None else mask.data_ptr(), tree,
                                       slots, threads)
        if code:
            raise (MemoryError if code == -1 else ValueError)(f"stack_ops.decoder_stack: refused (code {code})")
        if capture and not direct:
            torch.cat([captured[i] for i in capture], dim=-1, out=features)
        return x, features


def load(build_dir: str | Path) -> StackOps | None:
    """The compiled entry, built into `build_dir` on first use; None when it cannot be built (`last_error`)."""
    return cpu_ops.load_library(SOURCE, build_dir, FLAGS, StackOps)


def last_error(build_dir: str | Path) -> str | None:
    return cpu_ops.last_error(build_dir, SOURCE)
