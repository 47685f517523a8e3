"""Measure the app's latency budgets (targets: first cycle's figures within 2 s of Run; stepping between
recorded cycles, picking a token, stepping through a cycle's phases and through the guided tour under 200 ms
of server time).

    python scripts/measure_ui_latency.py                 # server side only
    python scripts/measure_ui_latency.py --browser       # also click Run in headless Chromium
    python scripts/measure_ui_latency.py --room 30       # a room: the instructor's click to 30 followers' pictures

Server side, "first figures" is the time from calling the Run handler to the yield that carries cycle 0's
figures, plus serialising those figures to JSON (what Gradio sends). "Step" is one Next-button handler
call for every recorded cycle, "pick" one token picked in each cycle (the four figures redrawn with it
outlined), "phase" every frame of every cycle (as Play phases draws them), "tour" every stop of the guided tour on every
cycle, with the same serialisation. The browser measurement is wall time from the
click on Run until cycle 0's caption and figures are in the page and painted (network, queue, rendering
included).

`--room N` measures only a room (target: under 1 s from the instructor's click to each follower's picture, median
and max). The app runs in this process; the instructor is a headless Chromium page on a recorded run
(`?gallery=story`) that opens a room and clicks Next `--clicks` times. N followers are HTTP clients in a child
process (so that their work does not hold this process's interpreter), each speaking the follower page's own
protocol: it joins with the page's load event (`queue/join?room=CODE`, its session holding the room), then starts
the stream the page starts when the joined room's code is set (`queue/join`, read on the session's `queue/data`
server-sent events, each update after the first a diff against the one before, as the page applies them), and
reads the pictures the server pushes on it until the end. They do not send the two small events the page sends
after a picture (the room line and the tour line). `--pages` more followers are real Chromium pages
(`?room=CODE`). Every follower, HTTP client or page, has the room's first picture drawn before the first click.
A click's time is the click event's in the instructor's page; "click" is Playwright's own work before it
(scrolling, waiting for the button to hold still), counted in none of the figures. Per click and follower:
  server+network  (HTTP followers) the click until the new cycle's picture (caption and figures) is read and
                  parsed: the instructor's own event (Next, which tells the room), the server drawing the picture
                  once and pushing it to every follower, its transfer.
  browser paint   (pages) from the page's read of the picture's update off its event stream to the first animation
                  frame after the caption and the four views show the new cycle: Gradio applying the update, Plotly
                  drawing the four views (and the summary, where it is drawn first), the paint.
  end to end      (pages) the click until that frame: what a student sees.
Everything shares this machine: the server, the instructor's and the followers' Chromium pages and the HTTP
clients, so the figures are an upper bound for a class whose laptops draw their own pictures.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import plotly.graph_objects as go
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.app import navigation as nav
from eagleviz.app.handlers import Handlers, StopRequest
from eagleviz.app.session import EngineHub
from eagleviz.app.ui import PAGE, as_pairs, build_app
from eagleviz.app.workshop import TOUR_VIEWS
from eagleviz.visuals.phases import frames

PROMPT = "Write a Python function that returns the factorial of n, with a docstring."
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def serialise(values) -> None:
    """What Gradio does to the figures of an update before sending it."""
    for v in values:
        if isinstance(v, go.Figure):
            v.to_json()


def first_figures_s(h: Handlers, knobs: tuple) -> tuple[float, object]:
    start = time.perf_counter()
    first, run = None, None
    for out in h.run(StopRequest(), None, PROMPT, *knobs):
        run = out[0]
        if first is None and isinstance(out[9], str) and out[9].startswith("**Cycle 0**"):
            serialise(out)
            first = time.perf_counter() - start
    return first, run


def step_ms(run) -> list[float]:
    times = []
    for i in range(len(run.cycles)):
        start = time.perf_counter()
        serialise(nav.step(run, i, +1))
        times.append((time.perf_counter() - start) * 1e3)
    return times


def pick_ms(run) -> list[float]:
    times = []
    for i in range(len(run.cycles)):
        start = time.perf_counter()
        serialise(nav.token_selected(run, i, None, nav.gr.SelectData(None, {"index": 1, "value": ""})))
        times.append((time.perf_counter() - start) * 1e3)
    return times


def phase_ms(run) -> list[float]:
    times = []
    for i, cycle in enumerate(run.cycles):
        for frame in range(len(frames(cycle))):
            start = time.perf_counter()
            serialise(nav.phase_chosen(run, i, frame, 1))
            times.append((time.perf_counter() - start) * 1e3)
    return times


def tour_ms(run) -> list[float]:
    """Every stop of the guided tour on every cycle, forward (its text and the four figures at its phase)."""
    times = []
    for i in range(len(run.cycles)):
        for stop in range(len(nav.TOUR)):
            start = time.perf_counter()
            serialise(nav.tour(run, i, stop, +1))
            times.append((time.perf_counter() - start) * 1e3)
    return times


def describe(name: str, times: list[float]) -> str:
    times = sorted(times)
    return (f"server: {name}: median {statistics.median(times):.0f} ms, p95 {times[int(0.95 * (len(times) - 1))]:.0f} "
            f"ms, max {times[-1]:.0f} ms over {len(times)}")


@contextmanager
def serving(engine) -> Iterator[str]:
    """The app on a free localhost port, in this process: its URL, closed afterwards."""
    demo = build_app(engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **PAGE)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def browser_first_figures_s(h_engine, knobs: tuple, repeats: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with serving(h_engine) as url:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(url)
            page.wait_for_selector("#run")
            box = page.locator("#max-new-tokens input[type=number]").first
            box.fill(str(knobs[5]))
            box.press("Enter")
            for _ in range(repeats):
                start = time.perf_counter()
                page.click("#run")
                # While streaming, cycle 0's caption reads "Cycle 0 of 1"; it arrives with the figures.
                page.wait_for_function("() => document.querySelector('#cycle-caption').innerText"
                                       ".startsWith('Cycle 0 of 1 ') && document.querySelector("
                                       "'#draft-tree .js-plotly-plot')", timeout=120_000)
                page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")  # painted
                times.append(time.perf_counter() - start)
                page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Done')",
                                       timeout=300_000)
            browser.close()
    return times


# ---------------------------------------------------------------- a room: the instructor's click to the followers

# In a follower page, before Gradio's code runs: the time of each large read off a stream (epoch ms), as Gradio's
# client reads its event stream's messages (the picture's update is the one large message; Resource Timing has no
# time for a message inside a stream that stays open).
READS_JS = """(() => { const read = ReadableStreamDefaultReader.prototype.read;
  ReadableStreamDefaultReader.prototype.read = function () { return read.call(this).then(r => {
    if (r.value && r.value.length > 10000) window.__read = performance.timeOrigin + performance.now();
    return r; }); }; })()"""
# In a follower page: at the first animation frame whose caption and four views show cycle `k`, wait one frame more
# (the paint) and keep that time, with the last large read off the event stream before it (epoch ms).
WATCH_JS = """(k) => {
  window.__painted = null; window.__read = null;
  const now = () => performance.timeOrigin + performance.now();
  const drawn = (id) => { const g = document.querySelector('#' + id + ' .js-plotly-plot');
    return ((g && g.layout && g.layout.title && g.layout.title.text) || '').startsWith(`Cycle ${k} `); };
  const shown = () => {
    const c = document.querySelector('#cycle-caption .prose');
    return %s.every(drawn) && c !== null && c.innerText.includes(`Cycle ${k} of`); };
  const loop = () => {
    if (!shown()) { requestAnimationFrame(loop); return; }
    const arrived = window.__read;
    requestAnimationFrame(() => { window.__painted = {painted: now(), arrived}; }); };
  requestAnimationFrame(loop); }""" % json.dumps(TOUR_VIEWS)
# In the instructor's page: the time of each click as the page sees it (epoch ms), the moment the instructor's click
# is: Playwright's own work before it (scrolling, waiting for the button to hold still) is not the app's.
CLICKS_JS = ("() => document.addEventListener('click', e => { window.__clicked = performance.timeOrigin + e.timeStamp; }, "
             "true)")
PROSE_JS = "(id) => { const e = document.querySelector('#' + id + ' .prose'); return e ? e.innerText.trim() : ''; }"


def room_events(url: str) -> dict:
    """The follower's two events, found in the page's config as its browser code finds them: the load event that
    joins the room (its outputs include the follow row) and the stream the joined room's code starts (a change
    event whose outputs include the follow line), with the output of the stream that carries the cycle's caption."""
    with urllib.request.urlopen(url + "config", timeout=60) as r:
        config = json.load(r)
    elem = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}

    def event(trigger: str, output: str) -> dict:
        return next(d for d in config["dependencies"] if any(t[1] == trigger for t in d["targets"])
                    and output in [elem.get(o) for o in d["outputs"]])

    join, stream = event("load", "follow-row"), event("change", "follow-text")
    return {"join": join["id"], "stream": stream["id"],
            "caption": [elem.get(o) for o in stream["outputs"]].index("cycle-caption")}


