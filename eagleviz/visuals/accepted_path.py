"""The acceptance walk of one cycle: per depth, what the draft offered and what the target said.

Greedy (T = 0): at each depth the children of the last accepted node are tried in draft-score order; the
one equal to the target's argmax is accepted. Sampling (T > 0, EAGLE's multi-round speculative sampling
with top-k drafts, proposal probability 1): child x is accepted iff a uniform draw u < p(x), p being the
target distribution after temperature and top-p, renormalised without the siblings already rejected at
that depth (the residual). If every child is rejected, the bonus token is drawn from the residual.

The top panel is a grid: one column per depth, rows = the committed token, the target's top choice, and
the draft tokens tried in order. At T > 0 a second panel shows p(x), q(x) and u for every tried token and
the residual distribution the bonus was drawn from. A prompt-lookup candidate was never drafted, so it has no
q(x): in its place the path shows the calibrated acceptance reranking valued it at (`TreeNode.source` says
who proposed each node; acceptance reads p and u only, whoever proposed the token). Nothing is accepted
before the accept frame of a cycle (`eagleviz.visuals.phases`); a focused token's chips are outlined
(`eagleviz.visuals.selection`).
"""

from __future__ import annotations

import plotly.graph_objects as go

from eagleviz.trace import CycleTrace, NodeCheck
from eagleviz.visuals.fit import PHONE_PX, Axis, Header, legend_names, margins
from eagleviz.visuals.phases import FINAL, Frame
from eagleviz.visuals.selection import Focus
from eagleviz.visuals.style import (ACCEPTED, BONUS, CHIP_TEXT, INK, LOOKUP, NEUTRAL, PRUNED, REJECTED, chips,
                                    empty_figure, figure, focus_box, layout, prob_note, token_html)

TARGET_P = "#009E73"   # bluish green: the target's probability p(x)
DRAFT_Q = "#CC79A7"    # reddish purple: the draft's probability q(x)
CHECK, CROSS, GE = "\u2713", "\u2717", "\u2265"
PROPOSED = {"eagle": "draft token", "lookup": "lookup candidate", "both": "draft token (also a lookup candidate)"}
LOOKUP_VALUE = "lookup candidate: calibrated acceptance"
ROW_PX = {False: 36, True: 48}   # a grid row: its chip holds one line of label, two at T > 0 (the token, then p)
DEPTH_AXIS_PX = 46               # under the grid: the depths and the axis title
BARS_GAP_PX = 24                 # between the depth axis and the p, q, u panel: the marks over its bars
BARS_PX = 170                    # the p, q, u panel at T > 0
BARS_AXIS_PX = 80                # under that panel: its token labels at -45 degrees
ROW_NAMES_PX = 120               # the grid's row names left of it, and the margins


def is_sampling(cycle: CycleTrace) -> bool:
    """Sampling cycles record a uniform draw per check (greedy ones record none)."""
    return any(c.uniform is not None for c in cycle.checks) or bool(cycle.root_top)


def checks_by_depth(cycle: CycleTrace) -> dict[int, list[NodeCheck]]:
    """The tried draft tokens grouped by depth, in the order the target tried them."""
    out: dict[int, list[NodeCheck]] = {}
    for c in cycle.checks:
        out.setdefault(c.depth, []).append(c)
    return out


def slot_sources(cycle: CycleTrace) -> dict[int, str]:
    """Who proposed the node in each verification slot: its `TreeNode.source` ("eagle", "lookup" or "both")."""
    return {n.slot: n.source for n in cycle.nodes if n.slot >= 0}


def q_text(check: NodeCheck, source: str) -> str:
    """What the check's q slot holds: the draft's probability q(x), or for a lookup candidate (never drafted) the
    calibrated acceptance of a lookup token after its suffix match, which only ranked it for verification."""
    if source == "lookup":
        return f"{LOOKUP_VALUE} = {check.q:.3f} (no draft q(x): the head did not propose it)"
    return f"q(x) = {check.q:.3f}"


