"""Where a measurement comes from: the code that ran (its commit, and whether the checkout held changes), the
machine (the CPU's model and the vector flags a speed depends on, the GPU) and the versions of what computed it.
Every result a command writes for committing records it (`bench`, `ceiling`, `tune`, `lossless`, `fingerprint`,
`gpu-check`), so that a figure quoted from it can say which code and machine it describes.

    provenance(device)  {"commit", "dirty", "cpu_model", "cpu_flags", "gpu", "versions"}
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parent  # eagleviz/perf: a git checkout's, or an installed wheel's
# The /proc/cpuinfo flags that change which kernels run: vector width, dot products, native bf16, matrix tiles.
SPEED_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile",
               "amx_bf16", "amx_int8")
PACKAGES = ("torch", "transformers", "triton", "numpy")


def code_version(where: Path = PACKAGE) -> dict:
    """{"commit": HEAD of the git checkout that holds `where` (None where git does not track it, e.g. an installed
    wheel, even one inside a checkout's .venv), "dirty": whether tracked files differ from it (None when
    unknown)}."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    tracked = git("ls-files", "--error-unmatch", ".") is not None  # fails outside a checkout, or untracked in one
    commit = git("rev-parse", "HEAD") if tracked else None
    if commit is None:
        return {"commit": None, "dirty": None}
    changes = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if changes is None else changes != ""}


def cpu_identity(cpuinfo: str | None = None) -> dict:
    """{"cpu_model": the first "model name" of /proc/cpuinfo (the platform's processor name elsewhere),
    "cpu_flags": those of SPEED_FLAGS it lists, in that order}."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name") or platform.processor() or platform.machine(),
            "cpu_flags": [f for f in SPEED_FLAGS if f in flags]}


def versions() -> dict:
    """Python's and each of PACKAGES' version (None where one is not installed)."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["torch"] = torch.__version__  # the build, e.g. 2.13.0+cpu, as imported
    return found


def provenance(device: torch.device | str = "cpu") -> dict:
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return code_version() | cpu_identity() | {"gpu": gpu, "versions": versions()}
