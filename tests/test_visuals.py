"""Figures drawn from traces: recorded ones (tests/data, real engine) and hand-built ones (trace_factory)."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from eagleviz.trace import RunTrace
from eagleviz.visuals import (accepted_path_figure, attention_mask_figure, check_displayable, cycle_view,
                              draft_tree_figure, kv_rewind_figure, replay_acceptance, replay_figure, summary_figure)
from eagleviz.visuals import explain
from eagleviz.visuals.accepted_path import CHECK, CROSS, depth_columns
from eagleviz.visuals.draft_tree import BONUS_NODE, ROOT, STATUS_STYLE, build_graph, tidy_layout
from eagleviz.visuals.output_text import output_tokens
from eagleviz.visuals.style import CHIPS, chip_centres
from eagleviz.visuals.replay import OTHER, root_distribution
from trace_factory import synthetic_cycle, synthetic_run

DATA = Path(__file__).parent / "data"
RECORDED = ["trace_greedy.json", "trace_sampling.json", "trace_chain.json"]


def recorded(name: str) -> RunTrace:
    return RunTrace.from_json((DATA / name).read_text(encoding="utf-8"))


def all_cycles():
    """(label, cycle) for every recorded cycle and the hand-built shapes the app must draw."""
    out = [(f"{name}[{c.index}]", c) for name in RECORDED for c in recorded(name).cycles]
    out += [("one-level", synthetic_cycle(steps=1, topk=3, draft_tokens=4, accept=0)),
            ("chain", synthetic_cycle(steps=4, topk=1, draft_tokens=5, accept=2)),
            ("zero-accept", synthetic_cycle(steps=3, topk=2, draft_tokens=6, accept=0)),
            ("full-depth", synthetic_cycle(steps=3, topk=2, draft_tokens=14, accept=3)),
            ("sampling", synthetic_cycle(steps=4, topk=3, draft_tokens=10, accept=2, sampling=True)),
            ("wide", synthetic_cycle(steps=5, topk=8, draft_tokens=64, accept=1, seed=4))]
    return out


CYCLES = all_cycles()
IDS = [label for label, _ in CYCLES]


def points(fig, name: str) -> int:
    return sum(len(t.x) for t in fig.data if t.name == name)


# ------------------------------------------------------------------ layering


def test_visuals_import_neither_torch_nor_gradio():
    code = ("import sys, eagleviz.visuals, eagleviz.visuals.explain, eagleviz.visuals.output_text; "
            "bad = [m for m in ('torch', 'gradio') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------ draft tree


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_draft_tree_counts(label, cycle):
    fig = draft_tree_figure(cycle)
    kept = sum(n.kept for n in cycle.nodes)
    names = {k: v[0] for k, v in STATUS_STYLE.items()}
    assert points(fig, names["root"]) == 1
    assert points(fig, names["bonus"]) == 1
    assert points(fig, names["pruned"]) == len(cycle.nodes) - kept
    assert points(fig, names["accepted"]) == cycle.accept_length
    assert points(fig, names["rejected"]) == sum(not c.accepted for c in cycle.checks)
    drawn = sum(points(fig, names[s]) for s in ("accepted", "rejected", "verified"))
    assert drawn == kept == cycle.num_tree_tokens - 1


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_tidy_layout_is_top_down_and_centred(label, cycle):
    g = build_graph(cycle)
    pos = tidy_layout(g)
    assert len(set(pos.values())) == g.number_of_nodes()  # no two nodes share a place
    for v in g:
        assert pos[v][1] == -g.nodes[v]["depth"]
        kids = sorted(g.successors(v), key=lambda c: pos[c][0])
        if kids:
            assert math.isclose(pos[v][0], (pos[kids[0]][0] + pos[kids[-1]][0]) / 2)
    last = cycle.path[-1]
    anchor = ROOT if last == 0 else cycle.verify_nodes[last]
    assert g.has_edge(anchor, BONUS_NODE)


# ------------------------------------------------------------------ attention mask


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_attention_mask_cells(label, cycle):
    fig = attention_mask_figure(cycle)
    heat = fig.data[0]
    T = cycle.num_tree_tokens
    z = np.array(heat.z)
    assert z.shape == (T, T + 1) and len(heat.x) == T + 1 and len(heat.y) == T
    assert (z[:, 0] == 2).all()                                  # the prefix block is fully visible
    assert int((z[:, 1:] == 1).sum()) == sum(map(sum, cycle.mask))
    assert str(cycle.kv_target.before) in heat.x[0]
    outlined = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(outlined) == len(cycle.path)
    assert "ancestor" in heat.customdata[T - 1][1] or T == 1      # the root is every slot's ancestor


# ------------------------------------------------------------------ accepted path


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_accepted_path_grid(label, cycle):
    fig = accepted_path_figure(cycle)
    chips = chip_centres(next(t for t in fig.data if t.name == CHIPS))
    cols = depth_columns(cycle)
    assert cols == cycle.accept_length + 1
    committed = [x for x, y in chips if y == 0]
    assert sorted(committed) == list(range(1, cols + 1))
    tried = [1 for _, y in chips if y >= 2]
    leaf_columns = sum(1 for d in range(1, cols + 1) if not any(c.depth == d for c in cycle.checks))
    assert len(tried) == len(cycle.checks) + leaf_columns
    sampling = any(c.uniform is not None for c in cycle.checks)
    bars = [t for t in fig.data if t.type == "bar" and t.name.startswith("p(x)")]
    assert len(bars) == (1 if sampling else 0)
    if bars:
        assert len(bars[0].x) == len(cycle.checks)


def _tries(fig) -> list[str]:
    """The hover texts of the grid's tried tokens."""
    chips = next(t for t in fig.data if t.name == CHIPS)
    return [h for h in chips.hovertext if h.startswith("try ")]


