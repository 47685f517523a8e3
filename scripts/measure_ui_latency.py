"""Measure the app's latency budgets (targets: first cycle's figures within 2 s of Run; stepping between
recorded cycles, picking a token, stepping through a cycle's phases and through the guided tour under 200 ms
of server time).

    python scripts/measure_ui_latency.py                 # server side only
    python scripts/measure_ui_latency.py --browser       # also click Run in headless Chromium

Server side, "first figures" is the time from calling the Run handler to the yield that carries cycle 0's
figures, plus serialising those figures to JSON (what Gradio sends). "Step" is one Next-button handler
call for every recorded cycle, "pick" one token picked in each cycle (the four figures redrawn with it
outlined), "phase" every frame of every cycle (as Play phases draws them), "tour" every stop of the guided tour on every
cycle, with the same serialisation. The browser measurement is wall time from the
click on Run until cycle 0's caption and figures are in the page and painted (network, queue, rendering
included).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

import plotly.graph_objects as go
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.app import navigation as nav
from eagleviz.app.handlers import Handlers, StopRequest
from eagleviz.app.session import EngineHub
from eagleviz.app.ui import CSS, as_pairs, build_app
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


def browser_first_figures_s(h_engine, knobs: tuple, repeats: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    demo = build_app(h_engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    times = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"http://127.0.0.1:{port}/")
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
    finally:
        demo.close()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--browser", action="store_true", help="also measure in headless Chromium (/usr/bin/chromium)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0 = torch's default); on a core shared with another busy process, "
                        "1 avoids threads waiting on a descheduled peer")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
