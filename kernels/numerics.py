"""Which numerics a committed result was measured with: a version of the C code a forward from weight blocks runs.

    numerics_version()   16 hex digits: the SHA-256 of kernels/cpu_ops.c, quant_ops.c and stack_ops.c with their
                         comments and whitespace removed, and of the flags each is compiled with

A result that depends on the last bits of a forward (the bitwise losslessness of every tree over 80 prompts,
the int8 activations' accuracy against fp32) records this version; its test fails when the code's arithmetic
or its flags change and the result was not measured again. Comments, blank lines and indentation change
nothing. The CPU's vector unit does not enter: those sums are the same on every CPU
(`tests/test_fingerprint.py` holds that end to end).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from kernels import cpu_ops, quant_ops, stack_ops

SOURCES = ((cpu_ops.SOURCE, cpu_ops.FLAGS), (quant_ops.SOURCE, quant_ops.FLAGS), (stack_ops.SOURCE, stack_ops.FLAGS))
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def code_of(source: str) -> str:
    """C source without its comments and whitespace (string literals in these files hold no comment markers)."""
    return re.sub(r"\s+", "", _COMMENT.sub(" ", source))


def numerics_version(sources: tuple[tuple[Path, tuple[str, ...]], ...] = SOURCES) -> str:
    digest = hashlib.sha256()
    for path, flags in sources:
        digest.update(path.name.encode() + b"\0" + code_of(path.read_text()).encode() + b"\0" + repr(flags).encode())
    return digest.hexdigest()[:16]
