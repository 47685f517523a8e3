"""Which numerics a committed result was measured with: versions of the code its numbers come from.

    numerics_version()   16 hex digits: the SHA-256 of kernels/cpu_ops.c, quant_ops.c and stack_ops.c with their
                         comments and whitespace removed, and of the flags each is compiled with: the forward
                         from weight blocks (what the int8 activations' accuracy against fp32 depends on)
    numerics_version(sources, python)   the same over other C files and Python modules (`python_code_of`:
                         their code, docstrings and comments aside); `eagleviz.perf.lossless.lossless_version`
                         adds kernels/sample_ops.c (the argmax and draws) and the engine's Python

A result that depends on the last bits of a forward (the bitwise losslessness of every tree over 80 prompts,
the int8 activations' accuracy against fp32) records its version; its test fails when the code's arithmetic
or its flags change and the result was not measured again. Comments, docstrings, blank lines and indentation
change nothing. The CPU's vector unit does not enter: those sums are the same on every CPU
(`tests/test_fingerprint.py` holds that end to end).
"""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

from kernels import cpu_ops, quant_ops, stack_ops

SOURCES = ((cpu_ops.SOURCE, cpu_ops.FLAGS), (quant_ops.SOURCE, quant_ops.FLAGS), (stack_ops.SOURCE, stack_ops.FLAGS))
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def code_of(source: str) -> str:
    """C source without its comments and whitespace (string literals in these files hold no comment markers)."""
    return re.sub(r"\s+", "", _COMMENT.sub(" ", source))


def python_code_of(source: str) -> str:
    """A Python module's code as its syntax tree, without docstrings (comments and layout never reach the tree)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def numerics_version(sources: tuple[tuple[Path, tuple[str, ...]], ...] = SOURCES,
                     python: tuple[Path, ...] = ()) -> str:
    digest = hashlib.sha256()
    for path, flags in sources:
        digest.update(path.name.encode() + b"\0" + code_of(path.read_text()).encode() + b"\0" + repr(flags).encode())
    for path in python:
        digest.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + python_code_of(path.read_text()).encode())
    return digest.hexdigest()[:16]