def test_a_lookup_candidates_value_is_labelled_its_calibrated_acceptance_not_the_drafts_q():
    """A lookup token was never drafted: what its check records as q is the calibrated acceptance reranking valued
    it at (TreeNode.prob), and the path says so, from the node's source, while the head's tokens keep q(x)."""
    from dataclasses import replace

    from eagleviz.paths import GALLERY

    cycle = synthetic_cycle(steps=4, topk=3, draft_tokens=10, accept=2, sampling=True)
    looked = cycle.checks[0]
    cycle.nodes = [replace(n, source="lookup") if n.slot == looked.slot else n for n in cycle.nodes]
    fig = accepted_path_figure(cycle)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    draft, lookup = bars["q(x): draft"], bars["lookup candidate: calibrated acceptance"]
    assert draft.y[0] is None and list(draft.y[1:]) == [c.q for c in cycle.checks[1:]]
    assert lookup.y[0] == looked.q and all(y is None for y in lookup.y[1:])
    assert draft.offsetgroup == lookup.offsetgroup  # in q(x)'s place, not beside it
    first, *rest = _tries(fig)
    assert first.startswith("try 1 at depth 1: lookup candidate") and "q(x) =" not in first
    assert f"calibrated acceptance = {looked.q:.3f}" in first
    assert all("draft token" in h and f"q(x) = {c.q:.3f}" in h for h, c in zip(rest, cycle.checks[1:]))
    _as_validated(fig)
    # a run where prompt lookup carries the decoding, as the engine recorded it (T = 0: the grid only)
    quoting = RunTrace.from_json((GALLERY / "quoting.json").read_text(encoding="utf-8"))
    tries = [h for c in quoting.cycles for h in _tries(accepted_path_figure(c))]
    from_lookup = [h for h in tries if ": lookup candidate" in h]
    assert from_lookup and all("calibrated acceptance" in h and "q(x) =" not in h for h in from_lookup)


