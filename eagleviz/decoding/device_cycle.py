"""A drafted cycle, of SGLang's fixed tree or the cost-aware one, greedy or sampled, decided on the device and read
once.

Over static steps the host path waits twice in a drafted cycle: for the drafting (every level's tokens and
scores, from which it chooses the verified nodes and builds their mask) and for the verdict (the target's
argmax at every slot, which it walks). Between the two the device is idle while Python rebuilds candidates,
reranks them and builds the mask. Here the choices the host made are made on the device, from the drafting's
own tensors, in the host's order and ties, so nothing is read until the cycle is over:

    select     every candidate's cumulative score (float64 sums of the float32 log-probabilities in the
               host's order), its parent and depth; the `draft_tokens - 1` best by score (a stable sort: ties
               to the lower id, which is `tree.priority`'s order, since a fixed tree's value exp(score) is
               monotone in the score and ids grow with depth); verification order (depth, then score, then
               id: `tree.rerank`'s); slot parents, positions and the ancestor mask, written straight into the
               verification step's inputs. A cost-aware tree's: the levels it keeps and the number of nodes
               that pays best, from the policy's numbers the host wrote (`device_policy`), padded to the
               `draft_tokens - 1` the step was captured for with slots nobody sees and no walk reaches (the
               root alone, where no node pays: then the root's row comes from that step, not a one-token one)
    verify     the target's step over the tree (the bucket's `StaticSteps.step_fn`, its inputs already written)
    accept     the greedy walk (`verify.greedy_verify`): from the root, the child whose token is the target's
               argmax at its parent, level by level; the bonus is the argmax where the walk stops. Sampled, the
               walk of `verify.sample_verify` (`accept_sampled`): every node's children tried in order against the
               residuals their elder siblings leave, all nodes at once (`verify.rejections`, the host's arithmetic
               row by row), then the walk along those verdicts, with the cycle's uniforms
               (`verify.cycle_uniforms`: drawn from the run's generator at the launch into the drafter's buffer, as
               many as the host path draws), the bonus drawn on the device; the record also holds the rejections of
               each node walked and the root's distribution, from which the host replays the checks
               (`replay_sampled`, `verify.walk_node`: the host path's own walk). The same seed, the same tokens on
               either path; its capture freezes the temperature and the nucleus (keyed by them)
    commit     the accepted path's keys and values moved to [S, S + n) (`KVCache.commit_moves`: every slot of
               the longest path moved, the unaccepted ones onto themselves), the path's features gathered for
               the head's next encoding

all four in one function after the drafting's (`DeviceCycle.verification`), which packs the cycle's record
(path, accepted count, argmax and its probability per slot, the kept nodes, the drafting) for one copy. Every
operation has one shape per tree shape and reads no device value, so a CUDA graph captures it: a drafted cycle
is two replays and one read. From the record the host rebuilds the candidates and the tree for the pictures,
replays the walk (whose checks the trace shows) and checks it against the device's: the trace is the host
path's, field by field (tests/test_device_cycle.py). On a GPU the engine launches the next cycle right after
the read, from what the record says the cycle committed, before the host rebuilds anything
(`Engine._launch_ahead`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.device_draft import DeviceDrafter, DraftOut
from eagleviz.decoding.device_policy import PAD_PARENT, PolicyBlock, choose, values
from eagleviz.decoding.drafting import Draft, rebuild, verified
from eagleviz.decoding.policy import TreePolicy
from eagleviz.decoding.tree import Candidates, VerifyTree
from eagleviz.decoding.verify import (RESIDUAL_TOP, VerifyResult, cycle_uniforms, draw_index, greedy_verify,
                                      past_end, rejections, sampling_probs, walk_node)
from eagleviz.models.host import PhaseClock, to_host
from eagleviz.models.static import BUCKETS, StaticSteps, bucket
from eagleviz.trace import ROOT_TOP


class DeviceVerdictMismatch(RuntimeError):
    """The device's walk and the host's replay of it disagree: a bug, never a property of the input. `evidence`:
    what a CPU needs to replay the device's part (`DeviceCycle.evidence`), where the cycle was read."""

    def __init__(self, message: str, evidence: dict | None = None):
        super().__init__(message)
        self.evidence = evidence or {}


