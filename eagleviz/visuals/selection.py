"""Linked selection: one token of a cycle followed through every view.

A token is picked once, from the output text, from the list of the cycle's tokens, or by jumping to a cycle;
`focus` then says where it is in each figure: its node in the draft tree, its row and column in the mask,
its column in the path panel, and its target cache slot before and after the rewind. Every figure draws the
focus with the same outline (`style.FOCUS`). All of it is read from the trace.

Tokens of a cycle are named by verification slot (0 = the root), or BONUS for the target's own token, which
is not in this cycle's tree or cache (it becomes the next cycle's root).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagleviz.trace import CycleTrace, RunTrace
from eagleviz.visuals.style import token_label

BONUS = -1


@dataclass(frozen=True)
class Focus:
    """Where one token of a cycle is drawn. None means "not in that view"."""

    slot: int                   # verification slot, or BONUS
    text: str
    status: str                 # root, accepted, rejected, verified (not reached) or bonus
    node: int | None            # draft-tree node id (None for the root and the bonus)
    depth: int
    path_column: int | None     # depth column of the path panel (accepted tokens and the bonus)
    check: int | None           # index into cycle.checks when the target tried this token
    kv_before: int | None       # absolute target cache slot the verify forward wrote it to
    kv_after: int | None        # absolute target cache slot after the rewind (None: discarded)

    def describe(self) -> str:
        """One line for the page: the token and where it went."""
        where = {"root": "the last committed token, the root of this cycle's tree",
                 "accepted": "a draft token the target accepted",
                 "rejected": "a draft token the target rejected",
                 "verified": "verified but never reached (an ancestor was rejected)",
                 "bonus": "the target's own token after the accepted path; the next cycle's root"}[self.status]
        name = "bonus" if self.slot == BONUS else f"slot {self.slot}"
        kv = ""
        if self.kv_before is not None:
            kv = (f"; KV slot {self.kv_before} \u2192 {self.kv_after}" if self.kv_after is not None
                  else f"; KV slot {self.kv_before}, discarded by the rewind")
        return f"Selected {name} {self.text!r}, depth {self.depth}: {where}{kv}."


def slot_statuses(cycle: CycleTrace) -> list[str]:
    """The target's verdict on each verification slot: root, accepted, rejected, or verified (never reached).
    The one place these are decided; the tree figure and the token list read them."""
    accepted = set(cycle.path[1:])
    rejected = {c.slot for c in cycle.checks if not c.accepted}
    return ["root" if s == 0 else "accepted" if s in accepted else "rejected" if s in rejected else "verified"
            for s in range(cycle.num_tree_tokens)]


def status_of(cycle: CycleTrace, slot: int) -> str:
    return "bonus" if slot == BONUS else slot_statuses(cycle)[slot]


def focus(cycle: CycleTrace, slot: int) -> Focus:
    """Where token `slot` of `cycle` appears in each view. Raises ValueError for a slot outside the tree."""
    if slot != BONUS and not 0 <= slot < cycle.num_tree_tokens:
        raise ValueError(f"cycle {cycle.index} has slots 0 .. {cycle.num_tree_tokens - 1}, not {slot}")
    S = cycle.kv_target.before
    if slot == BONUS:
        return Focus(BONUS, cycle.bonus_text, "bonus", None, cycle.accept_length + 1, cycle.accept_length + 1,
                     None, None, None)
    check = next((k for k, c in enumerate(cycle.checks) if c.slot == slot), None)
    on_path = cycle.path.index(slot) if slot in cycle.path else None
    node = cycle.verify_nodes[slot] if slot > 0 else None
    return Focus(slot, cycle.texts[slot], status_of(cycle, slot), node, cycle.positions[slot] - S,
                 on_path if on_path else None, check, S + slot, None if on_path is None else S + on_path)


def cycle_tokens(cycle: CycleTrace) -> list[tuple[str, str]]:
    """The cycle's tokens as (label, status) pairs, slots in order then the bonus: the list a token is picked
    from. Item k is slot k; the last item is the bonus."""
    items = [(f"{s}:{token_label(text)}", status) for s, (text, status) in enumerate(zip(cycle.texts,
                                                                                         slot_statuses(cycle)))]
    return items + [(f"\u2605{token_label(cycle.bonus_text)}", "bonus")]


def slot_of_item(cycle: CycleTrace, item: int) -> int:
    """The slot of item `item` of `cycle_tokens` (the last item is the bonus)."""
    return BONUS if item >= cycle.num_tree_tokens else max(0, item)


def output_origin(run: RunTrace, index: int) -> tuple[int, int] | None:
    """(cycle, slot) of output token `index`: the cycle that committed it and its slot there. The prefill's
    token is cycle 0's root; a bonus token is shown in the cycle that produced it. None when the token was not
    produced by a recorded cycle (plain decoding, or an index out of range)."""
    if not 0 <= index < len(run.output) or not run.cycles:
        return None
    token = run.output[index]
    if token.cycle < 0:
        return (0, 0) if token.source == "prefill" else None
    if token.cycle >= len(run.cycles):
        return None
    k = sum(1 for t in run.output[:index] if t.cycle == token.cycle)
    cycle = run.cycles[token.cycle]
    return (token.cycle, cycle.path[k + 1] if k < cycle.accept_length else BONUS)


def took_other_branch(cycle: CycleTrace) -> bool:
    """True when the accepted path went through a draft node that was not its parent's best-scored kept child:
    the tree's width, not only its depth, found the target's tokens (what a chain would have missed)."""
    nodes = {n.id: n for n in cycle.nodes}
    for slot in cycle.path[1:]:
        node = nodes.get(cycle.verify_nodes[slot])
        if node is None:
            continue
        siblings = [n.score for n in cycle.nodes if n.parent == node.parent and n.kept]
        if node.score < max(siblings):
            return True
    return False
