"""The cost-aware tree's two choices made on the device: how many drafted levels to keep, how many nodes to verify.

The host makes them from the candidates it rebuilt (`eagleviz.decoding.policy`): after each drafted level,
whether another is expected to raise the cycle's rate (`TreePolicy.another_level`); then the number of nodes,
best first, that maximises expected tokens per plain step (`TreePolicy.budget`). Both read only values, prices
and the drafting, so the device makes the same choices from the drafting's tensors and one block of numbers the
host writes before a launch (`PolicyBlock`: the price list and the calibration, changed between cycles by the
run's clock and its own acceptance), and a drafted cycle of a cost-aware tree needs no read before its
verification (`eagleviz.decoding.device_cycle`):

    values   each candidate's value: the calibration's bin of its cumulative score (`torch.bucketize` as
             `bisect_right`), or EAGLE-2's exp(min(score, 0)) for the identity table
    levels   for each drafted level L < K, `another_level` over the candidates of depth <= L with the frontier
             the drafting expanded (its children predicted one and two levels on); the levels kept are those up
             to the first L that says no (all K where none does), as the host's `drafting.rebuild` stops
    rates    (1 + the running sum of the values, best first) / (draft(L) + verify(m + 1) + overhead) for
             every m, the first best kept where it beats a resting cycle's 1 / (draft(L) + rest), else m = 0:
             the budget of the kept levels, and each of `levels`' comparisons (one row each)
    select   `tree.priority`'s order (value, then score, then depth and id: stable sorts), the first m of it
             (closed under ancestors: a child's value never exceeds its parent's and ties go to the parent), in
             verification order, padded to the captured step's size with slots no walk reaches

Every shape is fixed by the tree (K levels of k children, at most `max_size` verified), sums run in float64 in
the host's order and ties break as the host's, so on a CPU the choices are the host's bit for bit
(tests/test_device_policy.py); on a GPU a sum's last bit may differ where a parallel scan adds in another order,
which can move a choice only between rates equal to ~1e-16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagleviz.decoding.calibration import EDGES
from eagleviz.models.static import BUCKETS

PAD_PARENT = -2  # a padding slot's parent: no walk reaches it (a walk's slots are >= 0)


@dataclass(frozen=True)
class Rows:
    """The fixed facts `levels` reads for a drafting of `steps` levels of k children, made once (a capture cannot
    copy a host list to the device): per level L = 1 .. steps - 1,

        within  (steps - 1, C) bool: candidate c has depth <= L (ids grow with depth: c < k + (L - 1) k^2)
        starts  ((steps - 1) k,): the first id of the level expansion L grew from, for each of its frontier rows
        levels  (3 (steps - 1),): the levels drafted in each of `levels`' rows (now L, then L + 1, L + 2)
        twice   (steps - 1,) bool: whether two more levels exist after L"""

    within: torch.Tensor
    starts: torch.Tensor
    levels: torch.Tensor
    twice: torch.Tensor

    @classmethod
    def of(cls, steps: int, k: int, device: torch.device) -> Rows:
        count = [k + (level - 1) * k * k for level in range(1, steps)]
        first = [0 if level == 1 else k + (level - 2) * k * k for level in range(1, steps)]
        ids = torch.arange(k + (steps - 1) * k * k)
        now = list(range(1, steps))
        return cls(within=(ids[None, :] < torch.tensor(count, dtype=torch.int64)[:, None]).to(device),
                   starts=torch.tensor([f for f in first for _ in range(k)], dtype=torch.int64).to(device),
                   levels=torch.tensor(now + [n + 1 for n in now] + [min(n + 2, steps) for n in now],
                                     dtype=torch.int64).to(device),
                   twice=torch.tensor([n <= steps - 2 for n in now], dtype=torch.bool).to(device))


class PolicyBlock:
    """A tree shape's (K levels of k children) cost-aware numbers on the device, float64, written from pinned host
    memory with one copy when the run's policy changes:

        draft    (K + 1,)  draft_cost(L) for L = 0 .. K
        verify   (B + 2,)  verify_cost(n) for n = 0 .. B + 1 (B: the largest captured step)
        overhead, rest, identity (1,) each: a drafted cycle's overhead, a resting cycle's price, 1.0 where the
                 calibration is EAGLE-2's identity
        edges    (E,), accept (E + 1,): the calibration's bins; child (k,): child_accept(0 .. k - 1)

    and the shape's `Rows` for `levels`.

    `written`: the policy (`policy.TreePolicy`, not imported: the price list's module leases the drafters whose
    block this is) the block holds; a run replaces its policy whenever its clock or its acceptance changes it, so
    identity says whether a write is due."""

    def __init__(self, steps: int, topk: int, device: torch.device, largest: int = BUCKETS[-1]):
        self.steps, self.topk, self.largest = steps, topk, largest
        sizes = (steps + 1, largest + 2, 1, 1, 1, len(EDGES), len(EDGES) + 1, topk)
        self.tensor = torch.zeros(sum(sizes), dtype=torch.float64, device=device)
        cuda = device.type == "cuda"
        self._staging = torch.zeros_like(self.tensor, device="cpu", pin_memory=True) if cuda else None
        self._sent = torch.cuda.Event() if cuda else None
        views, at = [], 0
        for size in sizes:
            views.append(self.tensor[at:at + size])
            at += size
        (self.draft, self.verify, self.overhead, self.rest, self.identity, self.edges, self.accept,
         self.child) = views
        self.rows = Rows.of(steps, topk, device)
        self.written = None

    @staticmethod
    def holds(policy) -> bool:
        """Whether a policy's calibration has the block's bins (every table `calibration.fit` makes does)."""
        return len(policy.calibration.edges) == len(EDGES)

    def write(self, policy) -> None:
        """The block set to `policy`'s numbers, unless it holds them already; the copy does not make the host wait
        for the device (it first waits until the previous write has left the staging)."""
        if policy is self.written:
            return
        if not self.holds(policy):
            raise ValueError(f"a calibration of {len(policy.calibration.edges)} bin edges, not {len(EDGES)}")
        c, cal, k = policy.costs, policy.calibration, self.topk
        verify = c.verify_costs(self.largest + 1)[:self.largest + 2]
        values = ([c.draft_cost(n) for n in range(self.steps + 1)] + list(verify)
                  + [c.overhead, c.rest_cost(), 1.0 if cal.identity else 0.0] + list(cal.edges) + list(cal.accept)
                  + [cal.child_accept(j) for j in range(k)])
        host = torch.tensor(values, dtype=torch.float64)
        if self._staging is None:
            self.tensor.copy_(host)
        else:
            self._sent.synchronize()
            self._staging.copy_(host)
            self.tensor.copy_(self._staging, non_blocking=True)
            self._sent.record()
        self.written = policy


def values(score: torch.Tensor, block: PolicyBlock) -> torch.Tensor:
    """Each candidate's value from its cumulative score (float64): `Calibration.path_accept` on the device."""
    table = block.accept.index_select(0, torch.bucketize(score, block.edges, right=True))
    return torch.where(block.identity > 0, torch.exp(score.clamp(max=0.0)), table)