# ------------------------------------------------------------------ KV rewind


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_kv_rewind_slots(label, cycle):
    fig = kv_rewind_figure(cycle)
    written, kept = [t for t in fig.data if t.name == CHIPS][:2]   # the prefix blocks' chips come last
    T, E = cycle.num_tree_tokens, len(cycle.kv_draft.appended)
    rows = {}
    for _, y in chip_centres(written) + chip_centres(kept):
        rows[y] = rows.get(y, 0) + 1
    assert sorted(rows.values()) == sorted([T, T, E, E] if E else [T, T])
    assert written.textposition == "outside" and written.textangle == -90 and kept.textposition == "inside"
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(arrows) == len(cycle.path)
    moved = [a for a in arrows if a.ax != a.x]
    assert len(moved) == len(cycle.kv_target.moves)


# ------------------------------------------------------------------ whole views, summary, output


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_runs_render_every_cycle(name):
    run = recorded(name)
    check_displayable(run)
    for i in range(len(run.cycles)):
        view = cycle_view(run, i, replay_draws=500)
        assert f"Cycle {i}" in view.tree.layout.title.text
    fig = summary_figure(run, selected=0)
    assert len(fig.data[0].x) == len(run.cycles)


def test_summary_of_a_plain_run_says_so():
    run = recorded("trace_greedy.json")
    run.cycles = []
    assert "No speculation cycles" in summary_figure(run).layout.annotations[0].text


def test_one_cycle_run_renders():
    run = synthetic_run([synthetic_cycle(accept=1)])
    view = cycle_view(run, 0)
    assert view.caption.startswith("**Cycle 0** of 1")
    assert cycle_view(run, 5).caption == view.caption  # out-of-range indices clamp to the recording


def test_output_tokens_carry_provenance_one_item_per_token():
    run = synthetic_run([synthetic_cycle(i, accept=i, prefix=20 + i) for i in range(3)])
    run.output[1].text = "a\nb"
    run.output[2].text = ""
    items = output_tokens(run)
    assert len(items) == len(run.output) and items[1][0] == "a\u21b5\nb" and items[2][0] == "\u2205"
    kinds = [kind for _, kind in items]
    assert kinds.count("bonus (target)") == len(run.cycles)
    assert kinds.count("accepted draft") == sum(c.accept_length for c in run.cycles)
    assert kinds[0] == "first token" and output_tokens(None) == []


def test_explanations_carry_the_cycle_numbers():
    cycle = synthetic_cycle(steps=3, topk=2, draft_tokens=8, accept=2, prefix=30)
    text = explain.path_text(cycle)
    assert "**2 draft tokens**" in text and "**3 tokens** committed" in text
    assert f"{cycle.num_tree_tokens - 3} tree slots discarded" in text
    assert "30 .. 32" in explain.kv_text(cycle)
    assert str(len(cycle.nodes)) in explain.tree_text(cycle)
    run = synthetic_run([cycle])
    assert all(explain.TOUR[k] in explain.tour_step(run, cycle, k) for k in range(4))


# ------------------------------------------------------------------ acceptance replay


def test_replay_reproduces_the_target_distribution():
    cycle = synthetic_cycle(steps=3, topk=3, draft_tokens=8, accept=1, sampling=True)
    tokens, _, p = root_distribution(cycle)
    assert math.isclose(p.sum(), 1.0) and tokens[-1] == OTHER
    result = replay_acceptance(cycle, draws=40_000, seed=1)
    assert result.total_variation < 0.015
    assert np.allclose(result.empirical, result.target, atol=0.01)


def test_replay_tries_every_root_child_in_order():
    cycle = synthetic_cycle(steps=2, topk=3, draft_tokens=6, accept=1, sampling=True)
    result = replay_acceptance(cycle, draws=100)
    children = [cycle.tokens[s] for s in range(1, cycle.num_tree_tokens) if cycle.parents[s] == 0]
    assert result.tried == [t for t in children if t in result.tokens]


def test_replay_needs_a_sampling_trace():
    assert replay_acceptance(recorded("trace_greedy.json").cycles[0]) is None
    assert "T = 0" in replay_figure(recorded("trace_greedy.json").cycles[0]).layout.annotations[0].text
    sampled = recorded("trace_sampling.json").cycles[0]
    assert replay_acceptance(sampled, draws=1000).draws == 1000


