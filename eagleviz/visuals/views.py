"""Everything the app shows for one selected cycle, built in one call, and the checks an imported trace
must pass before any figure is drawn from it.

    cycle_view      the cycle's four figures, their texts, the replay, its list of tokens (end state)
    cycle_figures   the four figures alone at one frame of the cycle and with one token focused: what stepping
                    through the phases or picking a token redraws (the replay does not change)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go

from eagleviz.trace import RunTrace
from eagleviz.visuals import explain
from eagleviz.visuals.accepted_path import accepted_path_figure
from eagleviz.visuals.attention_mask import attention_mask_figure
from eagleviz.visuals.draft_tree import draft_tree_figure
from eagleviz.visuals.kv_rewind import kv_rewind_figure
from eagleviz.visuals.phases import caption as phase_caption
from eagleviz.visuals.phases import frame_at, frames
from eagleviz.visuals.replay import replay_acceptance, replay_figure
from eagleviz.visuals.selection import Focus, cycle_tokens, focus
from eagleviz.visuals.style import empty_figure

NO_RUN = "Run a prompt (or import a trace) to see the speculation cycles."
GRID_HEIGHT = 275   # px of a placeholder figure; the figures of a cycle are as tall as their content needs


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
    tokens: list[tuple[str, str]] = field(default_factory=list)   # the cycle's tokens to pick from
    frames: int = 1                                               # frames of the cycle in motion
    phase_text: str = ""                                          # what happens at the shown frame
    focus_text: str = ""                                          # the selected token, where it went


@dataclass
class CycleFigures:
    """The four figures at one frame, with a focused token, and one line saying what happens then."""

    tree: go.Figure
    mask: go.Figure
    path: go.Figure
    kv: go.Figure
    phase_text: str
    focus_text: str


def empty_view(message: str = NO_RUN) -> CycleView:
    blank = empty_figure(message, GRID_HEIGHT)
    return CycleView(blank, blank, blank, blank, blank, message, "", "", "", "", "")


def _cycle(run: RunTrace | None, index: int):
    if run is None or not run.cycles:
        return None
    return run.cycles[max(0, min(int(index), len(run.cycles) - 1))]


def _empty_message(run: RunTrace | None) -> str:
    return NO_RUN if run is None else "This trace has no speculation cycles (plain decoding)."


def cycle_figures(run: RunTrace | None, index: int, frame: int | None = None, slot: int | None = None) -> CycleFigures:
    """The four figures of cycle `index` at frame `frame` (None: the end state), with token `slot` focused
    (None: none; a slot outside the tree is ignored)."""
    cycle = _cycle(run, index)
    if cycle is None:
        blank = empty_figure(_empty_message(run), GRID_HEIGHT)
        return CycleFigures(blank, blank, blank, blank, "", "")
    at = frame_at(cycle, frame)
    try:
        chosen: Focus | None = None if slot is None else focus(cycle, int(slot))
    except ValueError:
        chosen = None
    return CycleFigures(draft_tree_figure(cycle, frame=at, focus=chosen),
                        attention_mask_figure(cycle, frame=at, focus=chosen),
                        accepted_path_figure(cycle, frame=at, focus=chosen),
                        kv_rewind_figure(cycle, frame=at, focus=chosen),
                        phase_caption(cycle, at), chosen.describe() if chosen else "")


def cycle_view(run: RunTrace | None, index: int, replay_draws: int = 10_000, slot: int | None = None) -> CycleView:
    """Figures and texts for cycle `index` of `run` (clamped to the recorded range), at its end state."""
    cycle = _cycle(run, index)
    if cycle is None:
        return empty_view(_empty_message(run))
    figures = cycle_figures(run, cycle.index, None, slot)
    replay = replay_acceptance(cycle, replay_draws, seed=cycle.index)
    return CycleView(
        tree=figures.tree, mask=figures.mask, path=figures.path, kv=figures.kv,
        replay=replay_figure(cycle, replay_draws, seed=cycle.index),
        caption=explain.cycle_caption(run, cycle), tree_text=explain.tree_text(cycle, run.config.get("tree")),
        mask_text=explain.mask_text(cycle), path_text=explain.path_text(cycle), kv_text=explain.kv_text(cycle),
        replay_text=explain.replay_text(cycle, replay), tokens=cycle_tokens(cycle), frames=len(frames(cycle)),
        phase_text=figures.phase_text, focus_text=figures.focus_text)


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
