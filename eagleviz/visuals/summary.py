"""Run-level figures: accept length per cycle (with tau), acceptance per depth (n-alpha), time per phase.

Beside each cycle's accept length, the tree's own forecast (CycleTrace.expected_accept: the draft tokens it
expected to be accepted), where the trace records it; older traces draw without it.

tau = mean tokens committed per cycle = mean accept length + 1 (the bonus). n-alpha (EAGLE section 5): the
rate at which a draft token at depth n + 1 is accepted given that depth n was accepted.
"""

from __future__ import annotations

import plotly.graph_objects as go

from eagleviz.trace import RunTrace, summarize
from eagleviz.visuals.fit import (GAP_PX, LEGEND_ROW_PX, LEGEND_SIZE, MODEBAR_PX, PHONE_PX, Axis, legend_names,
                                  legend_rows, margins)
from eagleviz.visuals.style import ACCEPTED, BONUS, INK, NEUTRAL, REJECTED, empty_figure, figure, layout

PHASE_COLOURS = {"draft": "#CC79A7", "verify": "#009E73", "accept": BONUS, "rewind": NEUTRAL}
NAME_PX = 26                  # a panel's name
NAME_SIZE = 14
PANEL_PX = 160                # a panel's plot
AXIS_PX = 78                  # under a panel's plot: its tick labels, its axis title and a gap
PLOT_WIDTH = PHONE_PX - 70    # the panels' width on a phone, left of them the axis titles and tick labels
CYCLE_BARS = "cycle-bars"     # the accept-length bars' meta: the page outlines the selected cycle's bar by it
OUTLINE_PX = 3                # the selected cycle's bar outline


def _expected(run: RunTrace) -> list[dict]:
    """The forecast per cycle as markers over the accept-length bars (none when no cycle recorded one)."""
    points = [(c.index, c.expected_accept) for c in run.cycles if c.expected_accept is not None]
    if not points:
        return []
    return [dict(type="scatter", x=[i for i, _ in points], y=[e for _, e in points], mode="markers",
                 name="expected by the tree", marker=dict(symbol="diamond", size=9, color=BONUS,
                                                          line=dict(color=INK, width=1)),
                 hovertemplate="cycle %{x}: expected %{y:.2f} accepted<extra></extra>")]


