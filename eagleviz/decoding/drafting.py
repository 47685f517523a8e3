"""Phase 1 of a cycle: grow the draft tree and choose what the target verifies.

    head levels    encode the pending positions into the draft's stable cache, then grow the tree level by
                   level (EAGLE-2 expansion: each frontier node proposes its top-k children, the global top-k
                   by cumulative score become the next frontier); a cost-aware tree stops early when another
                   level is not worth its price (`eagleviz.decoding.policy`)
    lookup         add the continuation of the context's longest recurring suffix as a branch below the root,
                   merged with the head's nodes where they agree (`eagleviz.decoding.lookup`)
    rerank         keep the best nodes by value, closed under ancestors: `draft_tokens - 1` of them in a fixed
                   tree, the number that maximises expected tokens per unit cost in a cost-aware one

The host reads device values once per level (the top-k children, which choose the next frontier), or, where
the target's steps are static (a GPU), once per drafting (`eagleviz.decoding.device_draft`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from eagleviz.config import TreeConfig
from eagleviz.decoding.calibration import IDENTITY, Calibration
from eagleviz.decoding.device_draft import DeviceDrafter
from eagleviz.decoding.lookup import Match
from eagleviz.decoding.policy import TreePolicy
from eagleviz.decoding.tree import Candidates, VerifyTree, priority, rerank, select_frontier
from eagleviz.models.host import to_device, to_host
from eagleviz.models.kv_cache import KVCache


@dataclass
class Draft:
    """What phase 1 produced: the candidates, the verification tree, the draft levels run, the expected
    tokens the cycle commits (bonus included) and one sentence on the policy's decision ("" in a fixed tree).
    head_paid: a cost-aware tree's head drafted and its cycle's best rate beat the same cycle without it."""

    cands: Candidates
    tree: VerifyTree
    levels: int
    expected: float
    decision: str = ""
    lookup_ngram: int = 0
    head_paid: bool = False


def causal(n: int, device) -> torch.Tensor:
    """(n, n) bool: each position sees itself and the positions before it."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


ROOT_ALONE = "No tree was expected to beat a plain step: the root alone was verified."


def grow(engine, feats: torch.Tensor | None, pend_tokens: list[int], dcache: KVCache | DeviceDrafter | None, cfg: TreeConfig,
         root: int, draft_tokens: int, policy: TreePolicy | None, match: Match | None, run_head: bool = True) -> Draft:
    """Grow the tree for one cycle and choose its verified nodes (at most `draft_tokens` tokens, root included).
    feats: (n, F) target features of the pending positions, paired with pend_tokens; policy None: SGLang's
    fixed tree; match: a lookup continuation to merge (None: none). The head runs unless run_head is False
    (a cost-aware tree resting it) or the run is lookup-only (cfg.source == "lookup": feats/dcache are None)."""
    cands = Candidates()
    if not run_head and match is None:  # nothing to verify but the root: the cycle is a plain step
        return Draft(cands, VerifyTree.build(cands, [], root), 0, 1.0, ROOT_ALONE if policy is not None else "")
    calibration = policy.calibration if policy is not None else None
    levels, decision = 0, ""
    if run_head and cfg.source != "lookup":
        levels, decision = _head_levels(engine, cands, feats, pend_tokens, dcache, cfg, draft_tokens, policy)
    if match is not None:
        _merge_lookup(cands, match, calibration)
    order = priority(cands)
    values = [cands.values[i] for i in order]
    head_paid = False
    if policy is None:
        size = draft_tokens - 1
    else:
        choice = policy.budget(values, levels, draft_tokens - 1)
        size = choice.size
        if levels:  # the same cycle without the head: its lookup chain alone, nothing drafted
            alone = _lookup_values(match, calibration) if match is not None else []
            head_paid = choice.rate > policy.budget(alone, 0, draft_tokens - 1).rate
        decision = f"{decision} {verified(size, len(cands), choice.rate)}".strip()
    kept = rerank(cands, size, order)
    expected = 1.0 + sum(cands.values[i] for i in kept)
    return Draft(cands, VerifyTree.build(cands, kept, root), levels, expected, decision,
                 match.ngram if match is not None else 0, head_paid)