def depth_columns(cycle: CycleTrace) -> int:
    """Columns of the grid: the accepted depths plus the depth of the bonus token."""
    return cycle.accept_length + 1


def _grid_cells(cycle: CycleTrace) -> list[dict]:
    """One dict per chip: x (depth), y (row), fill, text, hover, row name."""
    cells = []
    by_depth = checks_by_depth(cycle)
    sampling = is_sampling(cycle)
    sources = slot_sources(cycle)
    for d in range(1, depth_columns(cycle) + 1):
        parent = cycle.path[d - 1]
        if d <= cycle.accept_length:
            slot = cycle.path[d]
            shown = token_html(cycle.texts[slot], 24)
            cells.append(dict(x=d, y=0, fill=ACCEPTED, text=f"{CHECK} {token_html(cycle.texts[slot], 10)}",
                              font="white", hover=f"depth {d}: accepted draft token <b>{shown}</b> (slot {slot}) is "
                                                  "committed"))
        else:
            how = "sampled from the residual after the rejections" if cycle.bonus_source == "residual" else \
                "the target's own choice at the last accepted node"
            cells.append(dict(x=d, y=0, fill=BONUS, text=f"\u2605 {token_html(cycle.bonus_text, 9)}", font=INK,
                              hover=f"depth {d}: bonus token <b>{token_html(cycle.bonus_text, 24)}</b>, {how}"))
        cells.append(dict(x=d, y=1, fill="white", text=token_html(cycle.target_texts[parent], 9), font=INK,
                          hover=f"the target's most likely token after slot {parent}: "
                                f"<b>{token_html(cycle.target_texts[parent], 24)}</b>"
                                f"{prob_note(cycle.target_probs[parent])}"))
        for k, c in enumerate(by_depth.get(d, [])):
            source = sources.get(c.slot, "eagle")
            detail = f"p(x) = {c.p:.3f}, {q_text(c, source)}"
            if c.uniform is not None:
                detail += f", u = {c.uniform:.3f} {'<' if c.accepted else GE} p(x)"
            label = f"{CHECK if c.accepted else CROSS}{token_html(c.text, 5)}"   # fits a phone's chip (51 px)
            if sampling:
                label += f"<br><span style='font-size:11px'>p={c.p:.2f}</span>"
            cells.append(dict(x=d, y=2 + k, fill=ACCEPTED if c.accepted else REJECTED, text=label, font="white",
                              hover=f"try {k + 1} at depth {d}: {PROPOSED.get(source, 'draft token')} "
                                    f"<b>{token_html(c.text, 24)}</b> (slot {c.slot}) "
                                    f"{'accepted' if c.accepted else 'rejected'}<br>{detail}"))
        if not by_depth.get(d):
            cells.append(dict(x=d, y=2, fill=PRUNED, text="none", font=INK,   # short: a phone's chip is narrow
                              hover=f"depth {d}: the last accepted node is a leaf of the verified tree: "
                                    "nothing left to try"))
    return cells


def _grid(cycle: CycleTrace) -> tuple[list[dict], dict, dict, int]:
    """Traces and (x, y) axes of the grid panel, and its number of rows."""
    cells = _grid_cells(cycle)
    rows = max(c["y"] for c in cells) + 1
    names = ["committed", "target's top"] + [f"draft try {k}" for k in range(1, rows - 1)]
    n = depth_columns(cycle)
    xaxis = dict(tickvals=list(range(1, n + 1)), ticktext=[str(d) for d in range(1, n + 1)], tickangle=0,
                 range=[0.5, max(n, 4) + 0.5], showline=False, ticks="", title=dict(text="depth", standoff=4))
    yaxis = dict(tickvals=list(range(rows)), ticktext=names, range=[rows - 0.5, -0.5], showline=False, ticks="",
                 tickfont=dict(size=13))
    return chips(cells, text_size=12), xaxis, yaxis, rows