def summary_figure(run: RunTrace, selected: int | None = None, height: int | None = None) -> go.Figure:
    """Three panels stacked (axes x/y, x2/y2, x3/y3), each with its name and its own legend over it, so that
    they stay apart on a phone; the selected cycle's bar is outlined (a page that shows another of the run's
    cycles moves the outline itself: the bars' meta CYCLE_BARS). Without a `height`, the figure is as tall as the
    panels and their legends wrapped for a phone need."""
    if not run.cycles:
        return empty_figure("No speculation cycles in this run (plain decoding, or stopped before the first cycle).")
    s = summarize(run)
    idx = [c.index for c in run.cycles]
    rows = s["acceptance_by_depth"]
    traces = [
        dict(type="bar", x=idx, y=s["accept_lengths"], name="draft tokens accepted", meta=CYCLE_BARS, marker=dict(
            color=ACCEPTED, line=dict(color=INK, width=[OUTLINE_PX if i == selected else 0 for i in idx])),
            hovertemplate="cycle %{x}: %{y} accepted + 1 bonus<extra></extra>"),
        dict(type="scatter", x=[min(idx) - 0.5, max(idx) + 0.5], y=[s["tau"] - 1] * 2, mode="lines",
             name="mean accepted = \u03c4 - 1", line=dict(color=INK, dash="dash", width=2)),
        *_expected(run),
        dict(type="bar", x=[r["depth"] - 1 for r in rows], y=[r["rate"] for r in rows], name="n-\u03b1",
             xaxis="x2", yaxis="y2", marker_color=[ACCEPTED if r["rate"] >= 0.5 else REJECTED for r in rows],
             text=[f"{r['accepted']}/{r['tried']}" for r in rows], textposition="outside", showlegend=False,
             hovertemplate="%{x}-\u03b1 = %{y:.2f}<br>accepted / tried = %{text}<extra></extra>")]
    traces += [dict(type="bar", x=idx, y=[c.timings_ms.get(phase, 0.0) for c in run.cycles], name=f"{phase} ms",
                    xaxis="x3", yaxis="y3", marker_color=colour, legend="legend3",
                    hovertemplate=f"cycle %{{x}}: {phase} %{{y:.1f}} ms<extra></extra>")
                for phase, colour in PHASE_COLOURS.items()]
    names = [f"accept length per cycle (\u03c4 = {s['tau']:.2f})", "acceptance per depth (n-\u03b1)",
             "time per cycle and phase"]
    legends = [legend_names([t for t in traces if "xaxis" not in t]), [],
               legend_names([t for t in traces if t.get("xaxis") == "x3"])]
    panels = _stack([legend_rows(entries, PLOT_WIDTH) * LEGEND_ROW_PX for entries in legends])
    height = height or round(MODEBAR_PX + panels[-1]["bottom"] + 10)
    plot = height - MODEBAR_PX - 10
    frac = [{k: 1 - v / plot for k, v in p.items()} for p in panels]
    notes = [dict(text=t, x=0, xref="paper", xanchor="left", y=f["top"], yref="paper", yanchor="top",
                  showarrow=False, font=dict(size=NAME_SIZE)) for t, f in zip(names, frac)]
    legend = dict(orientation="h", x=0, xanchor="left", yanchor="top", font=dict(size=LEGEND_SIZE), traceorder="normal")
    # Plotly's own ticks: at most the largest value's digits, or a half where the range is small (the time panel's 0
    # at the foot of its axis); under the panels, inside the plot area (AXIS_PX each), a cycle's number at the edge
    most = max([sum(c.timings_ms.values()) for c in run.cycles] + s["accept_lengths"] + [1])
    ticks = ("0.5", f"{most:.0f}")
    sides = margins([Axis(ticks, titled=True), Axis(("0.8",), titled=True), Axis(ticks, titled=True, ends=True)],
                    [Axis((str(max(idx)),), titled=True, inset=AXIS_PX)])
    return figure(data=traces, layout=layout(
        "", height, barmode="stack", annotations=notes, margin=sides | dict(t=MODEBAR_PX),
        legend=legend | dict(y=frac[0]["legend"]), legend3=legend | dict(y=frac[2]["legend"]),
        xaxis=dict(domain=[0, 1], anchor="y", title=dict(text="cycle")),
        yaxis=dict(domain=[frac[0]["plot_bottom"], frac[0]["plot"]], title=dict(text="tokens accepted"),
                   rangemode="tozero"),
        xaxis2=dict(domain=[0, 1], anchor="y2", dtick=1, title=dict(text="n = depth already accepted")),
        yaxis2=dict(domain=[frac[1]["plot_bottom"], frac[1]["plot"]], anchor="x2", title=dict(text="acceptance rate"),
                    range=[0, 1.15]),
        xaxis3=dict(domain=[0, 1], anchor="y3", title=dict(text="cycle")),
        yaxis3=dict(domain=[frac[2]["plot_bottom"], frac[2]["plot"]], anchor="x3", title=dict(text="ms"))))


def _stack(legend_px: list[float]) -> list[dict]:
    """Each panel's edges in px from the top of the plot area: its name, its legend, its plot and the axis
    under it, in that order, one panel after the other."""
    panels, top = [], 0.0
    for px in legend_px:
        legend = top + NAME_PX
        plot = legend + px + (GAP_PX if px else 0)
        plot_bottom = plot + PANEL_PX
        panels.append(dict(top=top, legend=legend, plot=plot, plot_bottom=plot_bottom, bottom=plot_bottom + AXIS_PX))
        top = plot_bottom + AXIS_PX
    return panels
