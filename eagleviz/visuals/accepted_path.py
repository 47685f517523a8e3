"""The acceptance walk of one cycle: per depth, what the draft offered and what the target said.

Greedy (T = 0): at each depth the children of the last accepted node are tried in draft-score order; the
one equal to the target's argmax is accepted. Sampling (T > 0, EAGLE's multi-round speculative sampling
with top-k drafts, proposal probability 1): child x is accepted iff a uniform draw u < p(x), p being the
target distribution after temperature and top-p, renormalised without the siblings already rejected at
that depth (the residual). If every child is rejected, the bonus token is drawn from the residual.

The top panel is a grid: one column per depth, rows = the committed token, the target's top choice, and
the draft tokens tried in order. At T > 0 a second panel shows p(x), q(x) and u for every tried token and
the residual distribution the bonus was drawn from.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from eagleviz.trace import CycleTrace, NodeCheck
from eagleviz.visuals.style import (ACCEPTED, BONUS, INK, NEUTRAL, PRUNED, REJECTED, add_chips, base_layout,
                                    token_html, token_label)

TARGET_P = "#009E73"   # bluish green: the target's probability p(x)
DRAFT_Q = "#CC79A7"    # reddish purple: the draft's probability q(x)
CHECK, CROSS, GE = "\u2713", "\u2717", "\u2265"


def is_sampling(cycle: CycleTrace) -> bool:
    """Sampling cycles record a uniform draw per check (greedy ones record none)."""
    return any(c.uniform is not None for c in cycle.checks) or bool(cycle.root_top)


def checks_by_depth(cycle: CycleTrace) -> dict[int, list[NodeCheck]]:
    """The tried draft tokens grouped by depth, in the order the target tried them."""
    out: dict[int, list[NodeCheck]] = {}
    for c in cycle.checks:
        out.setdefault(c.depth, []).append(c)
    return out


def depth_columns(cycle: CycleTrace) -> int:
    """Columns of the grid: the accepted depths plus the depth of the bonus token."""
    return cycle.accept_length + 1


def _grid_cells(cycle: CycleTrace) -> list[dict]:
    """One dict per chip: x (depth), y (row), fill, text, hover, row name."""
    cells = []
    by_depth = checks_by_depth(cycle)
    sampling = is_sampling(cycle)
    for d in range(1, depth_columns(cycle) + 1):
        parent = cycle.path[d - 1]
        if d <= cycle.accept_length:
            slot = cycle.path[d]
            cells.append(dict(x=d, y=0, fill=ACCEPTED, text=f"{CHECK} {token_html(cycle.texts[slot], 10)}",
                              font="white", hover=f"depth {d}: accepted draft token <b>{token_html(cycle.texts[slot], 24)}"
                                                  f"</b> (slot {slot}) is committed"))
        else:
            how = "sampled from the residual after the rejections" if cycle.bonus_source == "residual" else \
                "the target's own choice at the last accepted node"
            cells.append(dict(x=d, y=0, fill=BONUS, text=f"\u2605 {token_html(cycle.bonus_text, 9)}", font=INK,
                              hover=f"depth {d}: bonus token <b>{token_html(cycle.bonus_text, 24)}</b>, {how}"))
        cells.append(dict(x=d, y=1, fill="white", text=token_html(cycle.target_texts[parent], 9), font=INK,
                          hover=f"the target's most likely token after slot {parent}: "
                                f"<b>{token_html(cycle.target_texts[parent], 24)}</b> "
                                f"(p = {cycle.target_probs[parent]:.3f})"))
        for k, c in enumerate(by_depth.get(d, [])):
            detail = f"p(x) = {c.p:.3f}, q(x) = {c.q:.3f}"
            if c.uniform is not None:
                detail += f", u = {c.uniform:.3f} {'<' if c.accepted else GE} p(x)"
            label = f"{CHECK if c.accepted else CROSS} {token_html(c.text, 9)}"
            if sampling:
                label += f"<br><span style='font-size:11px'>p={c.p:.2f}</span>"
            cells.append(dict(x=d, y=2 + k, fill=ACCEPTED if c.accepted else REJECTED, text=label, font="white",
                              hover=f"try {k + 1} at depth {d}: draft token <b>{token_html(c.text, 24)}</b> (slot "
                                    f"{c.slot}) {'accepted' if c.accepted else 'rejected'}<br>{detail}"))
        if not by_depth.get(d):
            cells.append(dict(x=d, y=2, fill=PRUNED, text="(no draft)", font=INK,
                              hover=f"depth {d}: the last accepted node is a leaf of the verified tree: "
                                    "nothing left to try"))
    return cells


def _grid(fig: go.Figure, cycle: CycleTrace, row: int) -> int:
    """Chips drawn as rectangles in data coordinates (they scale with the panel); text and hover on top."""
    cells = _grid_cells(cycle)
    rows = max(c["y"] for c in cells) + 1
    ref = "" if row == 1 else str(row)  # axis suffix of this subplot (one column)
    add_chips(fig, cells, axes=(f"x{ref}", f"y{ref}"))
    names = ["committed", "target's top"] + [f"draft try {k}" for k in range(1, rows - 1)]
    fig.update_yaxes(tickvals=list(range(rows)), ticktext=names, range=[rows - 0.5, -0.5], showgrid=False,
                     zeroline=False, showline=False, ticks="", row=row, col=1)
    n = depth_columns(cycle)
    fig.update_xaxes(tickvals=list(range(1, n + 1)), ticktext=[f"depth {d}" for d in range(1, n + 1)],
                     range=[0.5, max(n, 4) + 0.5], side="top", showgrid=False, zeroline=False, showline=False,
                     ticks="", row=row, col=1)
    return rows


def _bars(fig: go.Figure, cycle: CycleTrace, row: int) -> None:
    """p(x), q(x) and u for every tried token, then the residual distribution the bonus came from."""
    labels, p, q, u, verdict = [], [], [], [], []
    for c in cycle.checks:
        labels.append(f"d{c.depth}:{token_html(c.text, 8)}")
        p.append(c.p), q.append(c.q), u.append(c.uniform), verdict.append(CHECK if c.accepted else CROSS)
    fig.add_trace(go.Bar(x=labels, y=p, name="p(x): target (accept prob)", marker_color=TARGET_P,
                         text=verdict, textposition="outside", hovertemplate="%{x}<br>p(x) = %{y:.3f}<extra></extra>"),
                  row=row, col=1)
    fig.add_trace(go.Bar(x=labels, y=q, name="q(x): draft", marker_color=DRAFT_Q,
                         hovertemplate="%{x}<br>q(x) = %{y:.3f}<extra></extra>"), row=row, col=1)
    fig.add_trace(go.Scatter(x=labels, y=u, mode="markers", name="u: uniform draw (accept if u < p)",
                             marker=dict(symbol="diamond", size=14, color=INK, line=dict(color="white", width=1)),
                             hovertemplate="%{x}<br>u = %{y:.3f}<extra></extra>"), row=row, col=1)
    residual = next((c.residual_top for c in reversed(cycle.checks) if not c.accepted and c.residual_top), [])
    if cycle.bonus_source == "residual" and residual:
        rl = [f"res:{token_html(t, 8)}" for _, t, _ in residual]
        colours = [BONUS if tok == cycle.bonus_token else NEUTRAL for tok, _, _ in residual]
        fig.add_trace(go.Bar(x=rl, y=[v for _, _, v in residual], name="residual after rejections (\u2605 = bonus)",
                             marker_color=colours, offset=-0.3, width=0.6,
                             text=["\u2605" if tok == cycle.bonus_token else ""
                                                         for tok, _, _ in residual], textposition="outside",
                             hovertemplate="%{x}<br>residual prob = %{y:.3f}<extra></extra>"), row=row, col=1)
    fig.update_yaxes(title="probability", range=[0, 1.12], row=row, col=1)
    fig.update_xaxes(tickangle=-30, type="category", row=row, col=1)


def accepted_path_figure(cycle: CycleTrace, height: int | None = None) -> go.Figure:
    sampling = is_sampling(cycle)
    n_rows = 2 if sampling else 1
    fig = make_subplots(rows=n_rows, cols=1, vertical_spacing=0.16, row_heights=[0.55, 0.45] if sampling else None)
    grid_rows = _grid(fig, cycle, 1)
    if sampling:
        _bars(fig, cycle, 2)
    tried = len(cycle.checks)
    title = (f"Cycle {cycle.index}: accepted path: {cycle.accept_length} draft token(s) accepted, "
             f"{tried - cycle.accept_length} rejected, bonus {token_label(cycle.bonus_text)}")
    height = height or (130 + 52 * grid_rows + (330 if sampling else 0))
    base_layout(fig, title, height, barmode="group",
                legend=dict(orientation="h", yanchor="top", y=-0.12, x=0, font=dict(size=12)))
    return fig