def _bars(cycle: CycleTrace) -> list[dict]:
    """p(x), q(x) and u for every tried token, then the residual distribution the bonus came from (x2/y2). A lookup
    candidate's bar in q(x)'s place is its calibrated acceptance, hatched in the tree's lookup colour."""
    labels = [f"d{c.depth}:{token_html(c.text, 8)}" for c in cycle.checks]
    sources = slot_sources(cycle)
    looked = [sources.get(c.slot) == "lookup" for c in cycle.checks]
    axes = dict(xaxis="x2", yaxis="y2")
    traces = [
        dict(type="bar", x=labels, y=[c.p for c in cycle.checks], name="p(x): target (accept prob)",
             marker_color=TARGET_P, hovertemplate="%{x}<br>p(x) = %{y:.3f}<extra></extra>", offsetgroup="p", **axes),
        dict(type="bar", x=labels, y=[None if lk else c.q for c, lk in zip(cycle.checks, looked)], name="q(x): draft",
             marker_color=DRAFT_Q, hovertemplate="%{x}<br>q(x) = %{y:.3f}<extra></extra>", offsetgroup="q", **axes)]
    if any(looked):  # the same place as q(x), which a lookup candidate does not have
        traces.append(dict(
            type="bar", x=labels, y=[c.q if lk else None for c, lk in zip(cycle.checks, looked)], name=LOOKUP_VALUE,
            marker=dict(color="white", line=dict(color=LOOKUP, width=1.5), pattern=dict(shape="/", fgcolor=LOOKUP)),
            hovertemplate="%{x}<br>calibrated acceptance = %{y:.3f}<extra></extra>", offsetgroup="q", **axes))
    # u and the verdict over p's bar (the figure's scatter traces grouped as its bars are: `scattermode`), the mark
    # as text of its own: as the bar's text it would be a second subplot's, and Plotly keeps one uniform text size
    # per bar subplot, the last drawn (the panel's) setting it for the grid's chips, which then overflow on a phone
    traces += [
        dict(type="scatter", x=labels, y=[c.uniform for c in cycle.checks], mode="markers", offsetgroup="p",
             name="u: uniform draw (accept if u < p)", hovertemplate="%{x}<br>u = %{y:.3f}<extra></extra>",
             marker=dict(symbol="diamond", size=14, color=INK, line=dict(color="white", width=1)), **axes),
        dict(type="scatter", x=labels, y=[c.p for c in cycle.checks], mode="text", offsetgroup="p",
             text=[CHECK if c.accepted else CROSS for c in cycle.checks], textposition="top center", showlegend=False,
             hoverinfo="skip", cliponaxis=False, **axes)]
    residual = _residual(cycle)
    if residual:
        traces.append(dict(
            type="bar", x=[_residual_label(t) for _, t, _ in residual], y=[v for _, _, v in residual],
            name="residual after rejections (\u2605 = bonus)", offset=-0.3, width=0.6,
            marker_color=[BONUS if tok == cycle.bonus_token else NEUTRAL for tok, _, _ in residual],
            hovertemplate="%{x}<br>residual prob = %{y:.3f}<extra></extra>", **axes))
    return traces


def _residual(cycle: CycleTrace) -> list:
    """The residual distribution's top (token, text, probability) the bonus was drawn from, or none (a bonus that
    was the target's own choice)."""
    if cycle.bonus_source != "residual":
        return []
    return next((c.residual_top for c in reversed(cycle.checks) if not c.accepted and c.residual_top), [])


def _residual_label(text: str) -> str:
    return f"res:{token_html(text, 8)}"


