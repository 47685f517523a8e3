"""eagleviz/decoding/device_policy.py: a cost-aware tree's choices on the device (the levels kept, the number of
nodes verified, which and in what order) against the host's rules (`drafting.rebuild`'s stopping rule,
`TreePolicy.budget`, `tree.priority` and `tree.rerank`) on thousands of random draftings, price lists and
calibrations, with tied log-probabilities, tied bins and -inf scores: bit for bit, rates included."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eagleviz.config import TreeConfig
from eagleviz.decoding.calibration import EDGES, IDENTITY, Calibration
from eagleviz.decoding.costs import CostModel
from eagleviz.decoding.device_cycle import Shape, ancestor_rows, scores_and_parents, select, select_costed
from eagleviz.decoding.device_policy import PAD_PARENT, PolicyBlock, choose, rates, values
from eagleviz.decoding.drafting import rebuild
from eagleviz.decoding.policy import TreePolicy
from eagleviz.decoding.tree import Candidates, VerifyTree, priority, rerank
from test_device_cycle import random_draft

CPU = torch.device("cpu")


def random_policy(rng: random.Random) -> TreePolicy:
    """A price list from a GPU's nearly flat curve to a CPU's steep one, and a calibration: EAGLE-2's identity or a
    table of few distinct bins (ties), its child rates falling with rank."""
    sizes = sorted(rng.sample(range(2, 70), rng.randint(0, 4)))
    slope = rng.choice([0.005, 0.05, 0.3, 1.0])
    verify = ((1, 1.0),) + tuple((n, 1.0 + slope * (n - 1) * rng.uniform(0.5, 1.5)) for n in sizes)
    verify = tuple(sorted(dict(verify).items()))
    costs = CostModel(verify=verify, draft_level=rng.choice([0.0, 0.02, 0.1, 0.4]), overhead=rng.uniform(0, 0.3),
                      draft_fixed=rng.choice([0.0, 0.1, 0.5]), rest=rng.choice([None, 1.0, 1.2]))
    if rng.random() < 0.3:
        return TreePolicy(costs, IDENTITY)
    levels = [rng.choice([0.0, 0.05, 0.2, 0.5, 0.8, 1.0]) for _ in range(len(EDGES) + 1)]
    child = sorted((rng.choice([0.0, 0.1, 0.3, 0.6, 0.9]) for _ in range(4)), reverse=True)
    return TreePolicy(costs, Calibration(edges=EDGES, accept=tuple(sorted(levels)), child=tuple(child)))


def host_choice(out, k: int, steps: int, m: int, policy: TreePolicy):
    """What `drafting.grow` keeps of the same drafting with this policy and no lookup: the candidates, the levels,
    the budget and the kept nodes in verification order."""
    cands = Candidates()
    tree = TreeConfig(steps, k, m + 1)
    levels, _ = rebuild(cands, out.ids.tolist(), out.logprobs.tolist(), out.frontiers.tolist(), tree,
                        policy.calibration.path_accept, policy, m + 1)
    order = priority(cands)
    choice = policy.budget([cands.values[i] for i in order], levels, m)
    return cands, levels, choice, rerank(cands, choice.size, order)


@pytest.mark.parametrize("k,steps", [(1, 1), (1, 4), (2, 3), (3, 4), (4, 5), (8, 3)])
def test_the_device_chooses_the_hosts_levels_size_rate_and_nodes(k, steps):
    rng = random.Random(k * 10 + steps)
    shape = Shape.of(k, steps, CPU)
    block = PolicyBlock(steps, k, CPU)
    stops = sizes = 0
    for trial in range(250):
        out = random_draft(rng, k, steps)
        policy = random_policy(rng)
        block.write(policy)
        m = rng.randint(1, min(63, shape.depth.numel()))
        cands, levels, choice, kept = host_choice(out, k, steps, m, policy)
        score, _ = scores_and_parents(out, shape)
        value = values(score, block)
        got_levels, size, rate, ranked = choose(value, score, shape.depth, out.frontiers, k, steps, m, block)
        assert int(got_levels) == levels, trial
        assert int(size) == choice.size, trial
        assert float(rate) == choice.rate, trial
        assert ranked[:choice.size].tolist() == kept, trial
        assert value[:len(cands)].tolist() == cands.values
        sel, record = select_costed(out, shape, m, block)
        tree = VerifyTree.build(cands, kept, root_token=7)
        t = len(tree)
        assert sel.parents[:t].tolist() == tree.parents and sel.tokens[:t - 1].tolist() == tree.tokens[1:]
        assert (sel.parents[t:] == PAD_PARENT).all()
        assert torch.equal(ancestor_rows(sel.parents, steps)[:t, :t], tree.mask())
        assert record.tolist() == [choice.size, levels, choice.rate]
        stops += levels < steps
        sizes += 0 < choice.size < m
    if steps > 1:
        assert stops and sizes  # the rule stopped early and verified fewer than it could in some trials


def test_a_budget_is_the_hosts_on_any_values_with_padding():
    """Rows of values best first, each with its own levels and count of values (the rest padding), all budgeted at
    once: each row's size and rate are the host's for that row alone."""
    rng = random.Random(7)
    block = PolicyBlock(4, 2, CPU)
    for _ in range(150):
        policy = random_policy(rng)
        block.write(policy)
        width = rng.randint(0, 40)
        rows = [sorted((rng.choice([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]) for _ in range(width)), reverse=True)
                for _ in range(rng.randint(1, 5))]
        levels = [rng.randint(0, 4) for _ in rows]
        valid = [rng.randint(0, width) for _ in rows]
        padded = torch.tensor([vals[:n] + [0.7] * (width - n) for vals, n in zip(rows, valid)], dtype=torch.float64)
        size, rate = rates(padded.reshape(len(rows), width), torch.tensor(levels), block, valid=torch.tensor(valid))
        for i, (vals, level, n) in enumerate(zip(rows, levels, valid)):
            want = policy.budget(vals[:n], level, 64)
            assert (int(size[i]), float(rate[i])) == (want.size, want.rate)


def test_a_block_is_written_once_per_policy():
    block = PolicyBlock(3, 2, CPU)
    policy = random_policy(random.Random(1))
    block.write(policy)
    block.tensor.fill_(0.5)
    block.write(policy)  # the same policy: no write
    assert (block.tensor == 0.5).all()
    block.write(TreePolicy(policy.costs, policy.calibration))
    assert block.draft.tolist() == [policy.costs.draft_cost(n) for n in range(4)]
    assert block.child.tolist() == [policy.calibration.child_accept(j) for j in range(2)]
    odd = Calibration(edges=(-1.0, 0.0), accept=(0.1, 0.2, 0.3))
    assert not PolicyBlock.holds(TreePolicy(policy.costs, odd))
    with pytest.raises(ValueError, match="bin edges"):
        block.write(TreePolicy(policy.costs, odd))


class _Operations(TorchDispatchMode):
    """Counts the operations that do work (on a GPU, a kernel each inside the verification's graph)."""

    FREE = ("view", "slice", "select.int", "expand", "alias", "detach", "unsqueeze", "reshape", "_unsafe_view",
            "lift_fresh")

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not any(free in str(func) for free in self.FREE)
        return func(*args, **(kwargs or {}))


def test_the_cost_aware_choice_costs_about_a_hundred_operations_in_the_verifications_graph():
    """What choosing on the device adds to a drafted cycle's second graph, for the default 5/4/16: the fixed tree's
    selection is ~50 operations, the cost-aware choice (every level's stopping rule, the budget, the priority)
    ~130, each a kernel launch on a GPU (~1.3 us each inside a graph, docs/performance.md entry 48). The levels'
    stopping rules run as one batch (it was ~345 operations with a loop over levels and their extensions): what
    the choice adds to the fixed selection is the same number for 5 levels or 8, 4 children or 8, and the test
    fails when it grows per level or per candidate again."""
    rng = random.Random(0)
    counts = {}
    for k, steps in ((4, 5), (4, 8), (8, 6)):
        out, shape, block = random_draft(rng, k, steps), Shape.of(k, steps, CPU), PolicyBlock(steps, k, CPU)
        block.write(random_policy(rng))
        with _Operations() as fixed:
            select(out, shape, 15)
        with _Operations() as costed:
            select_costed(out, shape, 15, block)
        counts[k, steps] = fixed.count, costed.count
    print(f"selection: (fixed, cost-aware) operations by (k, steps): {counts}")
    assert counts[4, 5][0] <= 60 and counts[4, 5][1] <= 150
    assert len({c - f for f, c in counts.values()}) == 1  # the choice beyond the selection: the same for any K, k
