"""The KV caches around one cycle: before the commit (prefix | tree slots) and after it (prefix | accepted
path, compacted), for the target and for the draft.

Target: verification wrote the T tree tokens at slots S .. S+T-1. The commit gathers the accepted path's
slots to S, S+1, ... (arrows), sets the length to S + accept_length + 1, and leaves the rest to be
overwritten (grey). Draft: its expansion slots (one per expanded node) are dropped; the draft cache only
keeps positions encoded from target features, and the next cycle encodes the committed tokens afresh.
At an earlier frame of the cycle (`eagleviz.visuals.phases`) only the slots written by then are drawn: the
draft's expansion slots level by level, then the tree slots, their fate once accepted, and the compaction
last. A focused token's slots are outlined before and after (`eagleviz.visuals.selection`).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from eagleviz.trace import CycleTrace
from eagleviz.visuals.fit import PHONE_PX, Axis, Header, legend_names, margins, text_px
from eagleviz.visuals.phases import FINAL, Frame
from eagleviz.visuals.selection import Focus
from eagleviz.visuals.style import (ACCEPTED, CHIP_TEXT, INK, NEUTRAL, PREFIX, PRUNED, VISIBLE, chips, figure,
                                    focus_box, layout, legend_swatches, token_html)

ROWS = {"target_before": 4.6, "target_after": 3.2, "draft_before": 1.45, "draft_after": 0.45}
ROW_NAMES = {"target_before": "target: verify", "target_after": "target: after commit",
             "draft_before": "draft: drafting", "draft_after": "draft: after rewind"}
PREFIX_WIDTH = 3.0    # the collapsed prefix block spans this many slot widths
PLOT_PX = 260         # the four rows (34 px a row), the labels over the written rows, the slot numbers and the
                      # axis title under them
TOP = 5.8             # the y range's top: room for the labels written upwards over the verify row
ROW_LABELS_PX = 160   # the rows' names left of the plot, and the margins
FREE = "#FFFFFF"


def expansion_labels(cycle: CycleTrace) -> list[str]:
    """The token each draft expansion slot holds: expanded nodes in drafting order (by level, then score)."""
    expanded = sorted((n for n in cycle.nodes if n.expanded), key=lambda n: (n.depth, -n.score, n.id))
    if len(expanded) != len(cycle.kv_draft.appended):
        return [""] * len(cycle.kv_draft.appended)
    return [n.text for n in expanded]


def _label(text: str, show: bool) -> str:
    """A cell's label: the token's first characters, its leading space dropped (a word then shows its letters,
    not the space mark), cut to three so that it fits a cell at Plotly's smallest size instead of being hidden;
    the hover has the whole token."""
    return token_html(text.strip() or text, 3) if show else ""


def _target_cells(cycle: CycleTrace, show: bool, frame: Frame = FINAL) -> list[dict]:
    S, T, path = cycle.kv_target.before, cycle.num_tree_tokens, cycle.path
    dest = {src: i for i, src in enumerate(path)}
    cells = []
    if not frame.reached("verify"):
        return cells
    for s in range(T):
        where = f"target slot {S + s} (tree slot {s}, depth {cycle.positions[s] - S}) " \
                f"<b>{token_html(cycle.texts[s], 24)}</b>"
        if not frame.reached("accept"):
            cells.append(dict(x=s, y=ROWS["target_before"], fill=VISIBLE, font=INK, text=_label(cycle.texts[s], show),
                              hover=f"{where}<br>written by the verify forward; its fate is decided next"))
            continue
        if s in dest:
            fate = "stays in place" if dest[s] == s else f"moves to slot {S + dest[s]}"
            fill, font, hover = (INK if s == 0 else ACCEPTED), "white", f"{where}<br>on the accepted path: {fate}"
        else:
            fill, font, hover = PRUNED, INK, f"{where}<br>not accepted: discarded (overwritten next cycle)"
        cells.append(dict(x=s, y=ROWS["target_before"], fill=fill, font=font, hover=hover,
                          text=_label(cycle.texts[s], show)))
    if not frame.reached("rewind"):
        return cells
    for i, src in enumerate(path):
        cells.append(dict(x=i, y=ROWS["target_after"], fill=INK if i == 0 else ACCEPTED, font="white",
                          text=_label(cycle.texts[src], show),
                          hover=f"target slot {S + i}: <b>{token_html(cycle.texts[src], 24)}</b> committed"
                                + ("" if src == i else f" (copied from slot {S + src})")))
    for s in range(len(path), T):
        cells.append(dict(x=s, y=ROWS["target_after"], fill=FREE, font=NEUTRAL, text="",
                          hover=f"target slot {S + s}: free; beyond the cache length {cycle.kv_target.after}"))
    return cells


def written_expansions(cycle: CycleTrace, frame: Frame = FINAL) -> int:
    """How many draft expansion slots had been written by `frame`: while level d is drafted, the expansions of
    the nodes above it (level k's expansion proposes level k + 1)."""
    if frame.phase != "draft":
        return len(cycle.kv_draft.appended)
    return sum(1 for n in cycle.nodes if n.expanded and n.depth < frame.level)


def _draft_cells(cycle: CycleTrace, show: bool, frame: Frame = FINAL) -> list[dict]:
    labels = expansion_labels(cycle)
    cells = []
    written = written_expansions(cycle, frame)
    for k, (slot, text) in enumerate(list(zip(cycle.kv_draft.appended, labels))[:written]):
        hover = f"draft slot {slot}: expansion of <b>{token_html(text, 24)}</b>" if text else f"draft slot {slot}"
        cells.append(dict(x=k, y=ROWS["draft_before"], fill=PRUNED, font=INK, text=_label(text, show),
                          hover=hover + "<br>written while drafting; dropped by the rewind"))
        if frame.reached("rewind"):
            cells.append(dict(x=k, y=ROWS["draft_after"], fill=FREE, font=NEUTRAL, text="",
                              hover=f"draft slot {slot}: free (length back to {cycle.kv_draft.after})"))
    return cells


def _prefix_cells(cycle: CycleTrace, frame: Frame = FINAL) -> list[dict]:
    """The collapsed prefix of each row, as one wide chip labelled with its length (the rows after the rewind
    only once it happened)."""
    rows = (("target_before", cycle.kv_target.before), ("target_after", cycle.kv_target.before),
            ("draft_before", cycle.kv_draft.before), ("draft_after", cycle.kv_draft.after))
    if not frame.reached("rewind"):
        rows = rows[0], rows[2]
    return [dict(x=-PREFIX_WIDTH / 2 - 0.5, y=ROWS[key], fill=PREFIX, font="white", text=f"prefix: {n}",
                 hover=f"{ROW_NAMES[key]}: the committed prefix, slots 0 .. {n - 1} ({n} slots)") for key, n in rows]


def _moves(cycle: CycleTrace) -> list[dict]:
    """Arrows from each accepted slot before the commit to its place after it; moved ones are bold."""
    top, bottom = ROWS["target_before"] - 0.4, ROWS["target_after"] + 0.4
    return [dict(x=i, y=bottom, ax=src, ay=top, xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True,
                 arrowhead=2, arrowsize=1.2, arrowwidth=2.5 if src != i else 1,
                 arrowcolor=ACCEPTED if src != i else NEUTRAL) for i, src in enumerate(cycle.path)]


def kv_counts(cycle: CycleTrace) -> dict[str, int]:
    """Slot counts the figure draws (for tests and explanations)."""
    kept = len(cycle.path)
    return {"tree_slots": cycle.num_tree_tokens, "kept": kept, "discarded": cycle.num_tree_tokens - kept,
            "moved": len(cycle.kv_target.moves), "draft_dropped": len(cycle.kv_draft.appended)}


def focus_slots(cycle: CycleTrace, focus: Focus | None, frame: Frame = FINAL) -> list[tuple[float, float]]:
    """(x, y) of the chips holding the focused token: its tree slot, and its place after the commit."""
    if focus is None or focus.kv_before is None or not frame.reached("verify"):
        return []
    S = cycle.kv_target.before
    cells = [(focus.kv_before - S, ROWS["target_before"])]
    if focus.kv_after is not None and frame.reached("rewind"):
        cells.append((focus.kv_after - S, ROWS["target_after"]))
    return cells


def kv_rewind_figure(cycle: CycleTrace, height: int | None = None, frame: Frame = FINAL,
                     focus: Focus | None = None) -> go.Figure:
    width = max(cycle.num_tree_tokens, len(cycle.kv_draft.appended), 4)
    show = width <= 24
    cells = _target_cells(cycle, show, frame) + _draft_cells(cycle, show, frame)
    # The rows that writing fills (verify, drafting) carry their tokens written upwards over each cell: a phone's
    # cells are a few pixels wide, and a label inside one would shrink away. The commit's row below the moves'
    # arrows keeps them inside (they are the verify row's, moved).
    written = [c for c in cells if c["y"] in (ROWS["target_before"], ROWS["draft_before"])]
    kept = [c for c in cells if c["y"] not in (ROWS["target_before"], ROWS["draft_before"])]
    size = 12 if width <= 16 else 10
    # Lines 1.1 em tall side by side on a phone's slots: 12 px apart for 12 slots, 9 px for 16
    traces = chips(written, half_width=0.45, half_height=0.38, text_size=10 if width <= 12 else 8,
                   above=True) if written else []
    traces += chips(kept, half_width=0.45, half_height=0.38, text_size=size) if kept else []
    traces += chips(_prefix_cells(cycle, frame), half_width=PREFIX_WIDTH / 2 - 0.05, half_height=0.38,
                    text_size=13)
    traces += [focus_box(x, y, 0.5, 0.45) for x, y in focus_slots(cycle, focus, frame)]
    c = kv_counts(cycle)
    head = f"Cycle {cycle.index} \u00b7 KV"
    if frame.phase == "draft":
        details = ("while drafting", f"draft wrote {written_expansions(cycle, frame)}", "target untouched")
    elif frame.phase in ("verify", "accept"):
        details = (f"verify wrote {c['tree_slots']} target slots after the prefix",)
    else:
        details = (f"target keeps {c['kept']} of {c['tree_slots']} tree slots", f"{c['moved']} moved",
                   f"draft drops {c['draft_dropped']}")
    S = cycle.kv_target.before
    # slot numbers level and apart on a phone: one every `step` slots
    slot_px = (PHONE_PX - ROW_LABELS_PX) / (width + PREFIX_WIDTH + 0.4)
    step = math.ceil((text_px(str(S + width), 14) + 10) / slot_px)
    moved = dict(type="scatter", x=[None], y=[None], mode="lines", name="moved by the commit",
                 line=dict(color=ACCEPTED, width=2.5))
    legend = legend_swatches([("committed prefix", PREFIX), ("root (written this cycle)", INK),
                              ("accepted path", ACCEPTED), ("discarded slot", PRUNED), ("free slot", FREE)]) + [moved]
    header = Header(head, details, legend=tuple(legend_names(legend)), plot_width=PHONE_PX - ROW_LABELS_PX,
                    below=True)
    arrows = _moves(cycle) if frame.reached("rewind") else []
    slots = tuple(str(S + k) for k in range(0, width, step))
    sides = margins([Axis(tuple(ROW_NAMES.values()), 12, ticks=False)], [Axis(slots, titled=True)])
    return figure(data=traces + legend, layout=layout(
        header, height or round(header.px() + PLOT_PX + header.foot_px()), sides, uniformtext=CHIP_TEXT,
        **({"annotations": arrows} if arrows else {}),
        xaxis=dict(title=dict(text="cache slot"), range=[-PREFIX_WIDTH - 0.7, width - 0.3],
                   tickvals=list(range(0, width, step)), ticktext=list(slots)),
        yaxis=dict(tickvals=list(ROWS.values()), ticktext=list(ROW_NAMES.values()), range=[-0.05, TOP],
                   showline=False, ticks="", tickfont=dict(size=12))))