def _bonus_star(cycle: CycleTrace) -> list[dict]:
    """The star over the residual's bar of the bonus token (an annotation: the residual's bars are centred on their
    tokens, where the grouped scatter traces are not), or none."""
    return [dict(x=_residual_label(t), y=v, xref="x2", yref="y2", text="\u2605", showarrow=False, yanchor="bottom",
                 font=dict(size=14, color=INK)) for tok, t, v in _residual(cycle) if tok == cycle.bonus_token]


def focus_cells(cycle: CycleTrace, focus: Focus | None) -> list[tuple[int, int]]:
    """(depth column, row) of the grid chips that show the focused token: its committed chip and its try."""
    if focus is None:
        return []
    cells = [] if focus.path_column is None else [(focus.path_column, 0)]
    if focus.check is not None:
        check = cycle.checks[focus.check]
        row = 2 + checks_by_depth(cycle)[check.depth].index(check)
        cells.append((check.depth, row))
    return cells


def accepted_path_figure(cycle: CycleTrace, height: int | None = None, frame: Frame = FINAL,
                         focus: Focus | None = None) -> go.Figure:
    """The grid of the acceptance walk and, at T > 0, the p, q and u panel under it. Without a `height`, the
    figure is as tall as its rows need (ROW_PX each, two lines of label at T > 0) plus the panel."""
    if not frame.reached("accept"):
        what = "the target is verifying the tree" if frame.reached("verify") else "the tree is still being drafted"
        return empty_figure(f"Cycle {cycle.index}: {what}; nothing is accepted yet.", height or 320)
    sampling = is_sampling(cycle)
    traces, xaxis, yaxis, grid_rows = _grid(cycle)
    traces += [focus_box(x, y, 0.47, 0.44) for x, y in focus_cells(cycle, focus)]
    grid_px = grid_rows * ROW_PX[sampling]
    plot_px = grid_px + (DEPTH_AXIS_PX + BARS_GAP_PX + BARS_PX + BARS_AXIS_PX if sampling else 0)
    extra = {}
    if sampling:   # the grid on top, its depth axis under it, then the panel of p, q and u
        traces += _bars(cycle)
        bars_top = (BARS_AXIS_PX + BARS_PX) / plot_px
        xaxis["domain"], yaxis["domain"] = [0, 1], [1 - grid_px / plot_px, 1.0]
        extra = dict(xaxis2=dict(anchor="y2", tickangle=-45, type="category", tickfont=dict(size=12)),
                     yaxis2=dict(anchor="x2", domain=[BARS_AXIS_PX / plot_px, bars_top],
                                 title=dict(text="probability"), range=[0, 1.12]),
                     scattermode="group")
        stars = _bonus_star(cycle)
        if stars:
            extra["annotations"] = stars
    tried = len(cycle.checks)
    header = Header(f"Cycle {cycle.index} \u00b7 path", (f"{cycle.accept_length} accepted",
                                                         f"{tried - cycle.accept_length} rejected",
                                                         f"bonus {token_html(cycle.bonus_text)}"),
                    legend=tuple(legend_names(traces)), plot_width=PHONE_PX - ROW_NAMES_PX)
    height = height or round(header.px() + plot_px + (10 if sampling else DEPTH_AXIS_PX))
    left = [Axis(tuple(yaxis["ticktext"]), 13, ticks=False)]
    bottom = [] if sampling else [Axis(tuple(xaxis["ticktext"]), ticks=False, standoff=4, titled=True)]
    if sampling:   # the panel's probabilities (0 to 1 by Plotly's ticks) and its tokens, turned over its own axis
        left.append(Axis(("0.8",), titled=True, ends=True))
        bottom.append(Axis(tuple(str(x) for t in traces if t.get("xaxis") == "x2" for x in t["x"]), 12, angle=-45,
                           inset=BARS_AXIS_PX))
    return figure(data=traces, layout=layout(header, height, margins(left, bottom), barmode="group",
                                             uniformtext=CHIP_TEXT, xaxis=xaxis, yaxis=yaxis, **extra))
