"""The draft tree of one cycle: every candidate the draft proposed, laid out top-down.

Encoding (EAGLE-2 sections 4.1-4.2): colour = cumulative draft probability exp(score) on a log scale, the
quantity reranking sorts by; shape = what happened to the node:
    root      the last committed token (square)
    accepted  on the accepted path (thick outline, thick blue edges)
    rejected  tried by the target and refused (x)
    verified  sent to the target but never reached, because an ancestor was rejected (circle)
    pruned    proposed by the draft, cut by reranking, never verified (small hollow circle, dotted edge;
              unlabelled, the token is in the hover)
    bonus     the target's own token after the accepted path (orange star, dashed edge)
Drawn at an earlier frame of the cycle (`eagleviz.visuals.phases`), the tree shows only the levels drafted
so far, every candidate as "drafted", and, once verification starts, which ones were sent to the target.
A focused token (`eagleviz.visuals.selection`) is ringed. A candidate that prompt lookup proposed (the
context's own recurring text, no model work) wears a green diamond, one both the head and lookup proposed a
green hexagon (TreeNode.source; traces from before lookup have none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
import plotly.graph_objects as go

from eagleviz.trace import CycleTrace
from eagleviz.visuals.fit import PHONE_PX, Axis, Header, legend_names, margins, text_px
from eagleviz.visuals.phases import FINAL, Frame
from eagleviz.visuals.selection import BONUS as BONUS_SLOT
from eagleviz.visuals.selection import Focus, slot_statuses
from eagleviz.visuals.style import (ACCEPTED, BONUS, FOCUS, INK, LOOKUP, NEUTRAL, PROB_SCALE, PRUNED, REJECTED, figure,
                                    layout, prob_note, token_html, token_label)

ROOT = "root"
BONUS_NODE = "bonus"
LOG_FLOOR = -4.0          # colour scale floor: cumulative probabilities below 1e-4 share the darkest colour
PRUNED_WIDTH = 0.35       # horizontal room of a pruned leaf relative to a verified one, before its tuft is packed
PRUNED_GROUP = 0.6        # room the pruned children of one node share
MIN_WIDTH = 8.0           # layout units the x axis spans at least
LEVEL_PX = 58             # one depth level: a node, its label below it, a gap above the next level's labels
LABEL_SIZE = 13           # node labels' font size
LABEL_CHARS = 10          # a node's label is its token cut to this many characters
AXIS_PX = 44              # the depth axis' title and tick labels, left of the plot
PLOT_PX = PHONE_PX - AXIS_PX - 20   # the plot's width on a phone: labels are thinned and nodes sized for it
BAR_PX = 190              # the colour bar's length: five tick labels, well apart
BAR_BAND_PX = 40          # the colour bar's band under the title: the bar, its tick labels
STATUS_STYLE = {          # legend name, marker symbol, size, outline colour, outline width
    "root": ("root (last committed)", "square", 22, INK, 2),
    "accepted": ("accepted", "circle", 22, INK, 4),
    "rejected": ("rejected", "x", 20, REJECTED, 2),
    "verified": ("verified, not reached", "circle", 18, NEUTRAL, 1.5),
    "pruned": ("pruned by reranking", "circle-open", 10, NEUTRAL, 1.5),
    "bonus": ("bonus (target's own)", "star", 26, BONUS, 2),
    "drafted": ("drafted (not yet verified)", "circle", 18, INK, 1),
    "sent": ("sent to the target", "circle", 20, INK, 2),
}


SOURCE_STYLE = {          # TreeNode.source -> legend name, marker symbol drawn around the node
    "lookup": ("from prompt lookup", "diamond-open"),
    "both": ("from the head and lookup", "hexagon-open"),
}


@dataclass
class TreeFigureCounts:
    """What the figure shows, for tests and explanations."""

    candidates: int
    verified: int
    pruned: int
    accepted: int
    rejected: int


def build_graph(cycle: CycleTrace, frame: Frame = FINAL) -> nx.DiGraph:
    """The cycle's tree as a graph: node keys are candidate ids, plus ROOT and BONUS_NODE; each node carries
    `status`, `depth`, `text` and (for candidates) its TreeNode as `node`. At an earlier `frame`, only what
    had happened by then."""
    verdict = slot_statuses(cycle)
    shown = frame.depth_shown
    g = nx.DiGraph()
    g.add_node(ROOT, status="root", depth=0, text=cycle.texts[0], slot=0, order=0.0)
    for n in cycle.nodes:
        if shown is not None and n.depth > shown:
            continue
        if not frame.reached("verify"):
            status = "drafted"
        elif not n.kept:
            status = "pruned"
        elif not frame.reached("accept"):
            status = "sent"
        else:
            status = verdict[n.slot]
        g.add_node(n.id, status=status, depth=n.depth, text=n.text, slot=n.slot, order=-n.score, node=n)
        g.add_edge(ROOT if n.parent < 0 else n.parent, n.id)
    if not frame.reached("accept"):
        return g
    last = cycle.path[-1]
    anchor = ROOT if last == 0 else cycle.verify_nodes[last]
    g.add_node(BONUS_NODE, status="bonus", depth=g.nodes[anchor]["depth"] + 1, text=cycle.bonus_text, slot=-1,
               order=math.inf)
    g.add_edge(anchor, BONUS_NODE)
    return g


def tidy_layout(g: nx.DiGraph, root=ROOT) -> dict:
    """Top-down tidy layout: leaves left to right in depth-first order (children sorted by their `order`
    attribute, i.e. best draft score first), each parent centred over its first and last child; y = -depth.
    A verified leaf takes one unit of width; the pruned children of a node share PRUNED_GROUP units whatever
    their number (a tuft), so that the verified tree keeps the room however many candidates reranking cut."""
    pruned = {v for v in g if g.nodes[v]["status"] == "pruned"}
    room: dict = {}

    def measure(v) -> float:
        kids = list(g.successors(v))
        cut = sum(measure(c) for c in kids if c in pruned)
        kept = sum(measure(c) for c in kids if c not in pruned)
        if v in pruned:
            room[v] = kept + cut if kids else PRUNED_WIDTH
        else:   # a verified node keeps a leaf's room, however few candidates it has under it
            room[v] = max(1.0, kept + min(cut, PRUNED_GROUP))
        return room[v]

    measure(root)
    pos: dict = {}

    def place(v, left: float, scale: float) -> float:
        kids = sorted(g.successors(v), key=lambda c: (g.nodes[c]["order"], str(c)))
        if not kids:
            x = left + room[v] * scale / 2
        else:
            cut = sum(room[c] for c in kids if c in pruned) if v not in pruned else 0.0
            tuft = min(1.0, PRUNED_GROUP / cut) if cut else 1.0
            scales = [scale * (tuft if c in pruned and v not in pruned else 1.0) for c in kids]
            left += (room[v] * scale - sum(room[c] * s for c, s in zip(kids, scales))) / 2   # centred in its room
            xs = []
            for c, s in zip(kids, scales):
                xs.append(place(c, left, s))
                left += room[c] * s
            x = (xs[0] + xs[-1]) / 2
        pos[v] = (x, -g.nodes[v]["depth"])
        return x

    place(root, 0.0, 1.0)
    return pos


def counts(cycle: CycleTrace) -> TreeFigureCounts:
    kept = sum(n.kept for n in cycle.nodes)
    return TreeFigureCounts(candidates=len(cycle.nodes), verified=kept, pruned=len(cycle.nodes) - kept,
                            accepted=cycle.accept_length, rejected=sum(not c.accepted for c in cycle.checks))


def _hover(cycle: CycleTrace, g: nx.DiGraph, v) -> str:
    d = g.nodes[v]
    tok = token_html(d["text"], 24)
    status = STATUS_STYLE[d["status"]][0]
    if v == ROOT:
        return (f"<b>{tok}</b> (root, slot 0)<br>the last committed token; its KV enters the cache this cycle<br>"
                f"target's choice after it: <b>{token_html(cycle.target_texts[0], 24)}</b>")
    if v == BONUS_NODE:
        source = "sampled from the residual after rejections" if cycle.bonus_source == "residual" else \
            "the target's own choice after the accepted path"
        return f"<b>{tok}</b> bonus token, depth {d['depth']}<br>{source}<br>it becomes the next cycle's root"
    n = d["node"]
    lines = [f"<b>{tok}</b> depth {n.depth}" + (f", slot {n.slot}" if n.slot >= 0 else ""), status,
             *([SOURCE_STYLE[n.source][0]] if n.source in SOURCE_STYLE else []),
             f"draft prob (local): {n.prob:.3f}",
             f"cumulative draft prob exp(score): {math.exp(n.score):.2e} (score {n.score:.2f})"]
    parent_slot = 0 if n.parent < 0 else g.nodes[n.parent]["slot"]
    if parent_slot >= 0:
        lines.append(f"target's choice at the parent: <b>{token_html(cycle.target_texts[parent_slot], 24)}</b>"
                     f"{prob_note(cycle.target_probs[parent_slot])}")
    check = next((c for c in cycle.checks if c.slot == n.slot), None)
    if check is not None and check.uniform is not None:
        lines.append(f"accept prob p(x) = {check.accept_prob:.3f}, uniform draw = {check.uniform:.3f}")
    return "<br>".join(lines)


def _edge_groups(g: nx.DiGraph, pos: dict) -> dict[str, tuple[list, list]]:
    """Edge polylines grouped by style: the accepted path, the bonus edge, pruned and other edges."""
    groups: dict[str, tuple[list, list]] = {k: ([], []) for k in ("path", "bonus", "pruned", "other")}
    for u, v in g.edges:
        status = g.nodes[v]["status"]
        key = {"accepted": "path", "bonus": "bonus", "pruned": "pruned"}.get(status, "other")
        xs, ys = groups[key]
        xs += [pos[u][0], pos[v][0], None]
        ys += [pos[u][1], pos[v][1], None]
    return groups


EDGE_STYLE = {"path": dict(color=ACCEPTED, width=5), "bonus": dict(color=BONUS, width=3, dash="dash"),
              "pruned": dict(color=PRUNED, width=1, dash="dot"), "other": dict(color=NEUTRAL, width=1.5)}


def draft_tree_figure(cycle: CycleTrace, height: int | None = None, frame: Frame = FINAL,
                      focus: Focus | None = None) -> go.Figure:
    """The cycle's draft tree at `frame`; one marker trace per status so the legend explains the shapes.

    Laid out for a phone's width (`PLOT_PX`): node sizes shrink and labels thin out as the tree gets wider,
    each token staying in its node's hover. Without a `height`, the figure is as tall as its depth needs
    (LEVEL_PX per level); with one smaller than that, the levels are packed closer."""
    g = build_graph(cycle, frame)
    # Laid out as the whole tree, so that nodes stay in place while it grows frame by frame.
    full = g if frame.reached("accept") else build_graph(cycle)  # from accept on, the frame's graph is whole
    pos = tidy_layout(full)
    traces = [dict(type="scatter", x=xs, y=ys, mode="lines", line=EDGE_STYLE[key], hoverinfo="skip",
                   showlegend=False) for key, (xs, ys) in _edge_groups(g, pos).items() if xs]
    lo, hi = _x_range(pos)
    px_per_unit = PLOT_PX / (hi - lo)
    scale = node_scale(px_per_unit)
    sides = label_sides(g, pos, LABEL_CHARS, px_per_unit, scale)
    for status in STATUS_STYLE:
        members = [v for v in g if g.nodes[v]["status"] == status]
        if members:
            traces.append(_status_trace(cycle, g, pos, members, status, sides, scale))
    traces += _source_marks(g, pos, scale)
    ring = _focus_ring(g, pos, focus, scale)
    if ring:
        traces.append(ring)
    depth = max(d["depth"] for _, d in full.nodes(data=True))
    header = Header(*_title(cycle, g, frame), band_px=BAR_BAND_PX, legend=tuple(legend_names(traces)),
                    plot_width=PLOT_PX, note="colour: cumulative draft prob exp(score)", below=True)
    height = height or round(header.px() + (depth + 1.2) * LEVEL_PX + 16 + header.foot_px())
    levels = [str(d) for d in range(depth + 1)]
    return figure(data=traces, layout=layout(
        header, height, margins([Axis(tuple(levels), standoff=4, titled=True)]),
        coloraxis=_colour_axis(header.band_top(), height), xaxis=dict(visible=False, range=[lo, hi]),
        yaxis=dict(title=dict(text="depth", standoff=4), tickvals=[-d for d in range(depth + 1)], ticktext=levels,
                   range=[-depth - 0.6, 0.6], showline=False)))


def _title(cycle: CycleTrace, g: nx.DiGraph, frame: Frame) -> tuple[str, tuple[str, ...]]:
    """The head of the title and its detail phrases, at `frame`."""
    c = counts(cycle)
    if frame.phase == "draft":
        return (f"Cycle {cycle.index} \u00b7 drafting", (f"level {frame.level} of {frame.levels}",
                                                         f"{g.number_of_nodes() - 1} candidates so far"))
    if frame.phase == "verify":
        return f"Cycle {cycle.index} \u00b7 reranked", (f"{c.verified} sent to the target", f"{c.pruned} pruned")
    return (f"Cycle {cycle.index} \u00b7 draft tree", (f"{c.candidates} candidates", f"{c.verified} verified",
                                                       f"{c.pruned} pruned", f"{c.accepted} accepted"))


def _colour_axis(top_px: float, height: float) -> dict:
    """The cumulative draft probability's scale: a horizontal bar of fixed length in the band under the title,
    so that its five tick labels stay BAR_PX / 4 apart whatever the figure's size. The title's last line names
    it (a horizontal colour bar's own title overprints the bar)."""
    ticks = list(range(int(LOG_FLOOR), 1))
    bar = dict(orientation="h", x=0, xref="container", xanchor="left", xpad=24, ypad=0, yref="container",
               y=1 - top_px / height, yanchor="top", lenmode="pixels", len=BAR_PX, thickness=10, tickvals=ticks,
               tickfont=dict(size=12), ticktext=[f"1e{k}" if k else "1" for k in ticks])
    return dict(colorscale=PROB_SCALE, cmin=LOG_FLOOR, cmax=0.0, colorbar=bar)


def node_scale(px_per_unit: float) -> float:
    """Markers shrink with the room a verified leaf gets on a phone (one layout unit), never below half size."""
    return min(1.0, max(0.5, 0.9 * px_per_unit / STATUS_STYLE["accepted"][2]))


def _source_marks(g: nx.DiGraph, pos: dict, scale: float = 1.0) -> list[dict]:
    """One trace per non-head source present: a mark around each candidate that source proposed."""
    marks = []
    for source, (name, symbol) in SOURCE_STYLE.items():
        members = [v for v in g if "node" in g.nodes[v] and g.nodes[v]["node"].source == source]
        if members:
            marks.append(dict(type="scatter", x=[pos[v][0] for v in members], y=[pos[v][1] for v in members],
                              mode="markers", name=name, hoverinfo="skip",
                              marker=dict(symbol=symbol, size=round(32 * scale), color=LOOKUP,
                                          line=dict(width=2.5, color=LOOKUP))))
    return marks


def _focus_ring(g: nx.DiGraph, pos: dict, focus: Focus | None, scale: float = 1.0) -> dict | None:
    """A ring around the focused token's node, when it is drawn at this frame."""
    if focus is None:
        return None
    key = BONUS_NODE if focus.slot == BONUS_SLOT else ROOT if focus.slot == 0 else focus.node
    if key not in pos:
        return None
    x, y = pos[key]
    return dict(type="scatter", x=[x], y=[y], mode="markers", name="selected token", hoverinfo="skip",
                marker=dict(symbol="circle-open", size=round(38 * scale), color=FOCUS, line=dict(width=4, color=FOCUS)))


def label_sides(g: nx.DiGraph, pos: dict, label_chars: int, px_per_unit: float, scale: float = 1.0) -> dict:
    """Text position per labelled node: below if there is room on that side of its level, else above if that
    clears the labels hanging below the level above, else none (the token stays in the hover). Greedy, level by
    level from the root, left to right, with each label's estimated width at `px_per_unit`; a neighbour's
    marker larger than the node's (`scale`d as drawn) reaches into the label's band and is avoided too."""
    side: dict = {ROOT: "top center"}  # above the root there is room; below it, its edges start
    levels: dict[int, list] = {}
    for v in g:
        if g.nodes[v]["status"] != "pruned" and v != ROOT:
            levels.setdefault(g.nodes[v]["depth"], []).append(v)
    hanging: list[tuple[float, float]] = []  # label intervals below the previous level
    for depth in sorted(levels):
        nodes = sorted(levels[depth], key=lambda v: pos[v][0])
        reach = {v: STATUS_STYLE[g.nodes[v]["status"]][2] * scale / 2 / px_per_unit for v in nodes}
        below, above = [], []
        for v in nodes:
            half = label_px(g.nodes[v]["text"], label_chars) / px_per_unit / 2
            box = (pos[v][0] - half, pos[v][0] + half)
            taken = [(pos[u][0] - reach[u], pos[u][0] + reach[u]) for u in nodes if reach[u] > reach[v]]
            if _clear(box, below + taken):
                side[v] = "bottom center"
                below.append(box)
            elif _clear(box, above + taken + hanging):
                side[v] = "top center"
                above.append(box)
            else:
                side[v] = None
        hanging = below
    return side


def _clear(box: tuple[float, float], taken: list[tuple[float, float]]) -> bool:
    return all(box[1] <= a or box[0] >= b for a, b in taken)


def label_px(text: str, label_chars: int = LABEL_CHARS) -> float:
    """The room a node's label takes, in px: its text and a gap of half a character on each side."""
    return text_px(token_label(text, label_chars), LABEL_SIZE) + LABEL_SIZE * 0.6


def _x_range(pos: dict) -> list[float]:
    """The layout's extent, widened to MIN_WIDTH units around its centre so that small trees (a chain) are not
    stretched across the whole panel."""
    xs = [x for x, _ in pos.values()]
    lo, hi = min(xs) - 0.6, max(xs) + 0.6
    pad = max(0.0, MIN_WIDTH - (hi - lo)) / 2
    return [lo - pad, hi + pad]


def _status_trace(cycle: CycleTrace, g: nx.DiGraph, pos: dict, members: list, status: str, label_side: dict,
                  scale: float = 1.0) -> dict:
    """The markers of one status, sized by `scale`. Verified and accepted nodes are coloured by cumulative draft
    probability; the others by what happened to them, which matters more there."""
    name, symbol, size, outline, width = STATUS_STYLE[status]
    size = round(size * scale)
    fill = {"bonus": BONUS, "root": INK, "rejected": REJECTED, "pruned": NEUTRAL}.get(status)
    if fill is None:
        colours = [math.log10(max(math.exp(g.nodes[v]["node"].score), 10 ** LOG_FLOOR)) for v in members]
        marker = dict(symbol=symbol, size=size, line=dict(color=outline, width=width), coloraxis="coloraxis",
                      color=colours)
    else:
        marker = dict(symbol=symbol, size=size, color=fill, line=dict(color=outline, width=width))
    return dict(type="scatter", x=[pos[v][0] for v in members], y=[pos[v][1] for v in members], name=name,
                mode="markers" if status == "pruned" else "markers+text", marker=marker,
                text=[token_html(g.nodes[v]["text"], LABEL_CHARS) if label_side.get(v) else "" for v in members],
                textposition=[label_side.get(v) or "bottom center" for v in members],
                textfont=dict(size=LABEL_SIZE), hovertext=[_hover(cycle, g, v) for v in members], hoverinfo="text",
                customdata=[_item(cycle, g.nodes[v]) for v in members])


def _item(cycle: CycleTrace, node: dict) -> int | None:
    """The node's item in the cycle's token list (its verification slot; the bonus last), or None for a node
    the target never saw: what the page picks when the node is pointed at."""
    if node["status"] == "bonus":
        return cycle.num_tree_tokens
    return node["slot"] if node["slot"] >= 0 else None


def node_label(cycle: CycleTrace, slot: int) -> str:
    """Display text of a verification slot, shared with the other figures."""
    return token_label(cycle.texts[slot])
