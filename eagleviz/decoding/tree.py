"""The EAGLE-2 dynamic draft tree: candidates, expansion, reranking, the verification tree and its mask.

Expansion (EAGLE-2 section 4.1): at each drafting step every frontier node proposes its top-k children;
a child's score is the cumulative draft log-probability of its root-to-node path, and the global top-k
children by score become the next frontier. Reranking (section 4.2): of all candidates, the best
draft_tokens - 1 are verified. They are ranked by value, the chance of acceptance: EAGLE-2's own
exp(score) in a fixed tree, the calibrated chance in a cost-aware one (`eagleviz.decoding.calibration`);
either is monotone in the score, so within the head's nodes the order is EAGLE-2's. Nodes from prompt
lookup (`eagleviz.decoding.lookup`) carry their own value. A child's value never exceeds its parent's, so
the kept set is closed under ancestors; `rerank` enforces it even at exact ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

WORD = 62  # a mask row's bits unpacked from one int64 at a time


@dataclass
class Candidates:
    """Every draft token proposed in one cycle. Ids are indices into these lists; parent -1 is the root."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    expanded: list[bool] = field(default_factory=list)
    values: list[float] = field(default_factory=list)    # chance of acceptance (what reranking sorts by)
    sources: list[str] = field(default_factory=list)     # "eagle", "lookup" or "both"

    def __len__(self) -> int:
        return len(self.tokens)

    def add_children(self, parent: int, tokens: list[int], logprobs: list[float], value=None,
                     source: str = "eagle") -> list[int]:
        """Add the children of `parent` (-1 = root); returns their ids. value(score) -> the node's value
        (default exp(score), EAGLE-2's)."""
        base = 0.0 if parent < 0 else self.scores[parent]
        depth = 1 if parent < 0 else self.depths[parent] + 1
        ids = []
        for tok, lp in zip(tokens, logprobs):
            ids.append(len(self.tokens))
            score = base + float(lp)
            self.tokens.append(int(tok))
            self.parents.append(parent)
            self.depths.append(depth)
            self.logprobs.append(float(lp))
            self.scores.append(score)
            self.expanded.append(False)
            self.values.append(math.exp(min(score, 0.0)) if value is None else value(score))
            self.sources.append(source)
        return ids

    def child_with(self, parent: int, token: int) -> int | None:
        """The id of `parent`'s child holding `token`, if any (siblings hold distinct tokens)."""
        return next((i for i, (p, t) in enumerate(zip(self.parents, self.tokens)) if p == parent and t == token),
                    None)


def select_frontier(cands: Candidates, level_ids: list[int], k: int) -> list[int]:
    """The k best nodes of one level by cumulative score (ties broken by id): the nodes expanded next."""
    ranked = sorted(level_ids, key=lambda i: (-cands.scores[i], i))
    return ranked[:k]


def priority(cands: Candidates) -> list[int]:
    """Every candidate, best first: by value, then score, then depth (a parent before a child of equal value)."""
    return sorted(range(len(cands)), key=lambda i: (-cands.values[i], -cands.scores[i], cands.depths[i], i))


def rerank(cands: Candidates, budget: int, order: list[int] | None = None) -> list[int]:
    """Keep the best `budget` candidates by value, closed under ancestors, in verification order
    (by depth, then value). A node is taken only once its parent is (parents sort first: value >= child's).
    order: `priority(cands)` when the caller has it already."""
    order = priority(cands) if order is None else order
    kept: set[int] = set()
    for i in order:
        if len(kept) == budget:
            break
        if cands.parents[i] < 0 or cands.parents[i] in kept:
            kept.add(i)
    return sorted(kept, key=lambda i: (cands.depths[i], -cands.values[i], -cands.scores[i], i))


@dataclass(frozen=True)
class VerifyTree:
    """The tokens sent to the target: slot 0 is the root, then the kept nodes in topological order.

    node_ids[s] is the candidate id at slot s (-1 for the root); parents[s] is a slot index."""

    node_ids: list[int]
    tokens: list[int]
    parents: list[int]
    depths: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def build(cls, cands: Candidates, kept: list[int], root_token: int) -> VerifyTree:
        slot_of = {node: s + 1 for s, node in enumerate(kept)}
        parents = [-1] + [0 if cands.parents[n] < 0 else slot_of[cands.parents[n]] for n in kept]
        return cls(node_ids=[-1] + list(kept), tokens=[root_token] + [cands.tokens[n] for n in kept],
                   parents=parents, depths=[0] + [cands.depths[n] for n in kept])

    def mask(self) -> torch.Tensor:
        """(T, T) bool: slot i may attend to slot j iff j is an ancestor of i or i itself. Each row's bits are its
        parent's plus its own (a Python integer of T bits), unpacked WORD columns at a time: a few operations
        whatever the tree's shape (a drafted cycle's trace builds one)."""
        rows: list[int] = []
        for s, p in enumerate(self.parents):
            if not (p == -1 if s == 0 else 0 <= p < s):
                raise ValueError(f"parents must be topological from a root at slot 0; parents[{s}] = {p}")
            rows.append((rows[p] if p >= 0 else 0) | 1 << s)
        t = len(rows)
        parts = []
        for at in range(0, t, WORD):
            width = min(WORD, t - at)
            bits = torch.tensor([(r >> at) & ((1 << width) - 1) for r in rows])
            parts.append(((bits[:, None] >> torch.arange(width)) & 1) != 0)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def children(self) -> list[list[int]]:
        """children[s]: the slots whose parent is s, in slot order (best draft score first)."""
        out: list[list[int]] = [[] for _ in self.tokens]
        for s, p in enumerate(self.parents):
            if p >= 0:
                out[p].append(s)
        return out

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf chain of slots."""
        kids = self.children()
        out = []
        for leaf in (s for s in range(len(self.tokens)) if not kids[s]):
            chain = [leaf]
            while self.parents[chain[-1]] >= 0:
                chain.append(self.parents[chain[-1]])
            out.append(chain[::-1])
        return out