def test_a_cycle_of_the_root_alone_has_nothing_to_replay():
    """Nothing drafted: its token came from the target alone (the engine keeps no distribution for it)."""
    cycle = synthetic_cycle(steps=1, topk=1, draft_tokens=2, accept=0, sampling=True)
    alone = dataclasses.replace(cycle, tokens=cycle.tokens[:1], texts=cycle.texts[:1], parents=cycle.parents[:1],
                                positions=cycle.positions[:1], checks=[], path=[0], root_top=[])
    assert alone.num_tree_tokens == 1 and replay_acceptance(alone) is None
    assert "Nothing was drafted" in replay_figure(alone).layout.annotations[0].text


# ------------------------------------------------------------------ traces in and out


def test_old_traces_without_root_top_still_load():
    data = json.loads((DATA / "trace_sampling.json").read_text(encoding="utf-8"))
    for c in data["cycles"]:
        del c["root_top"]
    run = RunTrace.from_dict(data)
    assert run.cycles[0].root_top == []
    assert "older build" in replay_figure(run.cycles[0]).layout.annotations[0].text


@pytest.mark.parametrize("breakage", ["mask", "path", "parents", "accept_length", "slot"])
def test_inconsistent_traces_are_refused(breakage):
    run = recorded("trace_greedy.json")
    c = run.cycles[0]
    if breakage == "mask":
        c.mask = c.mask[:-1]
    elif breakage == "path":
        c.path = [0, 99]
    elif breakage == "parents":
        c.parents[1] = 5
    elif breakage == "accept_length":
        c.accept_length = 3
    else:
        c.checks[0].slot = 99
    with pytest.raises(ValueError):
        check_displayable(run)


# ------------------------------------------------------------------ cost-aware trees and draft sources


def test_the_tree_marks_each_candidates_source_and_older_traces_draw_without(tmp_path):
    from dataclasses import replace

    from eagleviz.visuals.draft_tree import SOURCE_STYLE

    cycle = synthetic_cycle(steps=3, topk=2, draft_tokens=6, accept=2)
    plain = {t.name for t in draft_tree_figure(cycle).data if t.name}
    assert not plain & {name for name, _ in SOURCE_STYLE.values()}      # every node from the head: no marks
    kept = [n for n in cycle.nodes if n.kept]
    cycle.nodes = [replace(n, source="lookup") if n is kept[0] else replace(n, source="both") if n is kept[1] else n
                   for n in cycle.nodes]
    marks = {t.name: len(t.x) for t in draft_tree_figure(cycle).data if t.name in ("from prompt lookup",
                                                                                  "from the head and lookup")}
    assert marks == {"from prompt lookup": 1, "from the head and lookup": 1}


def test_the_caption_and_the_summary_set_the_trees_forecast_beside_the_outcome():
    from eagleviz.visuals.summary import summary_figure

    cycles = [synthetic_cycle(index=i, accept=i % 3) for i in range(3)]
    old = synthetic_run(cycles)
    assert "expected" not in explain.cycle_caption(old, old.cycles[0])
    assert "expected by the tree" not in {t.name for t in summary_figure(old).data}
    for c, e in zip(cycles, (0.4, 1.25, 2.0)):
        c.expected_accept, c.decision = e, "stopped at level 2: a third level would not pay."
    run = synthetic_run(cycles)
    caption = explain.cycle_caption(run, run.cycles[1])
    assert "1 accepted + 1 bonus" in caption and "expected 1.2 accepted" in caption
    assert caption.endswith("would not pay.") and ".." not in caption
    forecast = next(t for t in summary_figure(run).data if t.name == "expected by the tree")
    assert list(forecast.x) == [0, 1, 2] and list(forecast.y) == [0.4, 1.25, 2.0]


# ------------------------------------------------------------------ figures as the browser receives them


def _as_validated(fig) -> None:
    """Figures skip Plotly's validation (style.figure): built again with it, each must be valid and the same data."""
    import plotly.graph_objects as go

    checked = go.Figure(fig.to_dict())   # raises on a property Plotly does not know or a value it refuses
    assert json.loads(fig.to_json()) == json.loads(checked.to_json())


