"""N visitors press Run at the same moment: time to each one's first figures and to its finished run, measured
through the page's own streaming endpoint (the Run button's /run event, with gradio_client), as a browser
sees them.

    python scripts/measure_concurrency.py                          # 30 users, 48 tokens, the server's defaults
    python scripts/measure_concurrency.py --active-runs 1          # first come, first served, for comparison
    python scripts/measure_concurrency.py --users 10 --url http://127.0.0.1:7860/   # a server already running

Without --url it starts `python app.py` as `make run` does (EAGLEVIZ_THREADS=1, OMP_WAIT_POLICY=PASSIVE) on a
free port, with EAGLEVIZ_ACTIVE_RUNS from --active-runs when given. Users take turns through a mix of the
presets (each with its own tree), the fastest tree and a cost-aware tree. A user's first figure is the
update that brings the first cycle's views (status "Running... cycle"); its run is done at the final update
("Done: ..."); a user without one is counted as lost. Prints one JSON object: the medians, 90th percentiles
and maxima of both times, the number done, and each user's row. The clients run in this process, on the
same machine as the server: their own work (reading the streamed figures) is included in the times.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleviz.app import presets  # noqa: E402

FIRST = "Running\u2026 cycle"


def mix() -> list[tuple[str, str, tuple[int, int, int], float, bool]]:
    """(label, prompt, tree, temperature, cost-aware) the users take in turn."""
    rows = [(p.name, p.prompt, p.tree, p.temperature, False) for p in presets.PRESETS]
    counting, code = presets.PRESETS[0], presets.by_name()["Code"]
    rows.append(("counting, chain 4/1/5", counting.prompt, (4, 1, 5), 0.0, False))
    rows.append(("code, cost-aware 5/4/16", code.prompt, (5, 4, 16), 0.0, True))
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(active_runs: int | None, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), OMP_WAIT_POLICY="PASSIVE",
               EAGLEVIZ_THREADS=os.environ.get("EAGLEVIZ_THREADS", "1"), GRADIO_ANALYTICS_ENABLED="False")
    if active_runs is not None:
        env["EAGLEVIZ_ACTIVE_RUNS"] = str(active_runs)
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return proc, url
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("app.py did not start within 10 minutes")


def visit(client, row, tokens: int, start: threading.Barrier, out: dict) -> None:
    label, prompt, (steps, topk, budget), temperature, adaptive = row
    start.wait()
    t0 = time.monotonic()
    out.update(label=label, first_s=None, done_s=None, tokens=0, status="")
    try:
        job = client.submit(None, prompt, steps, topk, budget, temperature, 1.0, tokens, 0, "auto", adaptive, "eagle",
                            api_name="/run")
        for update in job:
            status = str(update[1])
            out["status"] = status[:120]
            if out["first_s"] is None and status.startswith(FIRST):
                out["first_s"] = round(time.monotonic() - t0, 2)
            if isinstance(update[0], list):
                out["tokens"] = len(update[0])
        if out["status"].startswith("Done"):
            out["done_s"] = round(time.monotonic() - t0, 2)
    except Exception as exc:  # a refused or failed request: counted as lost, with its message
        out["status"] = f"error: {exc}"[:200]


def stats(values: list[float]) -> dict:
    if not values:
        return {}
    values = sorted(values)
    return {"median": round(statistics.median(values), 2), "p90": round(values[int(0.9 * (len(values) - 1))], 2),
            "max": round(values[-1], 2)}


def measure(url: str, users: int, tokens: int) -> dict:
    from gradio_client import Client

    clients = [Client(url, verbose=False) for _ in range(users)]
    rows = mix()
    results = [dict() for _ in range(users)]
    start = threading.Barrier(users)
    threads = [threading.Thread(target=visit, args=(clients[i], rows[i % len(rows)], tokens, start, results[i]))
               for i in range(users)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    firsts = [r["first_s"] for r in results if r.get("first_s") is not None]
    dones = [r["done_s"] for r in results if r.get("done_s") is not None]
    return {"users": users, "tokens": tokens, "done": len(dones), "lost": users - len(dones),
            "first_figure_s": stats(firsts), "done_s": stats(dones), "wall_s": round(time.monotonic() - t0, 1),
            "rows": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--tokens", type=int, default=presets.PRESET_TOKENS)
    p.add_argument("--active-runs", type=int, default=None, help="EAGLEVIZ_ACTIVE_RUNS of the started server")
    p.add_argument("--url", default=None, help="a running server instead of starting one")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    proc = None
    if args.url is None:
        proc, url = start_server(args.active_runs, Path(os.environ.get("TMPDIR", "/tmp")) / "eagleviz-concurrency.log")
    else:
        url = args.url
    try:
        result = measure(url, args.users, args.tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    result["active_runs"] = args.active_runs if args.active_runs is not None else "server default"
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
