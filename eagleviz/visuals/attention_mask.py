"""The verification mask of one cycle as a heatmap: row i = a tree token (query), column j = what it may see.

Tree attention (SpecInfer; EAGLE section 3.2): the T tree tokens are verified in one target forward. Slot i
sees the whole committed prefix and, inside the tree, only its ancestors and itself, so each root-to-leaf
path computes exactly what plain causal decoding of that path would. The prefix is drawn as one collapsed,
fully visible column labelled with its length. Before the verify frame of a cycle (`eagleviz.visuals.phases`)
there is no mask yet; at it, the accepted rows are not known yet. A focused token's row and column are
outlined (`eagleviz.visuals.selection`).
"""

from __future__ import annotations

import plotly.graph_objects as go

from eagleviz.trace import CycleTrace
from eagleviz.visuals.phases import FINAL, Frame
from eagleviz.visuals.selection import Focus
from eagleviz.visuals.fit import PHONE_PX, Axis, Header, legend_names, margins, text_px
from eagleviz.visuals.style import (ACCEPTED, FOCUS, HIDDEN, INK, PREFIX, VISIBLE, empty_figure, figure, layout,
                                    legend_swatches, token_html)

# Cell values and their colours: hidden, visible (an ancestor or the token itself), the prefix block.
HIDDEN_CELL, VISIBLE_CELL, PREFIX_CELL = 0, 1, 2
_COLOURS = [HIDDEN, VISIBLE, PREFIX]
SELF_MARK = "\u25cf"   # drawn on the diagonal: the token itself
ROW_PX = 16            # one query row: a tick label of up to 13 px
AXES_PX = 120          # under the plot: the keys' tick labels at -60 degrees and the axis title


def _discrete_scale(colours: list[str]) -> list[list]:
    """A Plotly colourscale that maps the integers 0..n-1 (with zmin=0, zmax=n-1) to flat colours."""
    n = len(colours)
    scale = []
    for k, c in enumerate(colours):
        lo, hi = max(0.0, (k - 0.5) / (n - 1)), min(1.0, (k + 0.5) / (n - 1))
        scale += [[lo, c], [hi, c]]
    return scale


def mask_cells(cycle: CycleTrace) -> list[list[int]]:
    """(T, 1 + T) cell values: column 0 is the prefix block, then one column per tree slot."""
    T = cycle.num_tree_tokens
    return [[PREFIX_CELL] + [VISIBLE_CELL if cycle.mask[i][j] else HIDDEN_CELL for j in range(T)] for i in range(T)]


def _path_to(cycle: CycleTrace, slot: int) -> list[int]:
    chain = [slot]
    while cycle.parents[chain[-1]] >= 0:
        chain.append(cycle.parents[chain[-1]])
    return chain[::-1]


def _why(cycle: CycleTrace, i: int, j: int, labels: list[str], prefix: int) -> str:
    head = f"query slot {i} {labels[i]} \u2192 key "
    if j < 0:
        return head + f"prefix ({prefix} tokens)<br><b>visible</b>: every tree token sees the whole committed prefix"
    head += f"slot {j} {labels[j]}<br>"
    if i == j:
        return head + "<b>visible</b>: a token always attends to itself"
    if cycle.mask[i][j]:
        return head + f"<b>visible</b>: slot {j} is an ancestor of slot {i} (on its path from the root)"
    path = " \u2192 ".join(str(s) for s in _path_to(cycle, i))
    return head + f"<b>hidden</b>: slot {j} is not on slot {i}'s path ({path}); it belongs to another branch"


def slot_labels(cycle: CycleTrace, chars: int = 10) -> list[str]:
    """Unique axis labels: slot index and token."""
    return [f"{s}:{token_html(t, chars)}" for s, t in enumerate(cycle.texts)]