@pytest.mark.parametrize("label,cycle", CYCLES[::3] + CYCLES[-6:], ids=IDS[::3] + IDS[-6:])
def test_every_figure_is_valid_plotly_in_plotlys_own_spelling(label, cycle):
    from eagleviz.visuals.phases import frames
    from eagleviz.visuals.views import cycle_figures

    run = synthetic_run([cycle])
    view = cycle_view(run, 0, replay_draws=200)
    for fig in (view.tree, view.mask, view.path, view.kv, view.replay, summary_figure(run, 0)):
        _as_validated(fig)
    first = cycle_figures(run, 0, frame=0, slot=cycle.nodes[-1].slot)
    for fig in (first.tree, first.mask, first.path, first.kv):
        _as_validated(fig)
    assert len(frames(cycle)) > 1


def test_the_placeholder_and_speed_figures_are_valid_plotly():
    from eagleviz.measured import latest_bench, latest_verify_cost
    from eagleviz.visuals.speed import speed_view
    from eagleviz.visuals.style import empty_figure

    _as_validated(empty_figure("nothing yet"))
    speed = speed_view([latest_bench(0.0)], latest_verify_cost())
    for fig in [p.figure for p in speed.benches] + [speed.curve]:
        _as_validated(fig)


# ------------------------------------------------------------------ readable at any width: a phone, deep trees, T > 0

DEEP = [synthetic_cycle(steps=s, topk=4, draft_tokens=40, accept=3, seed=s) for s in (2, 5, 8)]
# A 390-px phone as tests/test_figures_browser.py finds it: each figure is 320 px wide, Plotly's toolbar covers
# its top 28 px; text is measured at DejaVu Sans' average advance (~0.5 em, taken as 0.56) and 1.3 em a line.
PHONE_PX, TOOLBAR_PX, LINE_EM = 320, 28, 1.3
TREE_PLOT_PX = PHONE_PX - 64       # less the depth axis and the margins
GRID_PLOT_PX = PHONE_PX - 120      # less the grid's row names and the margins


def _width(text: str, size: float) -> float:
    return len(html.unescape(re.sub(r"<[^>]+>", "", text))) * size * 0.56


def _plot_top(fig, plot_width: float) -> float:
    """Where the plot starts: under the top margin, which holds the title and a legend above the plot as a phone
    wraps it to `plot_width` (its foot a gap above the plot, its top under the title's band). A legend under the
    plot: its rows, so wrapped, end at the figure's foot."""
    if fig.layout.legend.yref == "container":
        from eagleviz.visuals.fit import LEGEND_GAP_PX, LEGEND_ROW_PX, legend_names, legend_rows

        rows = legend_rows(legend_names([t.to_plotly_json() for t in fig.data]), plot_width)
        if fig.layout.legend.yanchor == "top":
            assert fig.layout.legend.y * fig.layout.height == pytest.approx(rows * LEGEND_ROW_PX)
        else:
            foot = (1 - fig.layout.legend.y) * fig.layout.height
            assert fig.layout.legend.yanchor == "bottom"
            assert foot + LEGEND_GAP_PX == pytest.approx(fig.layout.margin.t, abs=1)
            assert foot - rows * LEGEND_ROW_PX >= _title_box(fig)[1]
    return fig.layout.margin.t


def _title_box(fig) -> tuple[float, float]:
    """Top and bottom of the title in px: Plotly centres its first line a third of an em over a middle anchor
    (hangs it from a top one), the others follow."""
    title = fig.layout.title
    assert title.yref == "container", "the title is placed from the figure's top"
    size = title.font.size
    line = LINE_EM * size
    first = (1 - title.y) * fig.layout.height - (line / 2 + 0.35 * size if title.yanchor == "middle" else 0)
    return first, first + line * (title.text.count("<br>") + 1)


