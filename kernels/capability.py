"""What this CPU and this torch build can do, decided once: the one place every choice that depends on the
machine asks (the dtype `auto` picks, whether `Dense` packs bf16 weights for oneDNN, how the C operations are
compiled, which gpu-check parts run, which tests skip).

    bf16_packing   oneDNN packs bf16 weights (`torch.ops.mkldnn._reorder_linear_weight`). PyTorch allows it only
                   with AVX-512 BW/VL/DQ or AVX-NE-CONVERT (x86) or the Arm bf16 extension; on an AVX2-only CPU it
                   raises "bf16 path needs the cpu support ...". Probed, not inferred: one tiny reorder.
    native_bf16    bf16 dot products in hardware (AVX512-BF16, AMX-BF16, Arm BF16), where bf16 matmuls beat fp32.
    vector_isa     the widest vector unit torch's own CPU kernels use ("AVX512", "AVX2", "DEFAULT", ...).
    compiler       the C compiler the fused CPU operations are built with (`CC`, default `cc`), or None.
    triton         whether the triton package is importable (Linux wheels only).

`EAGLEVIZ_CPU=avx2` makes this machine answer as an AVX2-only x86 CPU would (no bf16 packing, no native bf16,
AVX2 vectors, C code compiled for Haswell), so the suite can be run as such a CPU runs it on a machine that has
AVX-512. For the libraries underneath to behave the same, `ATEN_CPU_CAPABILITY=avx2`,
`ONEDNN_MAX_CPU_ISA=AVX2` and `MKL_ENABLE_INSTRUCTIONS=AVX2` must be set before torch starts:
`emulation_environment` gives them all (the test suite's conftest and `make test-avx2` set them).
`EAGLEVIZ_CPU=x86-64` goes further down: no vector extension past SSE4, C code built for plain x86-64 (its
portable fallbacks). An override only removes abilities; it never claims one the machine lacks.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shlex
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

OVERRIDE = "EAGLEVIZ_CPU"
EMULATIONS = {  # override value -> the environment that makes torch, oneDNN and MKL dispatch as that CPU would
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    # no vector extension past SSE4: the C code's plain-C fallbacks (the blocks' products, the layer, the stack)
    "x86-64": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
EMULATED_MARCH = {"avx2": "haswell", "x86-64": "x86-64"}  # -march for the C operations under an emulation
# What an emulated pass still tests where this CPU's own is already the emulated one (`second_pass`): the C code,
# compiled for the emulated -march rather than this CPU's (the whole model's tokens under it: tests/test_fingerprint.py)
EMULATED_BUILD_TESTS = ("tests/test_capability.py", "tests/test_cpu_ops.py", "tests/test_quant_ops.py",
                        "tests/test_stack_ops.py", "tests/test_sample_ops.py")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 /proc/cpuinfo flags
ARM_BF16_FLAG = "bf16"  # aarch64 /proc/cpuinfo Features


@dataclass(frozen=True)
class Capability:
    """What the machine can do (see the module docstring for each field)."""

    cpu_name: str
    vector_isa: str
    bf16_packing: bool
    native_bf16: bool
    compiler: str | None
    triton: bool
    emulating: str | None = None  # the `EAGLEVIZ_CPU` value in force, if any

    @property
    def march(self) -> str:
        """The `-march` the C operations are compiled with: this CPU's own, or the emulated one."""
        return EMULATED_MARCH.get(self.emulating or "", "native")

    def describe(self) -> str:
        """One line a speed figure (and a bf16 result) depends on, e.g. "AMD EPYC, AVX512, native bf16"."""
        emulated = f" (emulating {self.emulating})" if self.emulating else ""
        return f"{self.cpu_name}, {self.vector_isa}, {'' if self.native_bf16 else 'no '}native bf16{emulated}"

    def why_not_bf16(self) -> str | None:
        """Why bf16 weights run unpacked here (None when they pack)."""
        if self.bf16_packing:
            return None
        if self.emulating:
            return f"{OVERRIDE}={self.emulating} emulates a CPU whose oneDNN refuses bf16 weight packing"
        return ("this CPU lacks AVX-512 BW/VL/DQ and AVX-NE-CONVERT, so oneDNN refuses bf16 weight packing "
                "(bf16 runs unpacked and slowly; float32 is faster here)")