def follow_over_http(spec: dict) -> None:
    """The HTTP followers (run in a child process): one line of JSON on stdout per follower once it has joined, and
    one per picture it receives (`at`: epoch seconds once read and parsed), until stdin closes."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from measure_concurrency import Visitor

    lock = threading.Lock()

    def say(row: dict) -> None:
        with lock:
            print(json.dumps(row), flush=True)

    def follower(i: int) -> None:
        visitor = Visitor(spec["url"], {"join": spec["join"], "stream": spec["stream"]})
        query = {"room": spec["code"]}
        for _ in visitor.call("join", [], (), query=query):
            pass
        say({"joined": i})
        caption = None
        # The stream's inputs: the room joined (a state: the server holds it) and the follow switch, on.
        for values in visitor.call("stream", [None, True], (spec["caption"],), query=query):
            if values[spec["caption"]] != caption:   # a picture (a version already drawn leaves the caption)
                caption = values[spec["caption"]]
                say({"follower": i, "at": time.time(), "caption": caption})

    for i in range(spec["followers"]):
        threading.Thread(target=follower, args=(i,), daemon=True).start()
    sys.stdin.read()


def cycle_shown(page) -> tuple[int, int]:
    """The cycle a page shows and its run's cycles, from its caption ("Cycle k of n")."""
    words = page.evaluate(PROSE_JS, "cycle-caption").split()
    return int(words[1]), int(words[3])


