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


def draw(weights: torch.Tensor, generator: torch.Generator, ops: SampleOps | None = None) -> int:
    """One index of a (V,) tensor of non-negative weights, drawn with probability weights[i] / weights.sum().

    Inverse CDF in fp64 (a cumulative sum and a binary search): `torch.multinomial` does the same job 20 times
    slower on a CPU (0.9 ms for one draw over a 49k vocabulary: docs/performance.md entry 15). Zero weights
    are never drawn. `ops` (CPU weights) does it in one C call, bitwise the same index for the same draw."""
    if ops is not None and weights.is_cpu:
        return ops.draw(weights, _uniform(generator, weights.device))
    (i,), = to_host(draw_index(weights, generator))
    return drawn(i, weights)


def draw_and_top(weights: torch.Tensor, generator: torch.Generator, ops: SampleOps) -> tuple[int, int, float]:
    """`draw`'s index (the same random number, the same token), the first index of the largest weight and that
    weight, read in one C call while the weights are in cache: a resting cycle's trace shows the most likely
    token beside the drawn one. Equal weights: the lower index (fp32 probabilities can tie where their logits did
    not; the trace's choice, not the draw's)."""
    return ops.draw_and_top(weights, _uniform(generator, weights.device))


def _uniform(generator: torch.Generator, device: torch.device) -> float:
    return float(torch.rand(1, generator=generator, dtype=torch.float64, device=device))


def draw_index(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`draw` left on the device, unread: a (1,) index (the caller reads it with whatever else it reads, then
    passes it through `drawn`). The same random number from the generator, so the same token."""
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=weights.device)
    cdf = torch.cumsum(weights, 0, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[-1], right=True)


def drawn(i: int, weights: torch.Tensor) -> int:
    """A `draw_index` read: where u rounded up to the total (i past the end), the last token with weight."""
    if i >= weights.numel():
        (i,), = to_host(torch.nonzero(weights)[-1])
    return i


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
                  target_argmax: list[int], generator: torch.Generator, text: TextFn,
                  ops: SampleOps | None = None) -> VerifyResult:
    """probs_at(s): the target's sampling distribution (V,) at slot s (computed lazily: only the nodes on the
    walk need it). Draws come from `generator`, so a seed reproduces the run; `ops` reads the rows in C (the
    same draws). Without `ops` each node's rejections are computed ahead (`_node_ahead`) and read in one copy,
    the same values and draws as the walk below."""
    kids = tree.children()
    path, checks = [0], []
    while True:
        cur = path[-1]
        if ops is None and kids[cur]:
            nxt, bonus = _node_ahead(tree, kids[cur], probs_at, draft_probs, target_argmax, generator, text, checks)
            if nxt is not None:
                path.append(nxt)
                continue
            return VerifyResult(path=path, bonus_token=bonus[0], bonus_source=bonus[1], checks=checks)
        p = probs_at(cur)
        if kids[cur]:
            p = p.clone()  # rejections zero tokens of this copy
        top_i: list[int] = []  # filled at the first rejection (an accepted first child never needs it)
        zeroed: set[int] = set()
        rejected = False
        nxt = None
        for s in kids[cur]:
            x = tree.tokens[s]
            px = float(p[x])
            u = float(torch.rand((), generator=generator, device=p.device))
            ok = u < px
            check = NodeCheck(slot=s, depth=tree.depths[s], token=x, text=text(x), p=px, q=draft_probs[s],
                              accept_prob=px, uniform=u, accepted=ok, target_token=target_argmax[cur],
                              target_text=text(target_argmax[cur]))
            checks.append(check)
            if ok:
                nxt = s
                break
            rejected = True
            p[x] = 0.0
            zeroed.add(x)
            total = float(p.sum())
            if total <= 0.0:  # rounding rejected a token that held all the mass: no residual is left to draw
                p, rejected = probs_at(cur), False  # from, so draw from the target's own distribution
                check.residual_top = []
                break
            p /= total
            if not top_i:  # the residual's most likely tokens are among these: rejecting a token zeroes it and
                # rescales the rest, which keeps their order
                top_i = top_tokens(p, RESIDUAL_TOP + len(kids[cur]), ops)[0]
            shown = [i for i in top_i if i not in zeroed][:RESIDUAL_TOP]
            check.residual_top = [(i, text(i), v) for i, v in zip(shown, p[shown].tolist())]
        if nxt is not None:
            path.append(nxt)
            continue
        bonus = draw(p, generator, ops)
        return VerifyResult(path=path, bonus_token=bonus, bonus_source="residual" if rejected else "target",
                            checks=checks)


def _node_ahead(tree: VerifyTree, kids: list[int], probs_at, draft_probs: list[float], target_argmax: list[int],
                generator: torch.Generator, text: TextFn, checks: list[NodeCheck]) -> tuple[int | None, tuple]:
    """One node of `sample_verify`'s walk with its rejections computed before they are known, as if every child
    were rejected: each child's probability under the residual its elder siblings leave, the residuals' sums and
    most likely tokens, a uniform per child and the draw from the residual all of them leave, all on the device
    and read in one copy (the walk itself read three values a rejected child, each a wait on a GPU). The host
    then walks them as `sample_verify` does, and sets the generator to where that walk would have left it, so
    the values, the draws and the generator's state are the walk's. Appends the checks; returns the accepted
    child's slot (or None) and, when none was accepted, the bonus token and its source."""
    cur = tree.parents[kids[0]]
    target = probs_at(cur)
    dev, k = target.device, len(kids)
    xs = [tree.tokens[s] for s in kids]
    index = to_device(xs, dev)
    p = target.clone()
    px, totals, shown, states, uniforms = [], [], [], [], []
    top = None
    for j in range(k):
        uniforms.append(torch.rand((), generator=generator, device=dev))
        states.append(generator.get_state())  # where the walk would be after this child's uniform
        x = index[j:j + 1]
        px.append(p.gather(0, x))
        p.index_fill_(0, x, 0.0)
        total = p.sum()
        totals.append(total.reshape(1))
        p = p / total
        if top is None:
            top = torch.topk(p, min(RESIDUAL_TOP + k, p.numel())).indices
        shown.append(p.gather(0, top))
    residual_draw = draw_index(p, generator)
    px_v, u_v, totals_v, top_v, shown_v, (drawn_i,) = to_host(torch.cat(px), torch.stack(uniforms), torch.cat(totals),
                                                             top, torch.stack(shown), residual_draw)
    zeroed: set[int] = set()
    for j, s in enumerate(kids):
        x, ok = xs[j], u_v[j] < px_v[j]
        check = NodeCheck(slot=s, depth=tree.depths[s], token=x, text=text(x), p=px_v[j], q=draft_probs[s],
                          accept_prob=px_v[j], uniform=u_v[j], accepted=ok, target_token=target_argmax[cur],
                          target_text=text(target_argmax[cur]))
        checks.append(check)
        if ok:
            generator.set_state(states[j])
            return s, ()
        zeroed.add(x)
        if totals_v[j] <= 0.0:  # no residual mass left: the bonus comes from the target's own distribution
            check.residual_top = []
            generator.set_state(states[j])
            return None, (draw(target, generator), "target")
        kept = [(r, i) for r, i in enumerate(top_v) if i not in zeroed][:RESIDUAL_TOP]
        check.residual_top = [(i, text(i), shown_v[j][r]) for r, i in kept]
    return None, (drawn(drawn_i, p), "residual")