def rates(best_first: torch.Tensor, levels: torch.Tensor, block: PolicyBlock,
          valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`TreePolicy.budget` for each row of values best first (R, M) (already cut to the most that may be
    verified), the row's tree drafted `levels` (R,) levels deep; `valid` (R,): how many of a row's values are
    values (the rest padding), None: all. Per row: the size (R,) int64 (0: the root alone, a resting cycle
    pays more) and the best rate (R,) in tokens per plain step,
        (1 + value_1 + ... + value_m) / (draft(levels) + verify(m + 1) + overhead)   against   1 / (draft + rest),
    the first of equal rates (the host keeps the smaller m), and the resting rate only where it is strictly lower."""
    r, m = best_first.shape
    draft = block.draft.index_select(0, levels)
    resting = 1.0 / (draft + block.rest)
    if m == 0:
        return torch.zeros(r, dtype=torch.int64, device=draft.device), resting
    rate = (1.0 + torch.cumsum(best_first, dim=1)) / (draft[:, None] + block.verify[2:m + 2] + block.overhead)
    if valid is not None:
        rate = torch.where(torch.arange(m, device=rate.device) < valid[:, None], rate, -torch.inf)
    at = torch.argmax(rate, dim=1, keepdim=True)  # torch's argmax takes the first of equal values
    best = rate.gather(1, at)[:, 0]
    pays = best > resting
    return torch.where(pays, at[:, 0] + 1, 0), torch.where(pays, best, resting)


def levels(value: torch.Tensor, frontiers: torch.Tensor, k: int, steps: int, max_size: int,
           block: PolicyBlock) -> torch.Tensor:
    """The drafted levels a cost-aware tree keeps (1,) int64: `drafting.rebuild`'s stopping rule over every
    level the device drafted, all levels at once. value (C,): the candidates' values, level by level; frontiers
    ((steps - 1) k,): each expansion's rows of the level before.

    For each level L < K, `another_level` compares the best rate of the candidates of depth <= L ("now") with
    the best rate after one more level (their frontier's children predicted by the child rates) and after two
    (the best k of those children expanded once more): three sets of values per level, one row each of a matrix
    padded with -inf (which sorts last and gives a rate of -inf, so `budget`'s argmax never takes it). One sort,
    one running sum and one argmax decide every level: the sorted values, hence the float64 sums, are the ones
    the host's per-level sorts give, bit for bit."""
    if steps < 2:
        return torch.ones(1, dtype=torch.int64, device=value.device)
    rows = block.rows
    fronts = value.index_select(0, rows.starts + frontiers).reshape(steps - 1, k)
    kids = (fronts[:, :, None] * block.child).reshape(steps - 1, k * k)
    best_kids = torch.sort(kids, dim=1, descending=True).values[:, :k]
    grand = (best_kids[:, :, None] * block.child).reshape(steps - 1, k * k)
    so_far = torch.where(rows.within, value, -torch.inf)  # (steps - 1, C)
    gone = torch.full_like(kids, -torch.inf)
    sets = torch.cat([torch.cat([so_far, gone, gone], dim=1), torch.cat([so_far, kids, gone], dim=1),
                      torch.cat([so_far, kids, grand], dim=1)])
    best = torch.sort(sets, dim=1, descending=True).values[:, :max_size]
    rate = rates(best, rows.levels, block)[1].reshape(3, steps - 1)
    go_on = (rate[1] > rate[0]) | ((rate[2] > rate[0]) & rows.twice)
    return 1 + torch.cumprod(go_on.long(), dim=0).sum(dim=0, keepdim=True)


def priority(value: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Candidate ids best first, as `tree.priority` orders them: by value, then score, then depth and id (ids grow
    with depth: a stable sort by score keeps them in that order)."""
    by_score = torch.sort(score, descending=True, stable=True).indices
    return by_score[torch.sort(value[by_score], descending=True, stable=True).indices]


def choose(value: torch.Tensor, score: torch.Tensor, depth: torch.Tensor, frontiers: torch.Tensor, k: int,
           steps: int, max_size: int, block: PolicyBlock):
    """The cost-aware tree's verified nodes: the levels kept (1,), the size m (1,) and its rate (1,), and the
    first `max_size` candidates of the kept levels in priority order, re-sorted so the m verified come first in
    verification order (by depth, then priority) and the rest after them (padding)."""
    kept = levels(value, frontiers, k, steps, max_size, block)
    inside = depth <= kept
    ranked = priority(torch.where(inside, value, -1.0), score)[:max_size]  # values are >= 0: the cut ones last
    count = inside.sum(dim=0, keepdim=True)
    size, rate = rates(value.index_select(0, ranked)[None], kept, block, valid=count)
    verified = torch.arange(ranked.numel(), device=value.device) < size
    order = torch.sort(torch.where(verified, depth.index_select(0, ranked), steps + 1), stable=True).indices
    return kept, size, rate, ranked.index_select(0, order)
