"""N visitors press Run at the same moment: time to each one's first figures and to its finished run, measured
through the page's own streaming endpoint (the Run button's event, joined and read as the page's browser code
does), as a browser sees them.

    python scripts/measure_concurrency.py                          # 30 users, 48 tokens, the server's defaults
    python scripts/measure_concurrency.py --active-runs 1          # first come, first served, for comparison
    python scripts/measure_concurrency.py --users 10 --url http://127.0.0.1:7860/   # a server already running
    python scripts/measure_concurrency.py --trace runs/trace   # also where the server's time went (server_log)
    python scripts/measure_concurrency.py --distinct           # no two visitors ask for the same run

Without --url it starts `python app.py` as `make run` does (EAGLEVIZ_THREADS=1, OMP_WAIT_POLICY=PASSIVE) on a
free port, with EAGLEVIZ_ACTIVE_RUNS from --active-runs when given. Users take turns through a mix of the
presets (each with its own tree), the fastest tree and a cost-aware tree, so visitors a mix apart ask for the
same run, which the server decodes once for all of them (`eagleviz/app/shared.py`, unless the server's
EAGLEVIZ_SHARE_RUNS is 0); with --distinct each visitor's prompt ends with its own number, so none do. A user's first figure is the
update that brings the first cycle's views (status "Running... cycle"); its run is done at the final update
("Done: ..."); a user without one is counted as lost. Prints one JSON object: the medians, 90th percentiles
and maxima of both times, the number done, the CPU seconds the server and the clients used while they ran,
each user's row, and where it was measured (the command, the date, the machine and what its CPU was held to:
`where_measured`).

Each client first opens the page (its load event, which creates the visitor's session, as a browser does
when the page opens), then all press Run together. The clients run in this process, on the same machine as
the server: their own work (reading the streamed updates) is included in the times.

With --trace DIR the server runs under `traced` (this script with --serve-traced DIR, the app as `python app.py`
starts it), which logs where the time goes:

    DIR/steps.jsonl   each model step (a run's prefill with its first cycle, or one cycle), taken in its turn:
                      its end (time.monotonic, the clock every process on the machine shares), its wall and CPU
                      seconds, and whether it was the run's first
    DIR/gc.jsonl      each collection of generation 1 or 2: its start and seconds (Python's `gc.callbacks`)

Wall time above CPU time is time the step waited for the interpreter lock or a core while it held the model.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagleviz.app import presets, scheduler  # noqa: E402

FIRST = "Running\u2026 cycle"


def mix() -> list[tuple[str, str, tuple[int, int, int], float, bool, str]]:
    """(label, prompt, tree, temperature, cost-aware, draft source) the users take in turn."""
    rows = [(p.name, p.prompt, p.tree, p.temperature, False, p.source) for p in presets.PRESETS]
    counting, code = presets.PRESETS[0], presets.by_name()["Code"]
    rows.append(("counting, chain 4/1/5", counting.prompt, (4, 1, 5), 0.0, False, "eagle"))
    rows.append(("code, cost-aware 5/4/16", code.prompt, (5, 4, 16), 0.0, True, "eagle"))
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def traced(out: Path) -> Iterator[None]:
    """While inside: every model step of this process's app (`scheduler.Paced`) and every collection of generation 1
    or 2, logged into `out` (steps.jsonl, gc.jsonl: the module's docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    steps, collections = (out / "steps.jsonl").open("w", buffering=1), (out / "gc.jsonl").open("w", buffering=1)
    step = scheduler.Paced.__next__

    def logged(self):
        first, busy, cpu = self._steps == 0, self.busy_s, time.thread_time()
        try:
            return step(self)
        finally:  # waiting for the turn costs no CPU: the thread's CPU time is the step's
            steps.write(json.dumps({"end": time.monotonic(), "wall": self.busy_s - busy,
                                    "cpu": time.thread_time() - cpu, "first": first}) + "\n")

    started: dict[int, float] = {}

    def collected(phase: str, info: dict) -> None:
        generation = info["generation"]
        if phase == "start":
            started[generation] = time.monotonic()
        elif generation >= 1 and generation in started:
            collections.write(json.dumps({"generation": generation, "start": started[generation],
                                          "seconds": time.monotonic() - started[generation]}) + "\n")

    scheduler.Paced.__next__ = logged
    gc.callbacks.append(collected)
    try:
        yield
    finally:
        scheduler.Paced.__next__ = step
        gc.callbacks.remove(collected)
        steps.close()
        collections.close()


def serve_traced(out: Path) -> None:
    """The app as `python app.py` starts it, under `traced(out)` (the server --trace starts)."""
    with traced(out):
        sys.argv = [str(ROOT / "app.py")]
        runpy.run_path(str(ROOT / "app.py"), run_name="__main__")


def start_server(active_runs: int | None, log: Path, trace: Path | None = None) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free port (with `trace`: under `traced`, logging into that folder)."""
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), OMP_WAIT_POLICY="PASSIVE",
               EAGLEVIZ_THREADS=os.environ.get("EAGLEVIZ_THREADS", "1"), GRADIO_ANALYTICS_ENABLED="False")
    if active_runs is not None:
        env["EAGLEVIZ_ACTIVE_RUNS"] = str(active_runs)
    entry = [__file__, "--serve-traced", str(trace)] if trace is not None else ["app.py"]
    proc = subprocess.Popen([sys.executable, *entry], cwd=ROOT, env=env, stdout=log.open("w"),
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


class Visitor:
    """One browser tab, speaking the page's own protocol: an event joins the queue (`queue/join`), its updates
    arrive on the tab's event stream (`queue/data`, server-sent events; after a generator's first update each
    output comes as a diff against the previous one). The tab keeps one HTTP connection, as a browser does.
    gradio_client would add its own costs to the server's two cores: a new HTTP client (with its TLS context,
    ~30 ms of CPU) per request, thirty of them at the same moment, and a loop that wakes every millisecond
    per job (17 s of CPU during one 45 s measurement)."""

    def __init__(self, url: str, events: dict[str, int]):
        import httpx

        self.http = httpx.Client(base_url=url + "gradio_api/", timeout=httpx.Timeout(60.0, read=None))
        self.session, self.events = uuid.uuid4().hex, events

    def call(self, api_name: str, data: list, track: tuple[int, ...],
             query: dict[str, str] | None = None) -> Iterator[dict[int, object]]:
        """The event's updates as they arrive: the tracked outputs' values after each one. `query`: the page's own
        query (`?room=CODE`), which the page's requests carry as theirs."""
        from gradio_client.utils import apply_diff

        body = {"data": data, "fn_index": self.events[api_name], "session_hash": self.session, "event_data": None}
        response = self.http.post("queue/join", params=query, json=body)
        response.raise_for_status()
        event = response.json()["event_id"]
        values: dict[int, object] | None = None
        with self.http.stream("GET", "queue/data", params={"session_hash": self.session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") != event or message["msg"] not in ("process_generating",
                                                                            "process_completed"):
                    continue
                output = message.get("output") or {}
                if not message.get("success", True) or output.get("error"):
                    raise RuntimeError(str(output.get("error") or message)[:200])
                data = output["data"]
                full = values is None or message["msg"] == "process_completed"  # the rest are diffs
                values = {i: data[i] if full else apply_diff(values[i], data[i]) for i in track}
                yield values
                if message["msg"] == "process_completed":
                    return

    def open_page(self) -> None:
        """The page's load event, as when a browser opens it: the visitor's session exists before Run."""
        for _ in self.call("opened", [], ()):
            pass


def events(url: str) -> dict[str, int]:
    """The page's events by API name (from its config)."""
    with urllib.request.urlopen(url + "config", timeout=60) as r:
        config = json.load(r)
    return {d["api_name"]: d["id"] for d in config["dependencies"] if d.get("api_name")}


def visit(visitor: Visitor, row, tokens: int, start: threading.Barrier, out: dict) -> None:
    label, prompt, (steps, topk, budget), temperature, adaptive, source = row
    start.wait()
    t0 = time.monotonic()
    out.update(label=label, first_s=None, done_s=None, tokens=0, status="")
    try:
        # The Run button's inputs: the room the tab opened and its stop flag (states: the server holds them), the
        # model pair, the prompt, the ten knobs; outputs 1 and 2 are the answer's tokens and the status line.
        knobs = [steps, topk, budget, temperature, 1.0, tokens, 0, "auto", adaptive, source]
        for update in visitor.call("run", [None, None, None, prompt, *knobs], track=(1, 2)):
            status = str(update[2])
            out["status"] = status[:120]
            if out["first_s"] is None and status.startswith(FIRST):
                out["first_s"] = round(time.monotonic() - t0, 2)
            if isinstance(update[1], list):
                out["tokens"] = len(update[1])
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


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) a process has used so far, from /proc (None where it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None


def server_log(trace: Path, since: float) -> dict:
    """What `traced` logged from `since` (time.monotonic) on: the model's steps (first steps apart) and the
    collections of generation 2."""
    def read(name: str) -> list[dict]:
        lines = (trace / name).read_text().splitlines() if (trace / name).is_file() else []
        return [row for row in map(json.loads, lines) if row.get("end", row.get("start", 0)) >= since]

    steps, full = read("steps.jsonl"), [c for c in read("gc.jsonl") if c["generation"] == 2]
    firsts = [s for s in steps if s["first"]]
    return {"steps": len(steps), "steps_wall_s": round(sum(s["wall"] for s in steps), 1),
            "steps_cpu_s": round(sum(s["cpu"] for s in steps), 1),
            "steps_span_s": round(max(s["end"] for s in steps) - min(s["end"] - s["wall"] for s in steps), 1)
            if steps else 0.0,
            "first_steps_s": stats([s["wall"] for s in firsts]),
            "last_first_step_ends_s": round(max(s["end"] for s in firsts) - since, 2) if firsts else None,
            "full_collections": [{"at_s": round(c["start"] - since, 2), "ms": round(c["seconds"] * 1e3)}
                                 for c in full]}


def measure(url: str, users: int, tokens: int, server_pid: int | None = None, trace: Path | None = None,
            distinct: bool = False) -> dict:
    page = events(url)
    clients = [Visitor(url, page) for _ in range(users)]
    for client in clients:
        client.open_page()
    rows = mix()
    if distinct:  # a run of each visitor's own: no two ask for the same (the server shares identical runs)
        rows = [(f"{label}, visitor {i}", f"{prompt} (visitor {i})", *rest)
                for i, (label, prompt, *rest) in enumerate(rows[i % len(rows)] for i in range(users))]
    results = [dict() for _ in range(users)]
    start = threading.Barrier(users)
    threads = [threading.Thread(target=visit, args=(clients[i], rows[i % len(rows)], tokens, start, results[i]))
               for i in range(users)]
    cpu0 = cpu_seconds(server_pid), sum(os.times()[:2])
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    wall = time.monotonic() - t0
    cpu1 = cpu_seconds(server_pid), sum(os.times()[:2])
    firsts = [r["first_s"] for r in results if r.get("first_s") is not None]
    dones = [r["done_s"] for r in results if r.get("done_s") is not None]
    return {"users": users, "tokens": tokens, "distinct": distinct, "done": len(dones), "lost": users - len(dones),
            "first_figure_s": stats(firsts), "done_s": stats(dones), "wall_s": round(wall, 1),
            "server_cpu_s": round(cpu1[0] - cpu0[0], 1) if None not in (cpu0[0], cpu1[0]) else None,
            "clients_cpu_s": round(cpu1[1] - cpu0[1], 1),
            **({"server_log": server_log(trace, t0)} if trace is not None else {}), "rows": results}


def where_measured(argv: list[str] | None) -> dict:
    """The command, the date, the machine (`eagleviz.perf.provenance`), what the server's CPU was held to (the
    variables that make an AVX-512 machine run as an AVX2-only one: `EAGLEVIZ_CPU=avx2` and PyTorch's own) and the
    other EAGLEVIZ_ settings (`eagleviz.app.limits`), which the started server inherits."""
    from eagleviz.perf.provenance import provenance
    from kernels import capability

    held = {k: os.environ[k] for k in ("EAGLEVIZ_CPU", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ}
    server = {k: v for k, v in os.environ.items() if k.startswith("EAGLEVIZ_") and k != "EAGLEVIZ_CPU"}
    args = sys.argv[1:] if argv is None else argv
    return {"command": " ".join(["python scripts/measure_concurrency.py", *args]), "date": time.strftime("%Y-%m-%d"),
            "held": held, "server_env": server, "cpu": capability.detect().describe(), "machine": provenance()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--tokens", type=int, default=presets.PRESET_TOKENS)
    p.add_argument("--active-runs", type=int, default=None, help="EAGLEVIZ_ACTIVE_RUNS of the started server")
    p.add_argument("--url", default=None, help="a running server instead of starting one")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--distinct", action="store_true",
                   help="each visitor's prompt its own (numbered), so no two ask for the same run")
    p.add_argument("--trace", type=Path, default=None,
                   help="start the server under `traced`, logging its model steps and collections into this "
                        "folder, and summarise them (server_log)")
    p.add_argument("--serve-traced", type=Path, default=None, help=argparse.SUPPRESS)  # the server --trace starts
    args = p.parse_args(argv)
    if args.serve_traced is not None:
        serve_traced(args.serve_traced)
        return
    if args.trace is not None and args.url is not None:
        p.error("--trace starts its own server: leave out --url")
    proc = None
    if args.url is None:
        proc, url = start_server(args.active_runs, Path(os.environ.get("TMPDIR", "/tmp")) / "eagleviz-concurrency.log",
                                 args.trace)
    else:
        url = args.url
    try:
        result = measure(url, args.users, args.tokens, proc.pid if proc is not None else None, args.trace,
                         args.distinct)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    result["active_runs"] = args.active_runs if args.active_runs is not None else "server default"
    result |= where_measured(argv)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
