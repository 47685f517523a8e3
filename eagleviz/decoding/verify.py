"""Accepting draft tokens: greedy matching and lossless multi-round speculative sampling over a tree.

Greedy (T = 0): walk down from the root; at each node accept the child whose token equals the target's
argmax there (siblings are distinct, so at most one matches). The bonus token is the argmax at the last
accepted node. The result equals target-only greedy decoding.

Sampling (T > 0), EAGLE's Algorithm 1 / SpecInfer with top-k drafts: the children of a node were chosen
deterministically by the draft (proposal probability 1). Let p be the target distribution at the node
(after temperature and top-p). Try the children in draft-score order: accept child x with probability
p(x); on rejection set p(x) = 0 and renormalise (the residual) before trying the next sibling. If every
child is rejected, the bonus token is drawn from the residual; if a leaf is accepted, from the target's
distribution at that leaf. Trying x1, x2, ... this way draws exactly from p: P(x2) = (1 - p(x1)) *
p(x2) / (1 - p(x1)) = p(x2), and so on, so the committed tokens follow the target distribution. (Should
rounding reject a token holding all the remaining mass, the residual is empty and the bonus is drawn from
the target's distribution at the node instead.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagleviz.trace import NodeCheck
from eagleviz.decoding.tree import VerifyTree
from eagleviz.models.host import to_device, to_host
from kernels.sample_ops import SampleOps

RESIDUAL_TOP = 5


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(..., V) logits -> the distribution decoding samples from (fp32): softmax(logits / T), then nucleus
    truncation to the smallest set of tokens whose probability reaches top_p, renormalised.
    Shared by speculative and plain decoding so both sample the same target distribution."""
    logits = logits.float()
    probs = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)  # x / 1 is x, bitwise
    if top_p >= 1.0:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    sorted_p = torch.where(before < top_p, sorted_p, torch.zeros_like(sorted_p))
    trimmed = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return trimmed / trimmed.sum(dim=-1, keepdim=True)


def at_temperature(logits: torch.Tensor, temperature: float, probs: torch.Tensor | None, top_p: float) -> torch.Tensor:
    """The distribution at the temperature before nucleus truncation (what a trace shows as the target's
    probability): `probs` itself (`sampling_probs`' result) where nothing was truncated, else softmax(logits / T)."""
    if probs is not None and top_p >= 1.0:
        return probs
    return torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)


