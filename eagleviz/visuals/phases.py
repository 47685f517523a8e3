"""A cycle in motion: its events in the order the engine ran them, as frames the figures are drawn at.

    draft, level 1 .. D   the tree grows one level per draft forward (the frontier's children)
    verify                reranking keeps the verification budget; one target forward over the tree, with the mask
    accept                the target's choices are compared with the drafts, depth by depth
    rewind                the accepted path's KV slots are compacted; the rest is dropped

Each figure takes a Frame and shows only what had happened by then; the last frame is the cycle's end state
(what the page shows when no phase is chosen). Every frame is drawn from the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagleviz.trace import CycleTrace

PHASES = ("draft", "verify", "accept", "rewind")


@dataclass(frozen=True)
class Frame:
    phase: str
    level: int = 0      # draft level shown (1 .. levels) in the draft phase; 0 afterwards
    levels: int = 0     # the tree's depth

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}")

    def reached(self, phase: str) -> bool:
        """Whether `phase` has started by this frame."""
        return PHASES.index(self.phase) >= PHASES.index(phase)

    @property
    def depth_shown(self) -> int | None:
        """The deepest tree level drawn (None: all)."""
        return self.level if self.phase == "draft" else None


FINAL = Frame("rewind")


def tree_depth(cycle: CycleTrace) -> int:
    return max((n.depth for n in cycle.nodes), default=1)


def frames(cycle: CycleTrace) -> list[Frame]:
    d = tree_depth(cycle)
    return [Frame("draft", k, d) for k in range(1, d + 1)] + [Frame(p, 0, d) for p in PHASES[1:]]


def frame_at(cycle: CycleTrace, index: int | None) -> Frame:
    """Frame `index` of the cycle, clamped; None is the end state."""
    all_frames = frames(cycle)
    if index is None:
        return all_frames[-1]
    return all_frames[max(0, min(int(index), len(all_frames) - 1))]


def label(frame: Frame) -> str:
    """The frame's name for the phase control."""
    if frame.phase == "draft":
        return f"draft, level {frame.level} of {frame.levels}"
    return frame.phase


def caption(cycle: CycleTrace, frame: Frame) -> str:
    """One line saying what happens in this frame, with the cycle's numbers."""
    if frame.phase == "draft":
        level = [n for n in cycle.nodes if n.depth == frame.level]
        parents = len({n.parent for n in level})
        return (f"**Draft, level {frame.level} of {frame.levels}:** one draft forward over {parents} frontier "
                f"node{'s' * (parents != 1)} proposes {len(level)} candidate{'s' * (len(level) != 1)}. "
                "The target has not run yet.")
    if frame.phase == "verify":
        kept = cycle.num_tree_tokens - 1
        return (f"**Verify:** reranking keeps the {kept} best of {len(cycle.nodes)} candidates; the target reads "
                f"all {cycle.num_tree_tokens} tree tokens in **one** forward, each seeing only its ancestors "
                "(the mask).")
    if frame.phase == "accept":
        return (f"**Accept:** compared depth by depth with the target's choices, {cycle.accept_length} draft "
                f"token{'s' * (cycle.accept_length != 1)} accepted, then the target's own bonus token "
                f"{cycle.bonus_text!r}: {cycle.accept_length + 1} committed by one target forward.")
    moved = len(cycle.kv_target.moves)
    return (f"**Rewind:** the accepted path's KV entries are compacted after the prefix ({moved} moved), the "
            f"{cycle.num_tree_tokens - len(cycle.path)} other tree slots are dropped; the target cache grows "
            f"from {cycle.kv_target.before} to {cycle.kv_target.after}.")