def _figures(cycle):
    from eagleviz.visuals.views import cycle_figures

    run = synthetic_run([cycle], temperature=0.8 if any(c.uniform is not None for c in cycle.checks) else 0.0)
    shown = cycle_figures(run, 0)     # what the page draws
    return {"tree": shown.tree, "mask": shown.mask, "path": shown.path, "kv": shown.kv,
            "summary": summary_figure(run, 0), "replay": cycle_view(run, 0, replay_draws=100).replay}


@pytest.mark.parametrize("label,cycle", CYCLES[::2] + [("deep", DEEP[-1])], ids=IDS[::2] + ["deep"])
def test_titles_sit_under_the_toolbar_and_fit_a_phone_and_legends_follow_them(label, cycle):
    """Plotly's toolbar spans a phone's width at the top: every title starts under it, every line of it fits
    a phone, and the legend (and the plot) start under the title."""
    for name, fig in _figures(cycle).items():
        if not fig.layout.title.text:
            assert fig.layout.margin.t >= TOOLBAR_PX, name
            continue
        top, bottom = _title_box(fig)
        assert top >= TOOLBAR_PX, f"{name}: the title starts {top:.0f} px down, under the toolbar"
        head, *details = fig.layout.title.text.split("<br>")
        sizes = [int(m) for m in re.findall(r"font-size:(\d+)px", "".join(details))]
        assert _width(head, fig.layout.title.font.size) <= PHONE_PX - 20, name
        assert all(_width(d, size) <= PHONE_PX - 20 for d, size in zip(details, sizes)), name
        assert fig.layout.margin.t >= bottom, f"{name}: the plot starts inside the title"
        if fig.layout.legend.yref == "container":
            assert (1 - fig.layout.legend.y) * fig.layout.height >= bottom, f"{name}: the legend is on the title"


def test_a_deeper_tree_is_a_taller_figure_with_its_levels_apart():
    """Each level holds a node, its label under it and a label over the next level's nodes, on a phone."""
    heights, node = [], STATUS_STYLE["accepted"][2]
    for cycle in DEEP:
        fig = draft_tree_figure(cycle)
        depth = len(fig.layout.yaxis.tickvals) - 1
        label = next(t.textfont.size for t in fig.data if t.mode == "markers+text")
        level = (fig.layout.height - _plot_top(fig, TREE_PLOT_PX) - fig.layout.margin.b) / (depth + 1.2)
        assert level >= node + 2 * label * LINE_EM, f"{level:.0f} px per level at depth {depth}"
        heights.append(fig.layout.height)
    assert heights == sorted(heights) and heights[0] < heights[-1]


@pytest.mark.parametrize("label,cycle", CYCLES + [("deep", DEEP[-1])], ids=IDS + ["deep"])
def test_node_labels_keep_apart_on_a_phone(label, cycle):
    """Each label is a box of its estimated width under (or over) its node, at a phone's scale: no two boxes
    overlap, and no label lies on another verified node."""
    fig = draft_tree_figure(cycle)
    lo, hi = fig.layout.xaxis.range
    y_lo, y_hi = fig.layout.yaxis.range
    plot_h = fig.layout.height - _plot_top(fig, TREE_PLOT_PX) - fig.layout.margin.b
    px = lambda x, y: ((x - lo) * TREE_PLOT_PX / (hi - lo), (y_hi - y) * plot_h / (y_hi - y_lo))  # noqa: E731
    boxes, nodes = [], []
    for t in fig.data:
        if t.mode != "markers+text":
            continue
        for x, y, text, side in zip(t.x, t.y, t.text, t.textposition):
            cx, cy = px(x, y)
            half = t.marker.size / 2
            nodes.append((cx - half, cy - half, cx + half, cy + half))
            if text:
                w, h = _width(text, t.textfont.size), t.textfont.size * LINE_EM
                top = cy + half if side.startswith("bottom") else cy - half - h
                boxes.append((text, (cx - w / 2, top, cx + w / 2, top + h)))
    assert boxes

    def overlap(a, b):
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    for i, (t1, b1) in enumerate(boxes):
        for t2, b2 in boxes[i + 1:]:
            assert not overlap(b1, b2), f"labels {t1!r} and {t2!r} overlap"
        assert sum(overlap(b1, n) for n in nodes) == 0, f"label {t1!r} lies on a node"