def _head_levels(engine, cands: Candidates, feats, pend_tokens, dcache, cfg: TreeConfig, draft_tokens: int,
                 policy: TreePolicy | None) -> tuple[int, str]:
    """Run the head: the pending positions, then up to cfg.steps - 1 expansions. Returns the levels drafted
    and, when the policy stopped early, why."""
    head, target, dev = engine.head, engine.target, engine.target.device
    value = policy.calibration.path_accept if policy is not None else None  # None: EAGLE-2's exp(score)
    if isinstance(dcache, DeviceDrafter):  # every level in one captured call, read once
        ids, logprobs, frontiers = dcache.draft(feats, pend_tokens)
        return rebuild(cands, ids, logprobs, frontiers, cfg, value, policy, draft_tokens)
    n, stable = len(pend_tokens), dcache.length
    pos = torch.arange(stable, stable + n, device=dev)
    h = head(feats, target.embed(to_device(pend_tokens, dev)), pos, dcache, causal(n, dev), engine.attn_impl)
    S = dcache.length  # stable draft length == committed target length
    out_of: dict[int, torch.Tensor] = {-1: h[-1]}
    level = _add_level(engine, cands, [-1], h[-1:], cfg.topk, value)
    slot_of: dict[int, int] = {}
    seen: dict[int, list[int]] = {}  # expanded node -> the draft-cache slots of its expanded ancestors and itself
    levels = 1
    for step in range(1, cfg.steps):
        frontier = select_frontier(cands, level, cfg.topk)
        if _stops(policy, cands, frontier, levels, draft_tokens, cfg):
            return levels, _stopped(levels)
        for node in frontier:  # a frontier node's parent was expanded at the step before (or is the root)
            slot_of[node] = len(slot_of)
            seen[node] = seen.get(cands.parents[node], []) + [slot_of[node]]
            cands.expanded[node] = True
        # the frontier's rows of the ancestor-or-self mask over the expanded nodes' draft-cache slots, kept
        # incrementally (rebuilding tree attention's ancestor_mask each step costs twice the time)
        mask = torch.zeros(len(frontier), len(slot_of), dtype=torch.bool)
        mask[[r for r, node in enumerate(frontier) for _ in seen[node]],
             [s for node in frontier for s in seen[node]]] = True
        x_feat = torch.stack([out_of[cands.parents[node]] for node in frontier])
        x_tok = to_device([cands.tokens[node] for node in frontier], dev)
        x_pos = torch.full((len(frontier),), S + step - 1, device=dev)
        hs = head(x_feat, target.embed(x_tok), x_pos, dcache, to_device(mask, dev), engine.attn_impl)
        for r, node in enumerate(frontier):
            out_of[node] = hs[r]
        level = _add_level(engine, cands, frontier, hs, cfg.topk, value)
        levels += 1
    return levels, _drafted(levels, policy)


def verified(size: int, candidates: int, rate: float) -> str:
    """A cost-aware tree's choice of `size` nodes of `candidates`, at `rate` expected tokens per plain step."""
    return (ROOT_ALONE if size == 0 else f"{size} of {candidates} candidates verified: there the expected tokens per "
            f"plain step peak ({rate:.2f}).")


def _stops(policy: TreePolicy | None, cands: Candidates, frontier: list[int], levels: int, draft_tokens: int,
           cfg: TreeConfig) -> bool:
    """Whether a cost-aware tree stops before expanding `frontier` (another level not expected to pay)."""
    if policy is None:
        return False
    values = sorted(cands.values, reverse=True)
    return not policy.another_level(values, [cands.values[i] for i in frontier], levels, draft_tokens - 1, cfg.topk,
                                    cfg.steps - levels)


def _stopped(levels: int, after: str = "") -> str:
    return (f"Drafting stopped after {levels} level{'s' if levels > 1 else ''}: another was not expected to pay for "
            f"itself{after}.")


