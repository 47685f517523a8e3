"""Everything the app shows for one selected cycle, built in one call, and the checks an imported trace
must pass before any figure is drawn from it."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from eagleviz.trace import RunTrace
from eagleviz.visuals import explain
from eagleviz.visuals.accepted_path import accepted_path_figure
from eagleviz.visuals.attention_mask import attention_mask_figure
from eagleviz.visuals.draft_tree import draft_tree_figure
from eagleviz.visuals.kv_rewind import kv_rewind_figure
from eagleviz.visuals.replay import replay_acceptance, replay_figure
from eagleviz.visuals.style import empty_figure

NO_RUN = "Run a prompt (or import a trace) to see the speculation cycles."


@dataclass
class CycleView:
    tree: go.Figure
    mask: go.Figure
    path: go.Figure
    kv: go.Figure
    replay: go.Figure
    caption: str
    tree_text: str
    mask_text: str
    path_text: str
    kv_text: str
    replay_text: str


def empty_view(message: str = NO_RUN) -> CycleView:
    blank = empty_figure(message)
    return CycleView(blank, blank, blank, blank, blank, message, "", "", "", "", "")


def cycle_view(run: RunTrace | None, index: int, replay_draws: int = 10_000) -> CycleView:
    """Figures and texts for cycle `index` of `run` (clamped to the recorded range)."""
    if run is None or not run.cycles:
        return empty_view(NO_RUN if run is None else "This trace has no speculation cycles (plain decoding).")
    cycle = run.cycles[max(0, min(index, len(run.cycles) - 1))]
    replay = replay_acceptance(cycle, replay_draws, seed=cycle.index)
    return CycleView(
        tree=draft_tree_figure(cycle), mask=attention_mask_figure(cycle), path=accepted_path_figure(cycle),
        kv=kv_rewind_figure(cycle), replay=replay_figure(cycle, replay_draws, seed=cycle.index),
        caption=explain.cycle_caption(run, cycle), tree_text=explain.tree_text(cycle, run.config.get("tree")),
        mask_text=explain.mask_text(cycle), path_text=explain.path_text(cycle), kv_text=explain.kv_text(cycle),
        replay_text=explain.replay_text(cycle, replay))


def check_displayable(run: RunTrace) -> None:
    """Raise ValueError when a (parsed) trace is internally inconsistent, so that figures never fail on it."""
    for c in run.cycles:
        T = len(c.tokens)
        where = f"cycle {c.index}"
        if T == 0 or not (len(c.texts) == len(c.parents) == len(c.positions) == len(c.target_texts)
                          == len(c.target_probs) == len(c.verify_nodes) == T):
            raise ValueError(f"{where}: per-slot lists must all have the tree's length")
        if len(c.mask) != T or any(len(row) != T for row in c.mask):
            raise ValueError(f"{where}: the mask must be {T}x{T}")
        if c.parents[0] != -1 or any(not 0 <= p < s for s, p in enumerate(c.parents) if s):
            raise ValueError(f"{where}: parents must be topological with the root at slot 0")
        if not c.path or c.path[0] != 0 or any(not 0 <= s < T for s in c.path):
            raise ValueError(f"{where}: the path must start at the root and stay inside the tree")
        if c.accept_length != len(c.path) - 1:
            raise ValueError(f"{where}: accept_length must equal the path length - 1")
        ids = {n.id for n in c.nodes}
        if any(n.parent not in ids and n.parent != -1 for n in c.nodes):
            raise ValueError(f"{where}: a node's parent is missing")
        if any(n.kept and not 0 < n.slot < T for n in c.nodes) or any(not 0 < ch.slot < T for ch in c.checks):
            raise ValueError(f"{where}: a slot index is out of range")
        if any(v not in ids for v in c.verify_nodes[1:]):
            raise ValueError(f"{where}: verify_nodes names an unknown node")