def emulation_environment(name: str) -> dict[str, str]:
    """The environment variables that make a process run as the CPU `name` (a key of `EMULATIONS`)."""
    if name not in EMULATIONS:
        raise ValueError(f"{OVERRIDE}={name!r}: known emulations are {sorted(EMULATIONS)}")
    return {OVERRIDE: name, **EMULATIONS[name]}


@functools.cache
def detect() -> Capability:
    """This process's answer, computed on first use (a few milliseconds) and the same ever after."""
    emulating = os.environ.get(OVERRIDE, "").strip().lower() or None
    if emulating is not None and emulating not in EMULATIONS:
        raise ValueError(f"{OVERRIDE}={emulating!r}: known emulations are {sorted(EMULATIONS)}")
    flags = _cpu_flags()
    native = bool(flags & set(NATIVE_BF16_FLAGS)) or (platform.machine() in ("aarch64", "arm64")
                                                     and ARM_BF16_FLAG in flags)
    import torch  # here, so that a test run can import this module and set its environment before torch starts

    isa = torch.backends.cpu.get_cpu_capability()
    if emulating is not None:
        native = False
        if isa not in (("AVX2", "DEFAULT") if emulating == "avx2" else ("DEFAULT",)):
            settings = " ".join(f"{k}={v}" for k, v in EMULATIONS[emulating].items())
            warnings.warn(f"{OVERRIDE}={emulating} without {settings} set before torch started: torch's own kernels "
                          f"still use {isa}", RuntimeWarning, stacklevel=2)
    return Capability(cpu_name=_cpu_name(), vector_isa=isa, bf16_packing=emulating is None and _probe_bf16_packing(),
                      native_bf16=native, compiler=c_compiler(), triton=_has_triton(), emulating=emulating)


def _cpu_flags() -> frozenset[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return frozenset()
    line = next((ln for ln in lines if ln.startswith(("flags", "Features"))), "")
    return frozenset(line.split(":", 1)[-1].split())


def _cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return name
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), name)


def _probe_bf16_packing() -> bool:
    """One 16 x 16 reorder: the call oneDNN refuses on a CPU without the bf16 instructions it needs."""
    import torch

    mkldnn = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise")):
        return False
    try:
        mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def c_compiler() -> str | None:
    """The C compiler the kernels are built with (CC, default cc), as a path; None where there is none."""
    command = shlex.split(os.environ.get("CC", "cc") or "cc")
    return shutil.which(command[0]) if command else None


def _has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except ValueError:  # a test run that blocks it with sys.modules["triton"] = None
        return False


def second_pass(name: str, tests: list[str]) -> list[str]:
    """The suites an emulated pass of `tests` (as the CPU `name` runs them) needs on this machine: all of them,
    unless this CPU already is that CPU for torch, oneDNN and MKL (its own vector unit the emulated one's and no
    bf16 packing, e.g. an AVX2-only AMD EPYC under `avx2`), where the first pass ran every suite as such a CPU runs
    it and only the C code's other -march is left (`EMULATED_BUILD_TESTS`)."""
    import torch

    own = torch.backends.cpu.get_cpu_capability()
    same = {"avx2": own == "AVX2", "x86-64": own == "DEFAULT"}.get(name, False) and not _probe_bf16_packing()
    return [t for t in tests if t in EMULATED_BUILD_TESTS] if same else list(tests)


if __name__ == "__main__":  # `python -m kernels.capability second-pass avx2 TESTS...`: the Makefile's second pass
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "second-pass":
        sys.exit("usage: python -m kernels.capability second-pass EMULATION TESTS...")
    keep = second_pass(sys.argv[2], sys.argv[3:])
    if len(keep) < len(sys.argv) - 3:
        print(f"note: this CPU runs as {OVERRIDE}={sys.argv[2]} emulates ({detect().describe()}): the first pass "
              f"ran those suites as such a CPU runs them; the second runs those of the C code built for it",
              file=sys.stderr)
    print(" ".join(keep))