def _drafted(levels: int, policy: TreePolicy | None) -> str:
    return "" if policy is None else f"All {levels} level{'s' if levels > 1 else ''} drafted."


def _add_level(engine, cands: Candidates, parents: list[int], hs: torch.Tensor, k: int, value) -> list[int]:
    """Children of each parent: the draft's top-k tokens by log-probability, mapped to target ids on the
    device and read in one transfer (the host decides the next level). Returns the new node ids."""
    logp = torch.log_softmax(engine.head.logits(hs, engine.target.unembed), dim=-1)
    values, ids = torch.topk(logp, k, dim=-1)
    mapped, lps = to_host(engine.head.to_target_ids(ids), values)
    new = []
    for parent, toks, lp in zip(parents, mapped, lps):
        new.extend(cands.add_children(parent, toks, lp, value))
    return new


def rebuild(cands: Candidates, ids: list[int], logprobs: list[float], frontiers: list[int], cfg: TreeConfig,
            value, policy: TreePolicy | None, draft_tokens: int, kept: int | None = None) -> tuple[int, str]:
    """The host's `Candidates` from one device drafting: the root's children, then each expansion as the
    device made it, as `_head_levels` adds them (same ids, scores, values). A cost-aware policy stops where
    the host path would (its rule reads only the levels before), or after the `kept` levels where the device
    applied that rule (`device_policy.levels`). Returns the levels kept and the decision."""
    k = cfg.topk
    level = cands.add_children(-1, ids[:k], logprobs[:k], value)
    levels, at = 1, k
    for s in range(1, cfg.steps):
        frontier = [level[r] for r in frontiers[(s - 1) * k:s * k]]
        if (levels == kept) if kept is not None else _stops(policy, cands, frontier, levels, draft_tokens, cfg):
            return levels, _stopped(levels, f" (the device drafted all {cfg.steps} in one call; the levels after "
                                            "were discarded)")
        level = []
        for r, node in enumerate(frontier):
            cands.expanded[node] = True
            level.extend(cands.add_children(node, ids[at + r * k:at + (r + 1) * k],
                                            logprobs[at + r * k:at + (r + 1) * k], value))
        at += k * k
        levels += 1
    return levels, _drafted(levels, policy)


def _merge_lookup(cands: Candidates, match: Match, calibration: Calibration | None) -> None:
    """Follow the continuation down from the root: where the head already proposed the token, that node
    becomes "both" (valued at the better of the two estimates); from the first token it did not propose, a
    chain of lookup nodes. A lookup node's value is its parent's times the calibrated acceptance of a lookup
    token after a match of this length; its local probability is that acceptance, its score the log of its
    value (it was never drafted)."""
    r = (calibration or IDENTITY).lookup_accept(match.ngram)
    parent, parent_value = -1, 1.0
    for token in match.tokens:
        value = parent_value * r
        node = cands.child_with(parent, token)
        if node is None:
            (node,) = cands.add_children(parent, [token], [0.0], source="lookup")
            cands.scores[node] = _log(value)
            cands.logprobs[node] = _log(r)
            cands.values[node] = value
        else:
            cands.values[node] = max(cands.values[node], value)
            cands.sources[node] = "both"
        parent, parent_value = node, cands.values[node]


def lookup_worth(policy: TreePolicy, match: Match, draft_tokens: int) -> bool:
    """Whether a cycle without the head would verify any of `match`'s tokens: `grow`'s choice over its lookup
    chain alone, made before it (a continuation not worth verifying leaves the cycle a plain step)."""
    return policy.budget(_lookup_values(match, policy.calibration), 0, draft_tokens - 1).size > 0


def _lookup_values(match: Match, calibration: Calibration | None) -> list[float]:
    """The values of a lookup chain on its own (as `_merge_lookup` values it where the head proposed none of
    its tokens), root's child first."""
    r = (calibration or IDENTITY).lookup_accept(match.ngram)
    return [r ** (k + 1) for k in range(len(match.tokens))]


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -1e9
