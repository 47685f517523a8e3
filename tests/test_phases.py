"""eagleviz/visuals/phases.py: a cycle played as its events in order; each frame shows only what had happened."""

from __future__ import annotations

import pytest

from eagleviz.visuals import accepted_path_figure, attention_mask_figure, draft_tree_figure, kv_rewind_figure
from eagleviz.visuals.draft_tree import BONUS_NODE, build_graph
from eagleviz.visuals.kv_rewind import ROWS, written_expansions
from eagleviz.visuals.phases import FINAL, PHASES, Frame, caption, frame_at, frames, label, tree_depth
from eagleviz.visuals.style import CHIPS, chip_centres
from test_visuals import CYCLES, IDS


@pytest.mark.parametrize("label_,cycle", CYCLES, ids=IDS)
def test_frames_run_draft_levels_then_verify_accept_rewind(label_, cycle):
    fs = frames(cycle)
    depth = tree_depth(cycle)
    assert [f.phase for f in fs] == ["draft"] * depth + list(PHASES[1:])
    assert [f.level for f in fs[:depth]] == list(range(1, depth + 1))
    assert fs[-1].phase == FINAL.phase and frame_at(cycle, None) == fs[-1]
    assert frame_at(cycle, -3) == fs[0] and frame_at(cycle, 99) == fs[-1]
    assert len({label(f) for f in fs}) == len(fs) and all(caption(cycle, f) for f in fs)


@pytest.mark.parametrize("label_,cycle", CYCLES, ids=IDS)
def test_the_tree_grows_level_by_level_and_gets_its_verdicts_last(label_, cycle):
    previous = 0
    for f in frames(cycle):
        g = build_graph(cycle, f)
        statuses = {d["status"] for v, d in g.nodes(data=True) if v != "root"}
        if f.phase == "draft":
            assert max(d["depth"] for _, d in g.nodes(data=True)) == f.level
            assert statuses <= {"drafted"} and BONUS_NODE not in g
            assert g.number_of_nodes() - 1 == sum(n.depth <= f.level for n in cycle.nodes) > previous
            previous = g.number_of_nodes() - 1
        elif f.phase == "verify":
            assert statuses <= {"sent", "pruned"} and BONUS_NODE not in g
            assert sum(s == "sent" for _, s in g.nodes(data="status")) == cycle.num_tree_tokens - 1
        else:
            assert BONUS_NODE in g and "sent" not in statuses and "drafted" not in statuses
    # the end state is the figure the page shows without a phase
    assert draft_tree_figure(cycle, frame=frames(cycle)[-1]).to_json() == draft_tree_figure(cycle).to_json()


@pytest.mark.parametrize("label_,cycle", CYCLES, ids=IDS)
def test_mask_path_and_kv_appear_when_their_phase_has_happened(label_, cycle):
    for f in frames(cycle):
        mask = attention_mask_figure(cycle, frame=f)
        has_heatmap = any(t.type == "heatmap" for t in mask.data)
        assert has_heatmap == f.reached("verify")
        if has_heatmap:  # accepted rows are outlined only once the target's verdicts are known
            outlined = [s for s in mask.layout.shapes if s.type == "rect"]
            assert len(outlined) == (len(cycle.path) if f.reached("accept") else 0)
        path = accepted_path_figure(cycle, frame=f)
        assert bool(path.data) == f.reached("accept")
        kv = kv_rewind_figure(cycle, frame=f)
        ys = {y for t in kv.data if t.name == CHIPS for _, y in chip_centres(t)}
        assert (ROWS["target_before"] in ys) == True  # the prefix chip is always drawn  # noqa: E712
        assert (ROWS["target_after"] in ys) == f.reached("rewind")
        assert bool(kv.layout.annotations) == (f.reached("rewind") and bool(cycle.path))
        tree_cells = sum(1 for t in kv.data if t.name == CHIPS for _, y in chip_centres(t) if y == ROWS["target_before"])
        assert tree_cells == 1 + (cycle.num_tree_tokens if f.reached("verify") else 0)
    written = [written_expansions(cycle, f) for f in frames(cycle)]
    assert written == sorted(written) and written[-1] == len(cycle.kv_draft.appended)
    assert written[0] == 0  # level 1 comes from encoding the committed tokens: no expansion slot yet


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="phase"):
        Frame("prefill")