def test_the_colour_scale_is_a_bar_of_fixed_length_with_its_labels_apart_between_title_and_legend():
    fig = draft_tree_figure(DEEP[-1])
    bar = fig.layout.coloraxis.colorbar
    assert bar.orientation == "h" and bar.lenmode == "pixels"
    gap = bar.len / (len(bar.ticktext) - 1)
    assert gap >= max(_width(t, bar.tickfont.size) for t in bar.ticktext) + 8
    top = (1 - bar.y) * fig.layout.height
    assert top >= _title_box(fig)[1] and (1 - fig.layout.legend.y) * fig.layout.height >= top + bar.thickness + 20


@pytest.mark.parametrize("label,cycle", [(k, c) for k, c in CYCLES if "sampling" in k], ids=lambda v: str(v)[:24])
def test_the_accepted_paths_rows_hold_their_labels_at_t_above_0(label, cycle):
    """As the page draws it: every grid row is as tall as its chips' two lines of label on a phone, and each
    label is drawn inside its chip (Plotly shrinks one that would not fit)."""
    fig = _figures(cycle)["path"]
    chips = next(t for t in fig.data if t.name == CHIPS)
    assert chips.textposition == "inside" and chips.textangle == 0 and fig.layout.uniformtext.mode == "hide"
    rows = len(fig.layout.yaxis.tickvals)
    plot_h = fig.layout.height - _plot_top(fig, GRID_PLOT_PX) - fig.layout.margin.b
    row = plot_h * (fig.layout.yaxis.domain[1] - fig.layout.yaxis.domain[0]) / rows
    assert row >= 2 * chips.textfont.size * LINE_EM + 8, f"{row:.0f} px per row"
    assert fig.layout.yaxis.domain[0] > fig.layout.yaxis2.domain[1]     # the grid over the p, q, u panel
    # The chips are the only bars with text: Plotly keeps its uniform text size per bar subplot, the last drawn
    # setting it for all, so a mark written as the panel's bar text let the chips' labels overflow on a phone.
    assert [t.name for t in fig.data if t.type == "bar" and t.text is not None] == [CHIPS]
    (marks,) = [t for t in fig.data if t.type == "scatter" and t.mode == "text"]
    assert list(marks.text) == [CHECK if c.accepted else CROSS for c in cycle.checks]
    # u and the verdict drawn over p's bar: the panel's scatter traces grouped as its bars are
    assert fig.layout.scattermode == "group" and all(t.offsetgroup == "p" for t in fig.data
                                                     if t.type == "scatter" and t.xaxis == "x2")


def test_the_summarys_panels_are_stacked_each_under_its_name_and_legend():
    run = synthetic_run([synthetic_cycle(index=i, accept=i % 3) for i in range(4)])
    fig = summary_figure(run, 1)
    panels = [fig.layout[f"yaxis{k}"].domain for k in ("", "2", "3")]
    assert all(fig.layout[f"xaxis{k}"].domain == (0, 1) for k in ("", "2", "3"))
    assert all(upper[0] > lower[1] for upper, lower in zip(panels, panels[1:])), panels
    names = sorted((n.y for n in fig.layout.annotations), reverse=True)
    assert [n > p[1] for n, p in zip(names, panels)] == [True] * 3
    assert all(n < lower[0] for n, lower in zip(names[1:], panels))     # under the panel above it
    assert fig.layout.legend.y > panels[0][1] and panels[1][0] < panels[0][0] and fig.layout.legend3.y > panels[2][1]
    assert all(_width(n.text, n.font.size) <= PHONE_PX - 20 for n in fig.layout.annotations)


def test_a_placeholder_message_is_wrapped_for_a_phone():
    from eagleviz.visuals.style import empty_figure

    message = "Run a prompt (or import a trace) to see the speculation cycles."
    lines = empty_figure(message).layout.annotations[0].text.split("<br>")
    assert " ".join(lines) == message and all(_width(line, 16) <= PHONE_PX - 20 for line in lines)
