"""Matrix products from a model file's weight blocks (`kernels/quant_ops.c`), built once per machine.

A decode step on a CPU reads every weight once, so its speed is the weights' bytes: SmolLM2-135M's linears
and LM head are 538 MB in fp32 and ~96 MB in the GGUF's own Q4_1 and Q8_0 blocks. `quant_matmul` multiplies
fp32 rows by weights kept in those blocks (the rows quantized to int8 per block, or kept fp32), with one fixed
order of operations per output element (batch invariant: a row's result does not depend on the rows computed
with it, the thread count or the CPU's vector width; the C file says how).

Formats, one block of 32 values along k per column (`canonical`): q4_1 q (n * k / 32, 16) uint8, byte i =
q[i] | q[i + 16] << 4, d and m (n * k / 32,) fp16, w = d * q + m; q8_0 q (n * k / 32, 32) int8 viewed as uint8,
d fp16, w = d * q (the scales in fp16, as the file stores them). `QuantWeight` holds them as the C code reads
them: the columns in groups of 16 (zero columns pad the last), per group and block the 16 columns' bytes
interleaved four at a time, d and m as 16 lanes (the C file's header draws it). `from_blocks` converts
`eagleviz.models.packed`'s layout; `reference` computes the same product in PyTorch from the dequantized
weight (equal up to summation order).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import cpu_ops

SOURCE = Path(__file__).with_suffix(".c")
FLAGS = ("-fopenmp", "-ffp-contract=fast")
FORMATS = {"q4_1": 0, "q8_0": 1}
BLOCK = 32
GROUP = 16  # output columns per group: the C code's vector lanes


def _fp16(t: torch.Tensor) -> torch.Tensor:
    """Scales as the file stores them: fp16, refused when a value would round (they come from fp16 blocks)."""
    half = t.half()
    if t.dtype != torch.float16 and not torch.equal(half.to(t.dtype), t):
        raise ValueError("block scales must be fp16 values (as GGUF stores them)")
    return half


def _groups(n: int) -> int:
    return -(-n // GROUP)


def _interleave(fmt: str, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, shape) -> tuple:
    """The canonical layout (see the module docstring) -> the C code's: (q (groups * blocks, 256 | 512), d, m
    (groups * blocks * 16,) fp16)."""
    n, k = shape
    blocks, pad = k // BLOCK, _groups(n) * GROUP - n
    chunks = 4 if fmt == "q4_1" else 8  # 4-byte chunks per block and column

    def lanes(t: torch.Tensor) -> torch.Tensor:  # (n, blocks, ...) -> (groups, 16 columns, blocks, ...), padded
        t = torch.cat((t, t.new_zeros((pad,) + t.shape[1:]))) if pad else t
        return t.reshape(_groups(n), GROUP, blocks, *t.shape[2:])

    qg = lanes(q.reshape(n, blocks, chunks, 4)).permute(0, 2, 3, 1, 4).reshape(-1, chunks * 4 * GROUP)
    dg = lanes(_fp16(d).reshape(n, blocks)).permute(0, 2, 1).reshape(-1)
    mg = None if m is None else lanes(_fp16(m).reshape(n, blocks)).permute(0, 2, 1).reshape(-1)
    return qg.contiguous(), dg.contiguous(), None if mg is None else mg.contiguous()


@dataclass(frozen=True)
class QuantWeight:
    """A weight (n, k) in blocks of 32 along k, in the C code's layout (see the module docstring)."""

    fmt: str
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    shape: tuple[int, int]

    def __post_init__(self):
        n, k = self.shape
        if self.fmt not in FORMATS or k % BLOCK:
            raise ValueError(f"a {self.fmt} weight of shape {self.shape}: formats {sorted(FORMATS)}, k a multiple of 32")
        blocks = _groups(n) * k // BLOCK
        width = GROUP * (16 if self.fmt == "q4_1" else 32)
        if not (self.q.dtype == torch.uint8 and self.q.shape == (blocks, width) and self.q.is_contiguous()):
            raise ValueError(f"{self.fmt} q must be contiguous uint8 ({blocks}, {width}), got {self.q.dtype} "
                             f"{tuple(self.q.shape)}")
        for name, part in (("d", self.d), ("m", self.m if self.fmt == "q4_1" else self.d)):
            if part is None or not (part.dtype == torch.float16 and part.shape == (blocks * GROUP,)
                                    and part.is_contiguous()):
                raise ValueError(f"{self.fmt} {name} must be contiguous fp16 ({blocks * GROUP},)")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m) if t is not None)

    @classmethod
    def from_canonical(cls, fmt: str, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, shape) -> QuantWeight:
        """From the canonical layout (the module docstring): one block per column and 32 values along k."""
        return cls(fmt, *_interleave(fmt, q, d, m, tuple(shape)), tuple(shape))

    def canonical(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q, d, m) in the canonical layout, padding columns dropped."""
        n, k = self.shape
        blocks, chunks = k // BLOCK, 4 if self.fmt == "q4_1" else 8

        def columns(t: torch.Tensor, *inner: int) -> torch.Tensor:  # the inverse of `_interleave`'s `lanes`
            t = t.reshape(_groups(n), blocks, *inner[:1], GROUP, *inner[1:])
            t = t.permute(0, 3, 1, 2, 4) if inner else t.permute(0, 2, 1)
            return t.reshape(_groups(n) * GROUP, blocks, *inner)[:n].reshape(n * blocks, -1).squeeze(-1)

        q = columns(self.q, chunks, 4).contiguous()
        m = None if self.m is None else columns(self.m).contiguous()
        return q, columns(self.d).contiguous(), m

    @classmethod
    def from_blocks(cls, fmt: str, parts: dict[str, torch.Tensor], shape) -> QuantWeight:
        """From `eagleviz.models.packed`'s parts (q4_1: q (B, 16) two values per byte, low nibble first, in
        order; d, m fp16. q8_0: q (B, 32) int8, d fp16)."""
        if fmt == "q4_1":
            packed = parts["q"]
            q = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], BLOCK)
            q = (q[:, :16] | (q[:, 16:] << 4)).contiguous()
            return cls.from_canonical(fmt, q, parts["d"], parts["m"], shape)
        if fmt == "q8_0":
            return cls.from_canonical(fmt, parts["q"].contiguous().view(torch.uint8), parts["d"], None, shape)
        raise ValueError(f"no quantized product for the format {fmt!r} (supported: {', '.join(FORMATS)})")

    @classmethod
    def quantize_q8_0(cls, weight: torch.Tensor) -> QuantWeight:
        """Any weight (n, k) rounded to Q8_0 blocks as GGUF does it: d = the block's largest magnitude / 127
        (kept to fp16's precision, as the file format stores it), q = w / d rounded to the nearest integer.
        Not exact, unlike `from_blocks`: for weights the model file does not hold in blocks (a draft head's)."""
        n, k = weight.shape
        if k % BLOCK:
            raise ValueError(f"Q8_0 needs k a multiple of {BLOCK}, got a weight of shape {tuple(weight.shape)}")
        blocks = weight.detach().float().reshape(-1, BLOCK)
        d = (blocks.abs().amax(1) / 127.0).half()
        safe = torch.where(d > 0, d.float(), torch.ones(d.shape))
        q = (blocks / safe[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls.from_canonical("q8_0", q.contiguous().view(torch.uint8), d, None, (n, k))

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight (n, k) these blocks hold (d * q + m, exact in fp32)."""
        q, d, m = self.canonical()
        if self.fmt == "q4_1":
            w = d.float()[:, None] * torch.cat((q & 0x0F, q >> 4), dim=1).float() + m.float()[:, None]
        else:
            w = d.float()[:, None] * q.view(torch.int8).float()
        return w.reshape(self.shape)

    @classmethod
    def concat(cls, weights: list[QuantWeight]) -> QuantWeight | None:
        """One weight whose rows are those of `weights` in order (they share k and a format, and every one but
        the last fills its groups of 16 columns), else None."""
        first = weights[0]
        if any(w.fmt != first.fmt or w.shape[1] != first.shape[1] for w in weights) or any(
                w.shape[0] % GROUP for w in weights[:-1]):
            return None
        m = None if first.m is None else torch.cat([w.m for w in weights])
        return cls(first.fmt, torch.cat([w.q for w in weights]), torch.cat([w.d for w in weights]), m,
                   (sum(w.shape[0] for w in weights), first.shape[1]))


class QuantOps:
    """The typed wrapper over `quant_matmul`: every pointer is checked before it reaches C."""

    def __init__(self, lib: ctypes.CDLL):
        p, i = ctypes.c_void_p, ctypes.c_int
        for name in ("quant_matmul", "quant_matmul_i8"):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [i, p, p, p, p, p, p, i, i, i, i], ctypes.c_int
        self._lib = lib

    def __deepcopy__(self, memo: dict) -> QuantOps:
        return self

    def matmul(self, x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None,
               threads: int | None = None, int8: bool = False) -> torch.Tensor:
        """x (T, k) fp32 -> (T, n) fp32 = x w^T (+ bias (n,) fp32). int8: the rows are first quantized per
        block of 32 to int8 and multiplied in integers (`reference_int8` says exactly what is computed)."""
        n, k = w.shape
        if not (x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] == k and x.is_cpu):
            raise ValueError(f"quant_ops: x must be an fp32 CPU tensor (T, {k}), got {x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        if bias is not None and not (bias.dtype == torch.float32 and bias.shape == (n,) and bias.is_contiguous()):
            raise ValueError(f"quant_ops: bias must be contiguous fp32 ({n},)")
        y = torch.empty(x.shape[0], n, dtype=torch.float32)
        product = self._lib.quant_matmul_i8 if int8 else self._lib.quant_matmul
        code = product(FORMATS[w.fmt], x.data_ptr(), w.q.data_ptr(), w.d.data_ptr(),
                                      None if w.m is None else w.m.data_ptr(),
                                      None if bias is None else bias.data_ptr(), y.data_ptr(), x.shape[0], k, n,
                                      threads or torch.get_num_threads())
        if code:
            raise ValueError(f"quant_ops.matmul: the C code refused the shapes (code {code})")
        return y


def load(build_dir: str | Path) -> QuantOps | None:
    """The compiled product, built into `build_dir` on first use; None when it cannot be built (`last_error`)."""
    return cpu_ops.load_library(SOURCE, build_dir, FLAGS, QuantOps)


def last_error(build_dir: str | Path) -> str | None:
    return cpu_ops.last_error(build_dir, SOURCE)


def reference(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product in PyTorch, on the dequantized weight (fp64 sums: the exact value to compare with)."""
    y = x.double() @ w.dequantize().double().T
    return (y if bias is None else y + bias.double()).float()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (T, k) fp32 -> (qx, dx): qx (T, k / 32, 32) integers in -127..127 (as fp64), dx (T, k / 32, 1) fp32
    = the block's largest magnitude / 127, qx = x / dx rounded half away from zero as the C code does it:
    sign(v) * trunc(min(|v| + 0.5, 127)) in fp32."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    dx = blocks.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(dx > 0, 1.0 / dx, torch.zeros_like(dx))
    v = blocks * inv
    qx = v.sign() * (v.abs() + 0.5).clamp(max=127.0).trunc()
    return qx.double(), dx


def reference_int8(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What `matmul(..., int8=True)` computes, in fp64: sum over blocks of d dx (q . qx) (+ m dx sum(qx) for
    Q4_1), with q the stored integers."""
    n, k = w.shape
    qx, dx = quantize_rows(x)
    wq, wd, wm = w.canonical()
    if w.fmt == "q4_1":
        q = torch.cat((wq & 0x0F, wq >> 4), dim=1).double().reshape(n, k // BLOCK, BLOCK)
    else:
        q = wq.view(torch.int8).double().reshape(n, k // BLOCK, BLOCK)
    dots = torch.einsum("tbi,nbi->tnb", qx, q)  # exact integers
    y = (dots * (wd.double().reshape(n, -1)[None] * dx.double()[:, None, :, 0])).sum(-1)
    if w.fmt == "q4_1":
        y = y + (wm.double().reshape(n, -1)[None] * (dx.double()[..., 0] * qx.sum(-1))[:, None, :]).sum(-1)
    return (y if bias is None else y + bias.double()).float()