def room_latency(engine, followers: int, pages: int, clicks: int) -> dict[str, list[float]]:
    """Seconds per click and follower: 'server+network' (HTTP followers), 'browser paint' and 'end to end'
    (pages); per click, 'click' (Playwright's own work before the click event, counted in none of them)."""
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {"server+network": [], "browser paint": [], "end to end": [], "click": []}
    with serving(engine) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        teacher = browser.new_page(viewport={"width": 1280, "height": 800})
        teacher.goto(url + "?gallery=story")
        teacher.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
        teacher.get_by_text("Workshop: recorded runs").first.click()
        teacher.click("#open-room")
        teacher.wait_for_function(f"() => ({PROSE_JS})('room-text').startsWith('Room')")
        teacher.evaluate(CLICKS_JS)
        code = teacher.locator("#room-text a").first.get_attribute("href").removeprefix("?room=")
        spec = {"url": url, "code": code, "followers": followers, **room_events(url)}
        child = subprocess.Popen([sys.executable, __file__, "--follow-spec", json.dumps(spec)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        rows: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [rows.put(json.loads(line)) for line in child.stdout], daemon=True).start()
        try:
            tabs = [browser.new_page(viewport={"width": 1280, "height": 800}) for _ in range(pages)]
            for tab in tabs:
                tab.add_init_script(READS_JS)
                tab.goto(url + f"?room={code}")
                tab.wait_for_function(f"() => ({PROSE_JS})('follow-text').startsWith('Following room')",
                                      timeout=60_000)
            pictured: set[int] = set()
            while len(pictured) < followers:   # every HTTP follower has joined and drawn the room's first picture
                row = rows.get(timeout=120)
                pictured |= {row["follower"]} if "follower" in row else set()
            for tab in tabs:   # and every page has drawn it: the class is looking at the picture when the click comes
                tab.evaluate(WATCH_JS, cycle_shown(teacher)[0])
                tab.wait_for_function("() => window.__painted", timeout=60_000)
            time.sleep(1.0)
            for _ in range(clicks):
                k, n = cycle_shown(teacher)
                button, k = ("#next", k + 1) if k + 1 < n else ("#prev", k - 1)
                for tab in tabs:
                    tab.evaluate(WATCH_JS, k)
                before = time.time()
                teacher.click(button)
                start = teacher.evaluate("() => window.__clicked") / 1e3
                out["click"].append(start - before)
                seen: dict[int, dict] = {}
                while len(seen) < followers:
                    row = rows.get(timeout=60)
                    if "follower" in row and row["at"] > start and f"**Cycle {k}**" in row["caption"]:
                        seen.setdefault(row["follower"], row)
                out["server+network"] += [r["at"] - start for r in seen.values()]
                for tab in tabs:
                    tab.wait_for_function("() => window.__painted", timeout=60_000)
                    shown = tab.evaluate("() => window.__painted")
                    out["end to end"].append(shown["painted"] / 1e3 - start)
                    if shown["arrived"] is not None:
                        out["browser paint"].append((shown["painted"] - shown["arrived"]) / 1e3)
                time.sleep(random.uniform(0.5, 1.0))
        finally:
            child.stdin.close()
            child.wait(timeout=60)
            browser.close()
    return out


def room_stats(times: list[float]) -> dict:
    """{"median", "p90", "max", "n"} of a series in seconds ({"n": 0} when it is empty)."""
    v = sorted(times)
    return {"median": statistics.median(v), "p90": v[int(0.9 * (len(v) - 1))], "max": v[-1], "n": len(v)} if v \
        else {"n": 0}


def room_summary(times: dict[str, list[float]], followers: int, pages: int, clicks: int, command: str) -> dict:
    """What `--room --out FILE` writes: per series its median, p90 and max in seconds and every value, with the
    room's size, the command, the date and where it ran (`eagleviz.perf.provenance`)."""
    from eagleviz.perf.provenance import provenance

    def stats(values: list[float]) -> dict:
        found = {k: v if k == "n" else round(v, 3) for k, v in room_stats(values).items()}
        return found | {"values": [round(x, 4) for x in values]} if values else found

    return {"followers": followers, "pages": pages, "clicks": clicks, "command": command,
            "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), "machine": provenance(),
            "series": {name: stats(values) for name, values in times.items()}}


def describe_room(name: str, times: list[float]) -> str:
    if not times:
        return f"room: {name}: nothing measured"
    s = room_stats(times)
    return f"room: {name}: median {s['median']:.2f} s, p90 {s['p90']:.2f} s, max {s['max']:.2f} s over {s['n']}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--browser", action="store_true", help="also measure in headless Chromium (/usr/bin/chromium)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = torch's default); on a core shared with another busy process, "
                        "1 avoids threads waiting on a descheduled peer")
    p.add_argument("--room", type=int, default=0, metavar="N",
                   help="measure only a room with N followers over HTTP (and --pages followers in Chromium)")
    p.add_argument("--pages", type=int, default=2, help="with --room: followers that are Chromium pages")
    p.add_argument("--clicks", type=int, default=5, help="with --room: the instructor's clicks on Next")
    p.add_argument("--out", help="with --room: write the figures as JSON to this file (room_summary)")
    p.add_argument("--follow-spec", help=argparse.SUPPRESS)   # the HTTP followers' child process
    args = p.parse_args()
    if args.follow_spec:
        follow_over_http(json.loads(args.follow_spec))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.room:
        times = room_latency(load_engine, args.room, args.pages, args.clicks)   # a factory: no model work here
        print(f"room: {args.room} followers over HTTP, {args.pages} in Chromium, {args.clicks} clicks, pushed")
        for name, values in times.items():
            print(describe_room(name, values))
        if args.out:
            command = "python scripts/measure_ui_latency.py " + " ".join(sys.argv[1:])
            summary = room_summary(times, args.room, args.pages, args.clicks, command)
            Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
            print(f"written to {args.out}")
        return
    engine = load_engine()
    engine.generate("Hello", TreeConfig.create(), SamplingConfig(max_new_tokens=4))  # as app.py does at start-up
    hub = EngineHub(engine)
    h = Handlers(as_pairs(hub))
    knobs = (5, 4, 16, 0.0, 1.0, args.max_new_tokens, 0, "auto")
    firsts, steps, picks, phases, tours = [], [], [], [], []
    for _ in range(args.repeats):
        first, run = first_figures_s(h, knobs)
        firsts.append(first)
        steps += step_ms(run)
        picks += pick_ms(run)
        phases += phase_ms(run)
        tours += tour_ms(run)
    print(f"engine: {engine.target.name}, {engine.target.dtype}, {torch.get_num_threads()} threads, head "
          f"{engine.head_name}; knobs steps=5 topk=4 "
          f"draft_tokens=16, {args.max_new_tokens} new tokens, {len(run.cycles)} cycles per run")
    print(f"server: first cycle's figures after Run: median {statistics.median(firsts):.2f} s "
          f"(runs: {', '.join(f'{t:.2f}' for t in firsts)})")
    print(describe("step between cycles", steps))
    print(describe("pick a token (four figures outlined)", picks))
    print(describe("one phase of a cycle", phases))
    print(describe("one stop of the guided tour", tours))
    if args.browser:
        times = browser_first_figures_s(hub, knobs, args.repeats)
        print(f"browser: Run click to cycle 0's draft tree: median {statistics.median(times):.2f} s "
              f"(runs: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