def fits(draft_tokens: int) -> bool:
    """Whether a cycle of `draft_tokens` verified tokens (root included) runs on the device: a tree that fits one
    captured step (the host path takes larger ones) and holds more than the root."""
    return 1 < draft_tokens <= BUCKETS[-1]


@dataclass(frozen=True)
class Shape:
    """The fixed facts of a drafting of `steps` levels of `k` children: candidate depths (level by level, node
    by node, as `drafting.rebuild` numbers them) and where each level starts."""

    k: int
    steps: int
    depth: torch.Tensor  # (C,) int64

    @classmethod
    def of(cls, k: int, steps: int, device: torch.device) -> Shape:
        sizes = [k] + [k * k] * (steps - 1)
        depth = torch.cat([torch.full((n,), d + 1, dtype=torch.int64) for d, n in enumerate(sizes)])
        return cls(k, steps, depth.to(device))

    def start(self, level: int) -> int:
        """The first candidate id of `level` (0: the root's children)."""
        return 0 if level == 0 else self.k + (level - 1) * self.k * self.k


@dataclass
class Selection:
    """The verified nodes on the device: kept (m,) candidate ids in verification order, tokens (m,) their
    target ids, depths (m,), parents (1 + m,) slot parents (the root's -1)."""

    kept: torch.Tensor
    tokens: torch.Tensor
    depths: torch.Tensor
    parents: torch.Tensor


