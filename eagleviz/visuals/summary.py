"""Run-level figures: accept length per cycle (with tau), acceptance per depth (n-alpha), time per phase.

tau = mean tokens committed per cycle = mean accept length + 1 (the bonus). n-alpha (EAGLE section 5): the
rate at which a draft token at depth n + 1 is accepted given that depth n was accepted.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eagleviz.trace import RunTrace, summarize
from eagleviz.visuals.style import ACCEPTED, BONUS, INK, NEUTRAL, REJECTED, base_layout, empty_figure

PHASE_COLOURS = {"draft": "#CC79A7", "verify": "#009E73", "accept": BONUS, "rewind": NEUTRAL}


def summary_figure(run: RunTrace, selected: int | None = None, height: int = 360) -> go.Figure:
    if not run.cycles:
        return empty_figure("No speculation cycles in this run (plain decoding, or stopped before the first cycle).")
    s = summarize(run)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(
        f"accept length per cycle (\u03c4 = {s['tau']:.2f})", "acceptance per depth (n-\u03b1)",
        "time per cycle and phase (ms)"))
    idx = [c.index for c in run.cycles]
    lengths = s["accept_lengths"]
    outline = [3 if i == selected else 0 for i in idx]
    fig.add_trace(go.Bar(x=idx, y=lengths, name="accept length", marker=dict(color=ACCEPTED, line=dict(
        color=INK, width=outline)), hovertemplate="cycle %{x}: %{y} accepted + 1 bonus<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[min(idx) - 0.5, max(idx) + 0.5], y=[s["tau"] - 1] * 2, mode="lines",
                             name="mean accept length = \u03c4 - 1", line=dict(color=INK, dash="dash", width=2)),
                  row=1, col=1)
    rows = s["acceptance_by_depth"]
    fig.add_trace(go.Bar(x=[r["depth"] - 1 for r in rows], y=[r["rate"] for r in rows], name="n-\u03b1",
                         marker_color=[ACCEPTED if r["rate"] >= 0.5 else REJECTED for r in rows],
                         text=[f"{r['accepted']}/{r['tried']}" for r in rows], textposition="outside",
                         hovertemplate="%{x}-\u03b1 = %{y:.2f}<br>accepted / tried = %{text}<extra></extra>"),
                  row=1, col=2)
    for phase, colour in PHASE_COLOURS.items():
        fig.add_trace(go.Bar(x=idx, y=[c.timings_ms.get(phase, 0.0) for c in run.cycles], name=phase,
                             marker_color=colour, hovertemplate=f"cycle %{{x}}: {phase} %{{y:.1f}} ms<extra></extra>"),
                      row=1, col=3)
    base_layout(fig, "", height, barmode="stack", margin=dict(l=10, r=10, t=40, b=10),
                legend=dict(orientation="h", yanchor="top", y=-0.2, x=0, font=dict(size=12)))
    fig.update_xaxes(title="cycle", row=1, col=1)
    fig.update_yaxes(title="draft tokens accepted", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title="n (depth n + 1, given depth n accepted)", dtick=1, row=1, col=2)
    fig.update_yaxes(title="acceptance rate", range=[0, 1.15], row=1, col=2)
    fig.update_xaxes(title="cycle", row=1, col=3)
    fig.update_yaxes(title="ms", row=1, col=3)
    fig.update_annotations(font=dict(size=14))
    return fig
