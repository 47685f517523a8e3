"""eagleviz/visuals/selection.py: one token followed through every view, on recorded and hand-built cycles."""

from __future__ import annotations

import pytest

from eagleviz.visuals import accepted_path_figure, attention_mask_figure, draft_tree_figure, kv_rewind_figure
from eagleviz.visuals.accepted_path import focus_cells
from eagleviz.visuals.draft_tree import BONUS_NODE, ROOT, build_graph, tidy_layout
from eagleviz.visuals.kv_rewind import ROWS, focus_slots
from eagleviz.visuals.selection import BONUS, cycle_tokens, focus, output_origin, slot_of_item
from eagleviz.visuals.style import FOCUS, token_label
from test_visuals import CYCLES, IDS, RECORDED, recorded


def _slots(cycle):
    return list(range(cycle.num_tree_tokens)) + [BONUS]


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_focus_follows_the_token_into_every_view(label, cycle):
    S = cycle.kv_target.before
    for slot in _slots(cycle):
        f = focus(cycle, slot)
        if slot == BONUS:
            assert (f.text, f.status, f.kv_before, f.kv_after) == (cycle.bonus_text, "bonus", None, None)
            assert f.path_column == cycle.accept_length + 1
            continue
        assert f.text == cycle.texts[slot] and f.depth == cycle.positions[slot] - S
        assert f.kv_before == S + slot
        if slot in cycle.path:
            # after the commit the token sits where the rewind put it: the path compacted after the prefix
            assert f.kv_after == S + cycle.path.index(slot)
            assert f.status == ("root" if slot == 0 else "accepted")
        else:
            assert f.kv_after is None and f.status in ("rejected", "verified")
        tried = [c for c in cycle.checks if c.slot == slot]
        assert (f.check is not None) == bool(tried)
        if tried:
            assert cycle.checks[f.check].slot == slot
            assert f.status == ("accepted" if tried[0].accepted else "rejected")
        if slot:
            node = next(n for n in cycle.nodes if n.id == f.node)
            assert node.slot == slot and node.text == cycle.texts[slot]


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_every_figure_outlines_the_focused_token_where_it_is(label, cycle):
    g = build_graph(cycle)
    pos = tidy_layout(g)
    for slot in _slots(cycle):
        f = focus(cycle, slot)
        tree = draft_tree_figure(cycle, focus=f)
        ring = [t for t in tree.data if t.name == "selected token"]
        key = BONUS_NODE if slot == BONUS else ROOT if slot == 0 else f.node
        assert len(ring) == 1 and (ring[0].x[0], ring[0].y[0]) == pos[key]
        assert ring[0].marker.color == FOCUS
        mask = attention_mask_figure(cycle, focus=f)
        outlined = [s for s in mask.layout.shapes if s.line.color == FOCUS]
        if slot == BONUS:
            assert not outlined  # the bonus is not in this cycle's tree: no row, no column
        else:
            row, col = outlined  # the token's row (across the prefix column and the tree), then its column
            assert (row.x0, row.y0, row.y1) == (-0.5, slot - 0.5, slot + 0.5)
            assert (col.x0, col.x1, col.y0) == (slot + 0.5, slot + 1.5, -0.5)  # column 0 is the prefix
        path_boxes = [t for t in accepted_path_figure(cycle, focus=f).data if t.type == "scatter" and t.line.color == FOCUS]
        assert len(path_boxes) == len(focus_cells(cycle, f))
        if f.status in ("accepted", "bonus"):
            assert (f.path_column, 0) in focus_cells(cycle, f)
        kv_boxes = [t for t in kv_rewind_figure(cycle, focus=f).data if t.type == "scatter" and t.line.color == FOCUS]
        expect = focus_slots(cycle, f)
        assert len(kv_boxes) == len(expect) == (0 if slot == BONUS else 1 + (f.kv_after is not None))
        if expect:
            assert expect[0] == (slot, ROWS["target_before"])


def test_a_slot_outside_the_tree_is_refused():
    cycle = CYCLES[0][1]
    with pytest.raises(ValueError, match="slots 0"):
        focus(cycle, cycle.num_tree_tokens)


@pytest.mark.parametrize("label,cycle", CYCLES, ids=IDS)
def test_the_token_list_names_every_slot_then_the_bonus(label, cycle):
    items = cycle_tokens(cycle)
    assert len(items) == cycle.num_tree_tokens + 1
    for k, (text, status) in enumerate(items):
        slot = slot_of_item(cycle, k)
        assert status == focus(cycle, slot).status
        assert text.endswith(token_label(cycle.bonus_text if slot == BONUS else cycle.texts[slot]))


@pytest.mark.parametrize("name", RECORDED)
def test_every_output_token_leads_back_to_the_cycle_that_committed_it(name):
    run = recorded(name)
    seen = set()
    for i, token in enumerate(run.output):
        where = output_origin(run, i)
        assert where is not None
        c, slot = where
        cycle = run.cycles[c]
        assert (cycle.bonus_token if slot == BONUS else cycle.tokens[slot]) == token.token
        assert c == max(token.cycle, 0)
        seen.add((c, slot))
    assert len(seen) == len(run.output)  # no two output tokens land on the same cycle token
    assert output_origin(run, len(run.output)) is None and output_origin(run, -1) is None