def scores_and_parents(out: DraftOut, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Every candidate's cumulative score (float64: its parent's score plus its own log-probability, the sum the
    host's `Candidates.add_children` makes) and parent id (-1: the root), from one drafting."""
    k = shape.k
    lp = out.logprobs.double()
    score = torch.empty_like(lp)
    parent = torch.empty(lp.shape, dtype=torch.int64, device=lp.device)
    score[:k] = lp[:k]
    parent[:k] = -1
    for s in range(1, shape.steps):
        ids = shape.start(s - 1) + out.frontiers[(s - 1) * k:s * k]  # the expanded nodes of the level before
        at = slice(shape.start(s), shape.start(s) + k * k)
        parent[at] = ids[:, None].expand(k, k).reshape(-1)
        score[at] = score[ids][:, None].expand(k, k).reshape(-1) + lp[at]
    return score, parent


def select(out: DraftOut, shape: Shape, m: int) -> Selection:
    """SGLang's fixed tree of m nodes below the root (`drafting.grow` with no policy): the m best candidates by
    score, closed under ancestors (a child's score never exceeds its parent's, and a parent's id is lower), in
    verification order, with their slot parents."""
    score, parent = scores_and_parents(out, shape)
    best = torch.sort(score, descending=True, stable=True).indices[:m]
    kept = best[torch.sort(shape.depth[best], stable=True).indices]  # by depth, then as ranked
    return _selection(out, shape, kept, parent)


def select_costed(out: DraftOut, shape: Shape, m: int, block: PolicyBlock) -> tuple[Selection, torch.Tensor]:
    """A cost-aware tree's nodes (`drafting.grow` with a policy, no lookup): of at most m, the number and the
    levels the policy in `block` chooses (`device_policy.choose`), in verification order, then padding up to m
    (slots whose parent is PAD_PARENT: in the step, seen by nobody; in the walk, never reached). Returns the
    selection and the choice (3,) float64: the size, the levels kept, the rate."""
    score, parent = scores_and_parents(out, shape)
    kept_levels, size, rate, kept = choose(values(score, block), score, shape.depth, out.frontiers, shape.k,
                                           shape.steps, m, block)
    sel = _selection(out, shape, kept, parent, size)
    return sel, torch.cat([size.double(), kept_levels.double(), rate])


def _selection(out: DraftOut, shape: Shape, kept: torch.Tensor, parent: torch.Tensor,
               size: torch.Tensor | None = None) -> Selection:
    """The kept candidates (m,) in verification order with their target ids, depths and slot parents; given
    `size` (1,), the slots past it are padding (parent PAD_PARENT)."""
    m = kept.numel()
    slot = torch.zeros_like(parent)
    slot[kept] = torch.arange(1, m + 1, device=kept.device)
    up = parent[kept]
    slots = torch.where(up < 0, torch.zeros_like(up), slot[up.clamp(min=0)])
    if size is not None:
        slots = torch.where(torch.arange(m, device=kept.device) < size, slots, PAD_PARENT)
    parents = torch.cat([torch.full((1,), -1, dtype=torch.int64, device=kept.device), slots])
    return Selection(kept, out.ids[kept], shape.depth[kept], parents)


def ancestor_rows(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """(T, T) bool: each slot sees its ancestors and itself (`VerifyTree.mask`), from slot parents (T,) (the root's
    -1) of a tree at most `depth` deep: each pass adds one more generation."""
    t = parents.numel()
    eye = torch.eye(t, dtype=torch.bool, device=parents.device)
    up = parents.clamp(min=0)
    rows = eye
    for _ in range(depth):
        rows = eye | rows[up]
    return rows


def write_tree(sel: Selection, inputs: tuple[torch.Tensor, ...], depth: int) -> None:
    """Fill a verification step's staged inputs (prefix (1,) = S, ids, positions, mask of its bucket; the root and
    padding already written) with the selected nodes: their tokens, positions S + depth and ancestor mask."""
    prefix, ids, positions, mask = inputs
    t = sel.parents.numel()
    ids[1:t] = sel.tokens
    positions[1:t] = prefix + sel.depths
    mask[:t, :t] = ancestor_rows(sel.parents, depth)


def accept_greedy(argmax: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                  depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy walk over a tree of T slots (tokens (T,), slot parents (T,), the target's argmax (T,) at each):
    returns path (depth + 1,) the accepted slots root first, the unaccepted places holding their own index (a
    move onto itself), and n (1,) how many slots were accepted, root included. Siblings hold distinct tokens, so
    at most one child matches; where none does the walk stays, and stays at every later level too."""
    t = tokens.numel()
    index = torch.arange(t, device=tokens.device)
    path = torch.arange(depth + 1, device=tokens.device)
    cur = torch.zeros(1, dtype=torch.int64, device=tokens.device)
    n = torch.ones(1, dtype=torch.int64, device=tokens.device)
    for level in range(1, depth + 1):
        hit = (parents == cur) & (tokens == argmax.index_select(0, cur))  # (indexing by a tensor would read it)
        child = torch.where(hit, index, t).amin(dim=0, keepdim=True)
        found = child < t
        cur = torch.where(found, child, cur)
        path[level:level + 1] = torch.where(found, child, level)
        n += found.long()
    return path, n


def children_table(parents: torch.Tensor, k: int) -> torch.Tensor:
    """(T, k): each slot's children (slots whose parent it is) in slot order, T where it has fewer than k
    (`VerifyTree.children` on the device; padding's parent PAD_PARENT is nobody's slot)."""
    t = parents.numel()
    index = torch.arange(t, device=parents.device)
    own = parents[None, :] == index[:, None]  # row s: s's children
    table = torch.where(own, index[None, :], t).sort(dim=1).values[:, :k]
    if t < k:  # (a tree of fewer slots than a node's children: the rest are nobody)
        table = torch.cat([table, torch.full((t, k - t), t, dtype=table.dtype, device=table.device)], dim=1)
    return table


@dataclass(frozen=True)
class Sampling:
    """A sampled cycle's fixed facts, as its capture freezes them: the temperature, the nucleus and the vocabulary
    (which sets the sizes of the record's lists: `shown(k)` tokens of each node's residual, `root_n` of the root's
    distribution)."""

    temperature: float
    top_p: float
    vocab: int

    def shown(self, k: int) -> int:
        """How many of a node's residual's most likely tokens its `rejections` keep: enough that RESIDUAL_TOP of
        them survive its k children's zeroing."""
        return min(RESIDUAL_TOP + k, self.vocab)

    @property
    def root_n(self) -> int:
        return min(ROOT_TOP, self.vocab)


def accept_sampled(logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, uniforms: torch.Tensor,
                   depth: int, k: int, s: Sampling) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled walk (`verify.sample_verify`) over a tree of T slots on the device: logits (T, V), tokens and
    slot parents (T,), the cycle's uniforms (>= T,) float64 (slot s's check compares uniforms[s], the bonus draws
    with uniforms[0]). Every node's `rejections` at once (its children's probabilities under their elder siblings'
    residuals, from the distributions the host takes: `Engine._accept`'s) and so every node's verdict: its first
    child whose uniform falls below its probability, else the stop (the residual every child left; the node's own
    distribution at a leaf or where a rejection left no mass). The walk then follows the verdicts, a few operations
    a level, and draws the bonus where it stops. Returns path (depth + 1,) and n (1,) as `accept_greedy`'s, the
    target's probability at its argmax per slot (T,) (at the temperature, untruncated: the trace's), and the
    record's sampled part (float64, `parse_sampled`'s layout): the rejections of each node the walk stood on, the
    bonus, whether it came from a residual, the root's most likely tokens and their probabilities. Fixed shapes,
    no value read: a CUDA graph captures it."""
    t = tokens.numel()
    dev = tokens.device
    probs = torch.softmax(logits if s.temperature == 1.0 else logits / s.temperature, dim=-1)
    rows = probs if s.top_p >= 1.0 else sampling_probs(logits, s.temperature, s.top_p)
    kids = children_table(parents, k)
    valid = kids < t
    slots = kids.clamp(max=t - 1)
    nums = rejections(rows, tokens[slots], s.shown(k), valid)
    ok = valid & (uniforms.index_select(0, slots.reshape(-1)).reshape(t, k) < nums.p)
    empty = valid & ~ok & nums.empty
    first = torch.where(ok | empty, torch.arange(k, device=dev), k).amin(dim=-1, keepdim=True)  # (T, 1)
    at = first.clamp(max=k - 1)
    took = ((first < k) & ok.gather(-1, at))[:, 0]  # each node's verdict: a child accepted ...
    residual = (~((first < k) & empty.gather(-1, at)))[:, 0] & valid.any(-1)  # ... or the bonus from its residual
    nxt = kids.gather(-1, at)[:, 0]
    path = torch.arange(depth + 1, device=dev)
    cur = torch.zeros(1, dtype=torch.int64, device=dev)
    n = torch.ones(1, dtype=torch.int64, device=dev)
    done = torch.zeros(1, dtype=torch.bool, device=dev)
    stood = []
    for level in range(1, depth + 1):
        stood.append(cur)
        here = took.index_select(0, cur)
        move = ~done & here
        cur = torch.where(move, nxt.index_select(0, cur), cur)
        path[level:level + 1] = torch.where(move, cur, level)
        n += move.long()
        done = done | ~here
    w = torch.where(residual.index_select(0, cur), nums.residual.index_select(0, cur)[0],
                    rows.index_select(0, cur)[0])  # where the walk stopped (a leaf at the last level: its own)
    bonus = past_end(draw_index(w, uniforms[:1]), w)
    walked = torch.cat(stood)
    top_v, top_i = torch.topk(rows[0], s.root_n)
    parts = [nums.p.index_select(0, walked), nums.empty.index_select(0, walked), nums.top.index_select(0, walked),
             nums.shown.index_select(0, walked), bonus, residual.index_select(0, cur), top_i, top_v]
    argmax = logits.argmax(dim=-1)
    tprobs = probs.gather(-1, argmax[:, None])[:, 0]
    return path, n, tprobs, torch.cat([p.reshape(-1).to(torch.float64) for p in parts])


@dataclass(frozen=True)
class SampledReading:
    """A sampled cycle's record past the greedy fields: the uniforms, each level's rejections (p, empty, top, shown:
    `verify.Rejections` read at the node the walk stood on), the bonus and whether it came from a residual, the
    root's most likely tokens and their probabilities."""

    uniforms: list[float]
    levels: list[tuple[list[float], list[bool], list[int], list[list[float]]]]
    bonus: int
    residual: bool
    root_top: list[tuple[int, float]]


def parse_sampled(flat: list[float], t: int, depth: int, k: int, s: Sampling) -> SampledReading:
    """`accept_sampled`'s part of a record (after the cycle's uniforms, t of them) read back: field by field, each
    for the `depth` nodes the walk stood on."""
    n, at = s.shown(k), 0

    def take(size: int) -> list[float]:
        nonlocal at
        at += size
        return flat[at - size:at]

    uniforms = take(t)
    px, empty, top, shown = take(depth * k), take(depth * k), take(depth * n), take(depth * k * n)
    levels = [(px[d * k:(d + 1) * k], [e != 0.0 for e in empty[d * k:(d + 1) * k]],
               [int(i) for i in top[d * n:(d + 1) * n]], [shown[(d * k + j) * n:(d * k + j + 1) * n] for j in range(k)])
              for d in range(depth)]
    (bonus,), (residual,) = take(1), take(1)
    index, value = take(s.root_n), take(s.root_n)
    return SampledReading(uniforms, levels, int(bonus), residual != 0.0, list(zip((int(i) for i in index), value)))


def replay_sampled(tree: VerifyTree, reading: SampledReading, draft_probs: list[float], argmax: list[int],
                   text) -> VerifyResult:
    """The host's walk over a sampled cycle's record: each node's checks from the rejections the device computed
    there (`verify.walk_node`, as the host path walks its own), the bonus the device drew."""
    kids = tree.children()
    path, checks = [0], []
    source = "target"
    for level in range(len(reading.levels) + 1):
        cur = path[-1]
        if not kids[cur]:
            break
        px, empty, top, shown = reading.levels[level]
        us = [reading.uniforms[c] for c in kids[cur]]
        nxt, source = walk_node(tree, kids[cur], px, us, empty, top, shown, draft_probs, argmax, text, checks)
        if nxt is None:
            break
        path.append(nxt)
        source = "target"
    return VerifyResult(path=path, bonus_token=reading.bonus, bonus_source=source, checks=checks)


@dataclass
class Verdict:
    """What a device cycle leaves for the engine's books and its trace."""

    draft: Draft
    result: VerifyResult
    argmax: list[int]
    target_probs: list[float]
    moves: list[tuple[int, int]]
    features: torch.Tensor | None  # the accepted path's features rows (the head's next input)
    root_top: list[tuple[int, str, float]]  # a sampled cycle's: the target's most likely tokens at the root


class DeviceCycle:
    """One run's drafted cycles over static steps: the drafting (the head's graph), then the selection, the
    verification, the walk and the commit as one more (`verification`), and one read of the cycle's record.
    `costed`: a cost-aware tree's (its choices from the policy the drafter's `PolicyBlock` holds, written at each
    launch), else SGLang's fixed tree. `sampling` at T > 0: the sampled walk (`accept_sampled`), its uniforms drawn
    from the run's generator at each launch into the drafter's `uniforms`."""

    def __init__(self, steps: StaticSteps, drafter: DeviceDrafter, tree: TreeConfig, costed: bool = False,
                 sampling: SamplingConfig | None = None):
        self.steps, self.drafter, self.tree, self.costed = steps, drafter, tree, costed
        self.shape = Shape.of(tree.topk, tree.steps, steps.target.device)
        self.sampled = (None if sampling is None or sampling.greedy else
                        Sampling(sampling.temperature, sampling.top_p, steps.target.vocab_size))

    def verification(self, out: DraftOut, m: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor | None]]:
        """The function of a cycle after its drafting `out`, verifying m nodes below the root: it selects them,
        writes the step's inputs (the root and the prefix S staged by the host), runs the target's step, walks
        and commits; it returns the cycle's record (float64, `parse`'s layout) and the accepted path's features
        rows (the longest path's; a copy, which lasts until the function runs again). Static buffers only, no
        device value read: a CUDA graph captures it."""
        shape, steps, depth = self.shape, self.steps, self.tree.steps
        t = m + 1
        views = steps.inputs.views(bucket(t))
        prefix, ids = views[0], views[1]
        step = steps.step_fn(bucket(t))

        block, sampled, uniforms = self.drafter.policy, self.sampled, self.drafter.uniforms[:t]
        fixed = torch.tensor([m, depth, 0.0], dtype=torch.float64, device=prefix.device)  # size, levels, no rate

        def verification() -> tuple[torch.Tensor, torch.Tensor | None]:
            sel, choice = select_costed(out, shape, m, block) if self.costed else (select(out, shape, m), fixed)
            write_tree(sel, views, depth)
            verified = step()
            logits, argmax = verified.logits[:t], verified.argmax[:t]
            if sampled is None:
                probs = torch.softmax(logits, dim=-1).gather(-1, argmax[:, None])[:, 0]
                path, n = accept_greedy(argmax, ids[:t], sel.parents, depth)
                tail = ()
            else:
                if logits.shape[-1] != sampled.vocab:
                    raise ValueError(f"logits over {logits.shape[-1]} tokens, a vocabulary of {sampled.vocab}")
                path, n, probs, walk = accept_sampled(logits, ids[:t], sel.parents, uniforms, depth, shape.k, sampled)
                tail = (uniforms, walk)
            steps.cache.commit_moves(prefix, path)
            rows = None if verified.features is None else verified.features.index_select(0, path.clamp(max=m))
            parts = (path, n, argmax, probs, sel.kept, out.ids, out.logprobs, out.frontiers, choice) + tail
            return torch.cat([p.reshape(-1).to(torch.float64) for p in parts]), rows

        return verification

    def key(self, pending: int, m: int) -> tuple:
        """Under what the target's state keeps the captured verification after a drafting of `pending` rows: the
        drafter whose outputs it reads (by serial: a freed drafter's `id` can be a later one's, of another tree
        shape, whose drafting a stale capture would read with the old shape), the tree's shape, the bucket."""
        return self.drafter.serial, self.tree.topk, self.tree.steps, bucket(pending), m, self.costed, self.sampled

    def prepare(self, outputs: dict[int, DraftOut]) -> None:
        """Every verification of this tree shape captured now, one per pending bucket (`outputs`: each bucket's
        drafting, `DeviceDrafter.prepare`), over the scratch slots past the state's capacity."""
        steps, m = self.steps, min(self.tree.draft_tokens - 1, self.shape.depth.numel())
        if not (fits(m + 1) and steps.graphs.captured and self.drafter.graphs.captured):
            return
        for b, out in outputs.items():
            steps.inputs.write(steps.capacity, [0] * (m + 1), [steps.capacity] * (m + 1), None, bucket(m + 1))
            steps.cycle_replay(self.key(b, m), lambda: self.verification(out, m))

    def launch(self, feats: torch.Tensor, pend_tokens: list[int], root: int, S: int, draft_tokens: int,
               clock: PhaseClock, policy: TreePolicy | None = None,
               generator: torch.Generator | None = None) -> Launched:
        """Queue a drafted cycle after S committed tokens whose root is `root`, at most `draft_tokens` verified (root
        included): the drafting's replay, then the verification's (selection, step, walk and commit in it). Laps
        `clock` after each; nothing is read. On a GPU it returns before the device is done, so the host can write
        the last cycle's trace meanwhile (`read` waits). A cost-aware tree's `policy` is written to the device
        first, where it changed; a sampled cycle's uniforms are drawn from `generator` (`cycle_uniforms`: the
        budget's, as the host path draws them) into the drafter's buffer, on the device."""
        m = min(draft_tokens - 1, self.shape.depth.numel())
        steps = self.steps
        if S + m + 1 > steps.capacity:
            raise ValueError(f"a tree of {m + 1} tokens after {S} slots overflows the state's {steps.capacity}")
        if self.sampled is not None:
            if generator is None:
                raise ValueError("a sampled cycle is launched with its run's generator")
            us = cycle_uniforms(generator, draft_tokens, self.drafter.uniforms.device)
            self.drafter.uniforms[:m + 1].copy_(us[:m + 1])
        if self.costed:
            if policy is None:
                raise ValueError("a cost-aware tree's cycle is launched with its policy")
            self.drafter.policy.write(policy)
        n = len(pend_tokens)
        out = self.drafter.launch(feats, pend_tokens)
        clock.lap()
        steps.inputs.write(S, [root] + [0] * m, [S] * (m + 1), None, bucket(m + 1))
        replay = (steps.cycle_replay(self.key(n, m), lambda: self.verification(out, m))
                  if n <= BUCKETS[-1] and self.drafter.graphs.captured else self.verification(out, m))
        record, rows = replay()
        clock.lap()
        return Launched(root, S, draft_tokens, m, record, rows, clock, self.drafter.length, policy)

    def read(self, launched: Launched) -> Reading:
        """The launched cycle's one read: its record, parsed. Nothing else waits for the device."""
        (flat,) = to_host(launched.record)  # the one read
        fields, at = parse(flat, self.shape, launched.m)
        path, count, argmax, _, kept, ids = fields[:6]
        if not (1 <= count <= self.tree.steps + 1 and len(argmax) <= launched.m + 1
                and all(0 <= s < len(argmax) for s in path) and all(0 <= i < len(ids) for i in kept)):
            raise DeviceVerdictMismatch(f"the device's record holds no cycle: {count} slots accepted ({path}), "
                                        f"{len(argmax) - 1} verified of at most {launched.m}, kept {kept}",
                                        {"record": flat[:at], "m": launched.m, "fallbacks": [
                                            self.steps.fallback, self.drafter.fallback]})
        t, s = launched.m + 1, self.sampled
        return Reading(*fields, None if s is None else parse_sampled(flat[at:], t, self.tree.steps, self.shape.k, s))

    def evidence(self, launched: Launched, reading: Reading) -> dict:
        """A mismatch's evidence: the drafting and the choice as read, the choice a CPU's operations make from that
        drafting (`cpu_kept`, verification order; a cost-aware tree's from the block its policy writes, also
        returned, with whether the device's block holds the same numbers: read after the next cycle's launch, which
        rewrites it only where the run's policy changed). What went wrong computing it is said, not raised."""
        cpu = torch.device("cpu")
        found = {"m": launched.m, "kept": reading.kept, "levels": reading.levels, "rate": reading.rate,
                 "ids": reading.ids, "logprobs": reading.logprobs, "frontiers": reading.frontiers}
        try:
            out = DraftOut(torch.tensor(reading.ids), torch.tensor(reading.logprobs, dtype=torch.float32),
                           torch.tensor(reading.frontiers, dtype=torch.int64))
            shape = Shape.of(self.shape.k, self.shape.steps, cpu)
            if self.costed and launched.policy is not None:
                block = PolicyBlock(self.shape.steps, self.shape.k, cpu)
                block.write(launched.policy)
                (on_device,) = to_host(self.drafter.policy.tensor)
                sel, choice = select_costed(out, shape, launched.m, block)
                found |= {"block": block.tensor.tolist(), "block_on_device_equal": on_device == block.tensor.tolist(),
                          "cpu_choice": choice.tolist(), "cpu_kept": sel.kept[:int(choice[0])].tolist()}
            else:
                found["cpu_kept"] = select(out, shape, launched.m).kept.tolist()
        except Exception as exc:  # the evidence must not hide the mismatch
            found["evidence_error"] = f"{exc.__class__.__name__}: {exc}"
        return found

    def verdict(self, launched: Launched, reading: Reading, text) -> Verdict:
        """The host's books of a read cycle: the target cache's length is the host path's after it (the draft
        cache's still holds the expansion: the engine rewinds it); the candidates, the tree and the walk's checks
        rebuilt for the trace, the walk checked against the device's. On a GPU the next cycle is running by now:
        none of this is on its way."""
        S, path, policy = launched.S, reading.path, launched.policy
        moves = self.steps.cache.settle(S, [S + s for s in path])
        cands = Candidates()
        levels, decision = rebuild(cands, reading.ids, reading.logprobs, reading.frontiers, self.tree,
                                   None if policy is None else policy.calibration.path_accept, policy,
                                   launched.draft_tokens, reading.levels if self.costed else None)
        if self.costed:
            decision = f"{decision} {verified(len(reading.kept), len(cands), reading.rate)}"
        seen = {-1}
        for node in reading.kept:   # each kept node after its parent: a tree the host's rules could have kept
            if not 0 <= node < len(cands.parents) or cands.parents[node] not in seen:
                odd = sum(not math.isfinite(x) for x in reading.logprobs)
                evidence = self.evidence(launched, reading)
                raise DeviceVerdictMismatch(f"the device kept nodes {reading.kept}, not a tree in verification "
                                            f"order over its drafting (parents {cands.parents}; {reading.levels} "
                                            f"levels kept, {odd} log-probabilities not finite); a CPU's choice from "
                                            f"the same drafting: {evidence.get('cpu_kept')}", evidence)
            seen.add(node)
        tree = VerifyTree.build(cands, reading.kept, launched.root)
        qs = [1.0] + [math.exp(cands.logprobs[i]) for i in reading.kept]
        sampled, root_top = reading.sampled, []
        if sampled is None:
            result = greedy_verify(tree, reading.argmax, qs, reading.target_probs, text)
        else:
            result = replay_sampled(tree, sampled, qs, reading.argmax, text)
            if (result.bonus_source == "residual") != sampled.residual:
                where = "a residual" if sampled.residual else "the target"
                raise DeviceVerdictMismatch(f"the device drew its bonus from {where}, the host's walk from "
                                            f"{result.bonus_source}")
            if len(tree) > 1:  # (a tree of the root alone is a plain step's read-out: no distribution shown)
                root_top = [(i, text(i), v) for i, v in sampled.root_top if v > 0]
        committed = [tree.tokens[s] for s in result.path[1:]] + [result.bonus_token]
        if result.path != path or committed != reading.committed:
            raise DeviceVerdictMismatch(f"the device accepted slots {path} ({reading.committed}), the host's walk "
                                        f"{result.path} ({committed})")
        expected = 1.0 + sum(cands.values[i] for i in reading.kept)
        head_paid = (sampled is not None and self.costed and levels > 0 and policy is not None  # (what a sampled
                     and reading.rate > policy.budget([], 0, launched.draft_tokens - 1).rate)  # run's rest reads)
        draft = Draft(cands, tree, levels, expected, decision.strip(), head_paid=head_paid)
        return Verdict(draft, result, reading.argmax, reading.target_probs, moves, launched.features(reading.count),
                       root_top)


