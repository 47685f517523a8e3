"""Run-level figures: accept length per cycle (with tau), acceptance per depth (n-alpha), time per phase.

Beside each cycle's accept length, the tree's own forecast (CycleTrace.expected_accept: the draft tokens it
expected to be accepted), where the trace records it; older traces draw without it.

tau = mean tokens committed per cycle = mean accept length + 1 (the bonus). n-alpha (EAGLE section 5): the
rate at which a draft token at depth n + 1 is accepted given that depth n was accepted.
"""

from __future__ import annotations

import plotly.graph_objects as go

from eagleviz.trace import RunTrace, summarize
from eagleviz.visuals.style import ACCEPTED, BONUS, INK, NEUTRAL, REJECTED, empty_figure, figure, layout

PHASE_COLOURS = {"draft": "#CC79A7", "verify": "#009E73", "accept": BONUS, "rewind": NEUTRAL}


def _expected(run: RunTrace) -> list[dict]:
    """The forecast per cycle as markers over the accept-length bars (none when no cycle recorded one)."""
    points = [(c.index, c.expected_accept) for c in run.cycles if c.expected_accept is not None]
    if not points:
        return []
    return [dict(type="scatter", x=[i for i, _ in points], y=[e for _, e in points], mode="markers",
                 name="expected by the tree", marker=dict(symbol="diamond", size=9, color=BONUS,
                                                          line=dict(color=INK, width=1)),
                 hovertemplate="cycle %{x}: expected %{y:.2f} accepted<extra></extra>")]


def summary_figure(run: RunTrace, selected: int | None = None, height: int = 380) -> go.Figure:
    """Three panels side by side (axes x/y, x2/y2, x3/y3); the selected cycle's bar is outlined."""
    if not run.cycles:
        return empty_figure("No speculation cycles in this run (plain decoding, or stopped before the first cycle).")
    s = summarize(run)
    idx = [c.index for c in run.cycles]
    rows = s["acceptance_by_depth"]
    traces = [
        dict(type="bar", x=idx, y=s["accept_lengths"], name="draft tokens accepted", marker=dict(
            color=ACCEPTED, line=dict(color=INK, width=[3 if i == selected else 0 for i in idx])),
            hovertemplate="cycle %{x}: %{y} accepted + 1 bonus<extra></extra>"),
        dict(type="scatter", x=[min(idx) - 0.5, max(idx) + 0.5], y=[s["tau"] - 1] * 2, mode="lines",
             name="mean accepted = \u03c4 - 1", line=dict(color=INK, dash="dash", width=2)),
        *_expected(run),
        dict(type="bar", x=[r["depth"] - 1 for r in rows], y=[r["rate"] for r in rows], name="n-\u03b1",
             xaxis="x2", yaxis="y2", marker_color=[ACCEPTED if r["rate"] >= 0.5 else REJECTED for r in rows],
             text=[f"{r['accepted']}/{r['tried']}" for r in rows], textposition="outside", showlegend=False,
             hovertemplate="%{x}-\u03b1 = %{y:.2f}<br>accepted / tried = %{text}<extra></extra>")]
    traces += [dict(type="bar", x=idx, y=[c.timings_ms.get(phase, 0.0) for c in run.cycles], name=f"{phase} ms",
                    xaxis="x3", yaxis="y3", marker_color=colour,
                    hovertemplate=f"cycle %{{x}}: {phase} %{{y:.1f}} ms<extra></extra>")
                for phase, colour in PHASE_COLOURS.items()]
    titles = [f"accept length per cycle (\u03c4 = {s['tau']:.2f})", "acceptance per depth (n-\u03b1)",
              "time per cycle and phase"]
    domains = ([0, 0.28], [0.36, 0.64], [0.72, 1.0])
    notes = [dict(text=t, x=sum(d) / 2, y=1.0, xref="paper", yref="paper", xanchor="center", yanchor="bottom",
                  showarrow=False, font=dict(size=14)) for t, d in zip(titles, domains)]
    return figure(data=traces, layout=layout(
        "", height, barmode="stack", annotations=notes, margin=dict(l=10, r=10, t=34, b=10),
        legend=dict(orientation="h", yanchor="top", y=-0.3, x=0, font=dict(size=12), traceorder="normal"),
        xaxis=dict(domain=domains[0], title=dict(text="cycle")),
        yaxis=dict(title=dict(text="draft tokens accepted"), rangemode="tozero"),
        xaxis2=dict(domain=domains[1], anchor="y2", dtick=1, title=dict(text="n (depth n + 1 given depth n accepted)")),
        yaxis2=dict(anchor="x2", title=dict(text="acceptance rate"), range=[0, 1.15]),
        xaxis3=dict(domain=domains[2], anchor="y3", title=dict(text="cycle")),
        yaxis3=dict(anchor="x3", title=dict(text="ms"))))