def attention_mask_figure(cycle: CycleTrace, height: int | None = None, frame: Frame = FINAL,
                          focus: Focus | None = None) -> go.Figure:
    if not frame.reached("verify"):
        return empty_figure(f"Cycle {cycle.index}: the tree is still being drafted; the target has not run yet.",
                            height or 320)
    T = cycle.num_tree_tokens
    prefix = cycle.kv_target.before
    labels = slot_labels(cycle, 10 if T <= 24 else 5)
    on_path = set(cycle.path) if frame.reached("accept") else set()
    rows = [f"<b>{lab}</b>" if s in on_path else lab for s, lab in enumerate(labels)]
    heat = dict(
        type="heatmap", z=mask_cells(cycle), x=[f"prefix ({prefix})"] + labels, y=rows, zmin=0,
        zmax=len(_COLOURS) - 1, colorscale=_discrete_scale(_COLOURS), showscale=False, xgap=1, ygap=1,
        customdata=[[_why(cycle, i, j - 1, labels, prefix) for j in range(T + 1)] for i in range(T)],
        hovertemplate="%{customdata}<extra></extra>", texttemplate="%{text}", textfont=dict(color=INK, size=12),
        text=[[SELF_MARK if j == i + 1 else "" for j in range(T + 1)] for i in range(T)])
    shapes = [dict(type="rect", x0=-0.5, x1=T + 0.5, y0=s - 0.5, y1=s + 0.5, xref="x", yref="y", layer="above",
                   line=dict(color=ACCEPTED, width=3), fillcolor="rgba(0,0,0,0)") for s in sorted(on_path)]
    if focus is not None and focus.kv_before is not None:
        f = focus.slot
        shapes += [dict(type="rect", x0=-0.5, x1=T + 0.5, y0=f - 0.5, y1=f + 0.5, xref="x", yref="y", layer="above",
                        line=dict(color=FOCUS, width=4, dash="dot"), fillcolor="rgba(0,0,0,0)"),
                   dict(type="rect", x0=f + 0.5, x1=f + 1.5, y0=-0.5, y1=T - 0.5, xref="x", yref="y", layer="above",
                        line=dict(color=FOCUS, width=4, dash="dot"), fillcolor="rgba(0,0,0,0)")]
    shapes.append(dict(type="line", x0=0.5, x1=0.5, y0=-0.5, y1=T - 0.5, line=dict(color=INK, width=2)))
    visible = sum(map(sum, cycle.mask))
    legend = _legend()
    tick = 13 if T <= 24 else 10
    labels_px = max(text_px(lab, tick) for lab in labels) + 40   # the rows' labels and the axis title
    header = Header(f"Cycle {cycle.index} \u00b7 tree mask {T}\u00d7{T}", (f"{visible} visible (+ prefix {prefix})",),
                    legend=tuple(legend_names(legend)), plot_width=PHONE_PX - labels_px, below=True)
    height = height or round(header.px() + min(max(ROW_PX * T, 160), 520) + AXES_PX + header.foot_px())
    sides = margins([Axis(tuple(rows), tick, standoff=12, titled=True)],
                    [Axis(tuple(heat["x"]), tick, angle=-60, titled=True)])
    return figure(data=[heat] + legend, layout=layout(
        header, height, sides, shapes=shapes,
        xaxis=dict(title=dict(text="key (slot:token)"), tickangle=-60, tickfont=dict(size=tick),
                   type="category"),
        # every row named (Plotly's automatic ticks drop every second one on a short panel, accepted rows too)
        yaxis=dict(title=dict(text="query (slot:token)", standoff=12), autorange="reversed", tickfont=dict(size=tick),
                   type="category", tickmode="array", tickvals=rows, ticktext=rows)))


def _legend() -> list[dict]:
    """Legend entries for the cell colours and the row outline (heatmaps have none of their own)."""
    names = ["hidden (another branch)", f"visible: ancestor or itself ({SELF_MARK})", "visible: prefix"]
    row = dict(type="scatter", x=[None], y=[None], mode="markers", name="accepted-path row (bold label)",
               marker=dict(symbol="square-open", size=14, color=ACCEPTED, line=dict(width=3)))
    return legend_swatches(list(zip(names, _COLOURS))) + [row]
