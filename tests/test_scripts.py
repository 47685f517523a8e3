"""scripts/: the measurement commands the docs quote. Each imports without running (its work under `main()`),
says in its docstring how it is run, and every script the README and docs/ name exists: a figure's command that a
refactor broke at import, or that ran on import, fails here rather than when someone reruns it."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_script_imports_without_running_and_says_how_it_is_run(path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    environ, search = dict(os.environ), list(sys.path)
    try:
        spec.loader.exec_module(module)  # a script that did its work on import would run (or fail) here
    finally:  # what a script sets up for itself on import (launch_count.py: Triton's interpreter) stays there
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = search
    assert callable(getattr(module, "main", None)), f"{path.name}: its work belongs in main()"
    assert re.search(r'^if __name__ == "__main__":\n    (sys\.exit\()?main\(\)', path.read_text(), re.M)
    assert module.__doc__ and f"scripts/{path.name}" in module.__doc__, f"{path.name}: no usage line"


def test_every_script_the_docs_name_exists():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {m for doc in texts for m in re.findall(r"scripts/([\w-]+\.(?:py|c))", doc.read_text())}
    assert named and sorted(n for n in named if not (ROOT / "scripts" / n).exists()) == []
