#!/usr/bin/env python3
"""What a room's move costs for its followers, each part alone, two forms timed in turn (docs/performance.md entry 71).

    python scripts/follower_costs.py push      # the server: Gradio's postprocessing of every follower's push a move
    python scripts/follower_costs.py redraw    # a page: the four views redrawn by Plotly.react in Chromium a step

push: a room on the recorded "story" run with --followers streams (`workshop.room_followed`), moved --moves
cycles; each move's pushes are postprocessed by the page's own follow event (`Blocks.postprocess_data`) as sent
(a slider that only moves goes as its bare value) and with the slider as a component update, in turn, --rounds
times; prints the median milliseconds a move for all followers in each form.
redraw: the four views of --cycles cycles of the run, drawn by the `plotly` package's Plotly.js in headless
Chromium at the views' width and stepped through with `Plotly.react`, with the axes as the page sets them
(`ticklabeloverflow` "allow") and with Plotly's default, in turn, --rounds rounds; prints the median milliseconds a
step for the four views in each form.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUN = "story"
VIEW_WIDTH = 600  # px: a view's width on a 1280 px page, two side by side


def push_ms(followers: int, moves: int, rounds: int) -> dict[str, float]:
    """Median ms a move to postprocess every follower's push: 'as sent' and 'slider as an update'."""
    from gradio.state_holder import SessionState

    from eagleviz.app import gallery, workshop
    from eagleviz.app.handlers import cycle_slider
    from eagleviz.app.rooms import Rooms
    from eagleviz.app.ui import build_app

    rooms, run = Rooms(), gallery.load(RUN)
    demo = build_app(lambda: None, rooms=rooms)   # the page's events; no model is loaded for them
    fn = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "room_followed")
    slider_at = 2   # run state, output, slider, ...: the follow event's outputs
    times: dict[str, list[float]] = {"as sent": [], "slider as an update": []}

    async def follow() -> None:
        code = workshop.room_opened(rooms, run, 0, None, None)[0]
        streams = [workshop.room_followed(rooms, code, True, f"page{i}", fn.outputs[1:-1]) for i in range(followers)]
        states = [SessionState(demo) for _ in streams]
        for stream, state in zip(streams, states):   # each page's first picture
            await demo.postprocess_data(fn, list(await stream.__anext__()), state)
        for move in range(1, moves + 1):
            workshop.room_shown(rooms, code, run, move % len(run.cycles), None, None)
            sent = [list(await stream.__anext__()) for stream in streams]
            update = [[cycle_slider(run, v) if j == slider_at and type(v) is int else v for j, v in enumerate(out)]
                      for out in sent]
            for r in range(rounds):
                for form, outs in (("as sent", sent), ("slider as an update", update))[::1 if r % 2 == 0 else -1]:
                    start = time.perf_counter()
                    for state, out in zip(states, outs):
                        await demo.postprocess_data(fn, list(out), state)
                    times[form].append(1e3 * (time.perf_counter() - start))
        for stream in streams:
            await stream.aclose()

    asyncio.run(follow())
    return {form: statistics.median(ms) for form, ms in times.items()}


def _axes(figure: dict, allow: bool) -> dict:
    """The figure with its template's axes as the page sets them (allow) or with Plotly's default overflow."""
    figure = copy.deepcopy(figure)
    layout = figure["layout"].setdefault("template", {}).setdefault("layout", {})
    for axis in ("xaxis", "yaxis"):
        layout.setdefault(axis, {}).pop("ticklabeloverflow", None)
        if allow:
            layout[axis]["ticklabeloverflow"] = "allow"
    return figure


REDRAW_JS = """async ([ids, cycles]) => { const out = [], view = (j) => document.getElementById(ids[j]);
  for (let j = 0; j < ids.length; j++) {
    Plotly.purge(view(j)); await Plotly.newPlot(view(j), cycles[0][j].data, cycles[0][j].layout); }
  for (const cycle of cycles.slice(1)) { const t = performance.now();
    for (let j = 0; j < ids.length; j++) await Plotly.react(view(j), cycle[j].data, cycle[j].layout);
    out.push(performance.now() - t); }
  return out; }"""


def redraw_ms(cycles: int, rounds: int) -> dict[str, float]:
    """Median ms a step to redraw the four views: 'as the page sets the axes' and 'Plotly's default overflow'."""
    import plotly
    import plotly.graph_objects as go
    from playwright.sync_api import sync_playwright

    from eagleviz.app import gallery, navigation as nav

    run = gallery.load(RUN)
    shown = [[json.loads(v.to_json()) for v in nav.view_at(run, i % len(run.cycles), None, None)
              if isinstance(v, go.Figure)][:4] for i in range(1, cycles + 1)]
    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    ids = [f"view{j}" for j in range(4)]
    times: dict[str, list[float]] = {"as the page sets the axes": [], "Plotly's default overflow": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_content("".join(f"<div id='{i}' style='width:{VIEW_WIDTH}px;display:inline-block'></div>"
                                 for i in ids))
        page.add_script_tag(content=source.read_text())
        forms = (("as the page sets the axes", True), ("Plotly's default overflow", False))
        for r in range(rounds):
            for form, allow in forms[::1 if r % 2 == 0 else -1]:
                times[form] += page.evaluate(REDRAW_JS, [ids, [[_axes(f, allow) for f in c] for c in shown]])
        browser.close()
    return {form: statistics.median(ms) for form, ms in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("push", "redraw"))
    p.add_argument("--followers", type=int, default=32, help="push: pages following the room")
    p.add_argument("--moves", type=int, default=4, help="push: moves of the room")
    p.add_argument("--cycles", type=int, default=8, help="redraw: cycles stepped through")
    p.add_argument("--rounds", type=int, default=6, help="each form timed this many times, in turn")
    args = p.parse_args(argv)
    if args.part == "push":
        result = push_ms(args.followers, args.moves, args.rounds)
        what = f"{args.followers} followers' pushes, ms a move"
    else:
        result = redraw_ms(args.cycles, args.rounds)
        what = "the four views redrawn, ms a step"
    print(f"{what} (median): " + ", ".join(f"{form} {ms:.1f}" for form, ms in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