@dataclass
class Launched:
    """A drafted cycle queued on the device and not read yet: what it was launched with, its record and the
    accepted path's features rows (the verification's outputs, rewritten by its next replay), its clock."""

    root: int
    S: int
    draft_tokens: int
    m: int
    record: torch.Tensor
    rows: torch.Tensor | None
    clock: PhaseClock
    draft_length: int  # the draft cache's length after the drafting (its expansion included)
    policy: TreePolicy | None = None  # a cost-aware tree's, as written for this cycle

    def features(self, count: int) -> torch.Tensor | None:
        """The first `count` accepted rows' features (the head's next input), on the device."""
        return None if self.rows is None else self.rows[:count]


@dataclass(frozen=True)
class Reading:
    """A launched cycle's record as the host reads it (`parse`'s fields): the accepted slots (root first), their
    count, the target's argmax and its probability per verified slot, the kept candidates, the drafting, the
    levels kept and the expected rate (a cost-aware tree's choice; a fixed tree's: every level, 0); and what the
    cycle commits, which is all the next cycle's launch needs."""

    path: list[int]
    count: int
    argmax: list[int]
    target_probs: list[float]
    kept: list[int]
    ids: list[int]
    logprobs: list[float]
    frontiers: list[int]
    levels: int
    rate: float
    sampled: SampledReading | None = None  # a sampled cycle's walk

    @property
    def committed(self) -> list[int]:
        """The accepted drafts (slot s > 0 verifies candidate kept[s - 1]) and the bonus: the argmax where the walk
        stopped, or the device's draw."""
        bonus = self.argmax[self.path[-1]] if self.sampled is None else self.sampled.bonus
        return [self.ids[self.kept[s - 1]] for s in self.path[1:]] + [bonus]


def parse(flat: list[float], shape: Shape, m: int) -> tuple[tuple, int]:
    """A cycle's record read back: the accepted slots (root first), their count, the target's argmax and its
    probability at each verified slot, the kept candidate ids (the m slots' first `size`: the rest padded a
    cost-aware tree's step), the drafting (ids, log-probabilities, frontiers: `drafting.rebuild`'s input), the
    levels kept and the rate; and where a sampled cycle's part starts (`parse_sampled`)."""
    k, steps, c = shape.k, shape.steps, shape.depth.numel()
    sizes = (steps + 1, 1, m + 1, m + 1, m, c, c, (steps - 1) * k, 3)
    parts, at = [], 0
    for size in sizes:
        parts.append(flat[at:at + size])
        at += size
    path, (count,), argmax, tprobs, kept, ids, logprobs, frontiers, (size, levels, rate) = parts
    count, t = int(count), int(size) + 1
    return ([int(s) for s in path[:count]], count, [int(a) for a in argmax[:t]], tprobs[:t],
            [int(i) for i in kept[:t - 1]], [int(i) for i in ids], logprobs, [int(f) for f in frontiers], int(levels),
            rate), at