@dataclass(frozen=True)
class FedDraw:
    """A sampled plain step's read-out left on the device, for a step that feeds its token back
    (`eagleviz.models.static.StaticSteps.fed_back`): the engine's `_read_out` in tensors, with the uniform the host
    wrote before the launch. Returns the token (1,) int64 to feed back and what the host reads of the step, (3,)
    float64: the token, the target's argmax and its probability at the temperature (untruncated). The same
    operations on the same device as the read-out a step at a time, so the same token for the same uniform."""

    temperature: float
    top_p: float

    @property
    def key(self) -> tuple[float, float]:  # what a capture freezes
        return self.temperature, self.top_p

    def __call__(self, logits: torch.Tensor, argmax: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = sampling_probs(logits, self.temperature, self.top_p)
        token = past_end(draw_index(probs, u), probs)
        prob = at_temperature(logits, self.temperature, probs, self.top_p).gather(0, argmax)
        return token, torch.cat([token.double(), argmax.double(), prob.double()])


def uniform(generator: torch.Generator, device: torch.device | str, out: torch.Tensor | None = None) -> torch.Tensor:
    """One draw's random number: (1,) float64 in [0, 1) on `device`, left there (in `out` where given: the same
    number, written in place)."""
    return torch.rand(1, generator=generator, dtype=torch.float64, device=device, out=out)


def cycle_uniforms(generator: torch.Generator, n: int, device: torch.device | str) -> torch.Tensor:
    """A drafted cycle's random numbers at T > 0, drawn at once before it is verified: (n,) float64 for a cycle of
    at most n verified tokens (its budget). Slot s > 0's check compares uniforms[s]; the bonus draws with
    uniforms[0]. One block a cycle, of the budget's size whatever tree was kept, so the generator moves the same
    whether the walk is decided on the host or on the device (`device_cycle`), and a walk on the device needs no
    number from the host."""
    return torch.rand(n, generator=generator, dtype=torch.float64, device=device)


def draw(weights: torch.Tensor, u: torch.Tensor, ops: SampleOps | None = None) -> int:
    """One index of a (V,) tensor of non-negative weights, drawn with probability weights[i] / weights.sum() by
    the uniform u ((1,) float64 on the weights' device: `uniform`).

    Inverse CDF in fp64 (a cumulative sum and a binary search): `torch.multinomial` does the same job 20 times
    slower on a CPU (0.9 ms for one draw over a 49k vocabulary: docs/performance.md entry 15). Zero weights
    are never drawn. `ops` (CPU weights) does it in one C call, bitwise the same index for the same draw."""
    if ops is not None and weights.is_cpu:
        return ops.draw(weights, float(u))
    (i,), = to_host(draw_index(weights, u))
    return drawn(i, weights)


def draw_and_top(weights: torch.Tensor, u: torch.Tensor, ops: SampleOps) -> tuple[int, int, float]:
    """`draw`'s index (the same random number, the same token), the first index of the largest weight and that
    weight, read in one C call while the weights are in cache: a resting cycle's trace shows the most likely
    token beside the drawn one. Equal weights: the lower index (fp32 probabilities can tie where their logits did
    not; the trace's choice, not the draw's)."""
    return ops.draw_and_top(weights, float(u))


def draw_index(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`draw` left on the device, unread: a (1,) index (the caller reads it with whatever else it reads, then
    passes it through `drawn`, or `past_end` keeps it on the device). The same uniform, so the same token."""
    cdf = torch.cumsum(weights, 0, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[-1], right=True)


def drawn(i: int, weights: torch.Tensor) -> int:
    """A `draw_index` read: where u rounded up to the total (i past the end), the last token with weight."""
    if i >= weights.numel():
        (i,), = to_host(torch.nonzero(weights)[-1])
    return i


def past_end(i: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`drawn` on the device, unread: (1,) the index, or the last token with weight where it is past the end."""
    v = weights.numel()
    last = (v - 1) - torch.flip(weights > 0, (0,)).int().argmax().reshape(1)
    return torch.where(i < v, i, last)


def top_tokens(probs: torch.Tensor, k: int, ops: SampleOps | None = None) -> tuple[list[int], list[float]]:
    """The k most likely tokens of a (V,) distribution, descending, and their probabilities (`ops`: one C
    pass for CPU rows, equal probabilities in index order; else torch.topk)."""
    if ops is not None and probs.is_cpu:
        return ops.top_k(probs, k)
    values, indices = torch.topk(probs, min(k, probs.numel()))
    return to_host(indices, values)  # one read of both


@dataclass
class VerifyResult:
    path: list[int]            # accepted slots, root first
    bonus_token: int
    bonus_source: str          # "target" or "residual"
    checks: list[NodeCheck]


TextFn = Callable[[int], str]


def greedy_verify(tree: VerifyTree, target_argmax: list[int], draft_probs: list[float],
                  target_probs: list[float], text: TextFn) -> VerifyResult:
    """target_argmax[s]: the target's argmax at slot s; draft_probs[s]: the draft's local probability of the
    token at slot s; target_probs[s]: the target's probability of target_argmax[s]."""
    kids = tree.children()
    path, checks = [0], []
    while True:
        cur = path[-1]
        want = target_argmax[cur]
        nxt = None
        for s in kids[cur]:
            ok = tree.tokens[s] == want
            p_tok = target_probs[cur] if ok else 0.0
            checks.append(NodeCheck(slot=s, depth=tree.depths[s], token=tree.tokens[s], text=text(tree.tokens[s]),
                                    p=p_tok, q=draft_probs[s], accept_prob=1.0 if ok else 0.0, uniform=None,
                                    accepted=ok, target_token=want, target_text=text(want)))
            if ok:
                nxt = s
                break
        if nxt is None:
            return VerifyResult(path=path, bonus_token=want, bonus_source="target", checks=checks)
        path.append(nxt)


def sample_verify(tree: VerifyTree, probs_at: Callable[[int], torch.Tensor], draft_probs: list[float],
                  target_argmax: list[int], uniforms: torch.Tensor, text: TextFn,
                  ops: SampleOps | None = None) -> VerifyResult:
    """probs_at(s): the target's sampling distribution (V,) at slot s (computed lazily: only the nodes on the
    walk need it). uniforms: the cycle's random numbers (`cycle_uniforms`, on the distributions' device), so a
    seed reproduces the run. Each node on the walk: its children's `rejections` computed at once, read in one copy
    with their uniforms and the draw from the residual all of them leave (on a GPU, one wait a node), then walked
    (`walk_node`); `ops` (CPU rows) finds the most likely tokens and draws in C (the same draws)."""
    kids = tree.children()
    path, checks = [0], []
    while True:
        cur = path[-1]
        target = probs_at(cur)
        if not kids[cur]:  # a leaf: the bonus from the target's distribution there
            return VerifyResult(path=path, bonus_token=draw(target, uniforms[:1], ops), bonus_source="target",
                                checks=checks)
        dev = target.device
        ahead = rejections(target, to_device([tree.tokens[s] for s in kids[cur]], dev), RESIDUAL_TOP + len(kids[cur]),
                           ops=ops)
        u = uniforms.index_select(0, to_device(kids[cur], dev))
        later = ops is not None and target.is_cpu  # (C draws when it is needed, from the same uniform)
        reads = to_host(ahead.p, u, ahead.empty, ahead.top, ahead.shown,
                        *(() if later else (draw_index(ahead.residual, uniforms[:1]),)))
        nxt, source = walk_node(tree, kids[cur], *reads[:5], draft_probs, target_argmax, text, checks)
        if nxt is not None:
            path.append(nxt)
            continue
        if source == "target":  # a rejection left no mass
            return VerifyResult(path=path, bonus_token=draw(target, uniforms[:1], ops), bonus_source="target",
                                checks=checks)
        bonus = draw(ahead.residual, uniforms[:1], ops) if later else drawn(reads[5][0], ahead.residual)
        return VerifyResult(path=path, bonus_token=bonus, bonus_source="residual", checks=checks)


@dataclass(frozen=True)
class Rejections:
    """A node's children tried in order as if every one were rejected, on the device and unread: each child's
    probability under the residual its elder siblings leave (p, (k,) float64), whether the residual it leaves holds
    no mass (empty, (k,) bool), the node's most likely tokens (top, (n,)) and their probabilities in the residual
    each child leaves (shown, (k, n) float64; the zeroed ones' are not meant), and the residual all the children
    leave (residual, (V,): the node's distribution with their tokens zeroed, unnormalised: the bonus's weights)."""

    p: torch.Tensor
    empty: torch.Tensor
    top: torch.Tensor
    shown: torch.Tensor
    residual: torch.Tensor


def rejections(target: torch.Tensor, xs: torch.Tensor, top_n: int, valid: torch.Tensor | None = None,
               ops: SampleOps | None = None) -> Rejections:
    """The `Rejections` of children xs (k,) tokens (distinct), tried in order, at a node whose distribution is
    target (V,), in closed form: with m the node's mass (float64) and c_j the mass of the children before child j,
    its probability under the residual they leave is p(x_j) / (m - c_j); the residual after it is empty when no
    token with mass is left (counted off the top-n list, n more than the children, so rounding cannot leave a
    positive sum over zeros). Rejecting a token and renormalising keeps the others' order, so one top-n list of the
    node serves every residual. valid (k,) bool: the children that exist (the rest, a fixed shape's padding, take no
    mass and zero nothing). Every node of a tree at once: target (T, V), xs and valid (T, k), each field with the
    leading T (the same operations row by row). A fixed number of operations whatever the number of children or
    nodes, no value read: a CUDA graph captures it.
    `ops` (one CPU row): the top-n in C (equal probabilities: the lower index first)."""
    raw = target.gather(-1, xs)
    if valid is not None:
        raw = torch.where(valid, raw, torch.zeros_like(raw))
    mass = torch.cumsum(target, -1, dtype=torch.float64)[..., -1:]  # (a running sum: the same bits for a row alone
    # or in a batch, where a reduction's order follows the shape)
    upto = torch.cumsum(raw.double(), -1)
    left = mass - torch.cat([torch.zeros_like(upto[..., :1]), upto[..., :-1]], -1)
    p = torch.where(left > 0, raw.double() / left, torch.zeros_like(left))  # (none left: past an empty residual)
    n = min(top_n, target.shape[-1])
    assert n == target.shape[-1] or n > xs.shape[-1], "the top-n list must outnumber the children"
    if ops is not None and target.is_cpu and target.dim() == 1:
        index, value = ops.top_k(target, n)
        top, top_p = torch.tensor(index), torch.tensor(value, dtype=torch.float64)
    else:
        top_v, top = torch.topk(target, n, dim=-1)
        top_p = top_v.double()
    held = (top_p > 0).sum(-1, keepdim=True)  # the tokens with mass: all of them where the list ends on a zero,
    # else more than the children can take
    empty = torch.cumsum((raw > 0).long(), -1) >= held
    shown = top_p.unsqueeze(-2) / (mass - upto).unsqueeze(-1)
    if valid is None:  # every child exists: its tokens zeroed in one pass (a host walk's, once a node)
        return Rejections(p, empty, top, shown, target.index_fill(-1, xs, 0.0))
    zeroed = torch.zeros_like(target).scatter_add(-1, xs, valid.to(target.dtype))  # padding zeroes nothing
    return Rejections(p, empty, top, shown, torch.where(zeroed > 0, torch.zeros_like(target), target))


def walk_node(tree: VerifyTree, kids: list[int], px: list[float], us: list[float], empty: list[bool],
              top: list[int], shown: list[list[float]], draft_probs: list[float], target_argmax: list[int],
              text: TextFn, checks: list[NodeCheck]) -> tuple[int | None, str]:
    """One node of the walk over its `rejections`, read (the first len(kids) children's), with the children's
    uniforms `us`: accept the first child whose uniform falls below its probability under the residual its elder
    siblings leave. Appends the checks; returns the accepted child's slot, or None and where the bonus comes from
    ("residual"; "target" where a rejection left no mass)."""
    cur = tree.parents[kids[0]]
    zeroed: set[int] = set()
    for j, s in enumerate(kids):
        x, ok = tree.tokens[s], us[j] < px[j]
        check = NodeCheck(slot=s, depth=tree.depths[s], token=x, text=text(x), p=px[j], q=draft_probs[s],
                          accept_prob=px[j], uniform=us[j], accepted=ok, target_token=target_argmax[cur],
                          target_text=text(target_argmax[cur]))
        checks.append(check)
        if ok:
            return s, ""
        zeroed.add(x)
        if empty[j]:  # no residual mass left: the bonus comes from the target's own distribution
            return None, "target"
        kept = [(r, i) for r, i in enumerate(top) if i not in zeroed][:RESIDUAL_TOP]
        check.residual_top = [(i, text(i), shown[j][r]) for r, i in kept if shown[j][r] > 0]  # (tokens without
        # mass, ties in any order, are no part of the residual)
    return None, "residual"
