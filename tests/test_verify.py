"""eagleviz/decoding/verify.py: greedy matching and multi-round speculative sampling, pinned to exact distributions."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch.utils._python_dispatch import TorchDispatchMode

from eagleviz.decoding.tree import VerifyTree
from eagleviz.decoding.verify import (cycle_uniforms, draw, greedy_verify, rejections, sample_verify, sampling_probs,
                                      uniform, walk_node)
from eagleviz.paths import cache_dir
from kernels import sample_ops
from tiny import unbuilt

V = 6
# root(slot 0) -> slots 1, 2, 3 ; slot 1 -> 4, 5 ; slot 2 -> 6
TREE = VerifyTree(node_ids=[-1, 0, 1, 2, 3, 4, 5], tokens=[0, 1, 2, 3, 4, 5, 0], parents=[-1, 0, 0, 0, 1, 1, 2],
                  depths=[0, 1, 1, 1, 2, 2, 2])


def text(t):
    return str(t)


def test_greedy_accepts_longest_matching_path_and_bonus_is_argmax():
    argmax = [1, 5, 9, 9, 9, 2, 9]  # root wants 1 (slot 1), slot 1 wants 5 (slot 5), slot 5 wants 2 -> bonus
    res = greedy_verify(TREE, argmax, [1.0] * 7, [0.9] * 7, text)
    assert res.path == [0, 1, 5] and res.bonus_token == 2
    assert [c.slot for c in res.checks] == [1, 4, 5]
    assert [c.accepted for c in res.checks] == [True, False, True]


def test_greedy_rejects_everything_when_no_child_matches():
    res = greedy_verify(TREE, [4, 0, 0, 0, 0, 0, 0], [1.0] * 7, [0.5] * 7, text)
    assert res.path == [0] and res.bonus_token == 4 and len(res.checks) == 3


def exact_two_token_distribution(probs, fresh):
    """P(c1, c2) when the target draws c1 at the root and c2 from the node reached by c1."""
    child_slot = {TREE.tokens[s]: s for s in (1, 2, 3)}
    joint = np.zeros((V, V))
    for c1 in range(V):
        nxt = probs[child_slot[c1]] if c1 in child_slot else fresh[c1]
        joint[c1] = probs[0][c1] * nxt
    return joint


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_speculative_sampling_reproduces_the_target_distribution(temperature, top_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, V, generator=gen) * 2
    fresh_logits = torch.randn(V, V, generator=gen) * 2
    probs = sampling_probs(logits, temperature, top_p)
    fresh = sampling_probs(fresh_logits, temperature, top_p)
    counts = np.zeros((V, V))
    runs = 40_000
    for seed in range(runs):
        g = torch.Generator().manual_seed(seed)
        res = sample_verify(TREE, lambda s: probs[s], [0.5] * 7, [0] * 7, cycle_uniforms(g, 7, "cpu"), text)
        committed = [TREE.tokens[s] for s in res.path[1:]] + [res.bonus_token]
        if len(committed) == 1:  # the next cycle would draw from the target at the new root
            committed.append(int(torch.multinomial(fresh[committed[0]], 1, generator=g)))
        counts[committed[0], committed[1]] += 1
    expected = exact_two_token_distribution(probs.numpy(), fresh.numpy()) * runs
    keep = expected > 5
    assert counts[~keep].sum() <= max(10, expected[~keep].sum() * 3)
    obs, exp = counts[keep], expected[keep]
    p = chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
    assert p > 1e-3, f"chi-square p = {p}"


def test_sampling_probs_top_p_keeps_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = sampling_probs(logits, 1.0, 0.8)
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = sampling_probs(logits, 1.0, 0.81)
    assert probs[2] > 0 and probs[3] == 0


def test_rejection_records_residual_and_uniform():
    probs = torch.zeros(7, V)
    probs[0] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5])  # every draft child (1, 2, 3) has p = 0
    g = torch.Generator().manual_seed(0)
    res = sample_verify(TREE, lambda s: probs[s], [0.3] * 7, [4] * 7, cycle_uniforms(g, 7, "cpu"), text)
    assert res.path == [0] and res.bonus_source == "residual" and res.bonus_token in (4, 5)
    assert all(not c.accepted and c.accept_prob == 0.0 and 0.0 <= c.uniform < 1.0 for c in res.checks)
    residual = {t: p for t, _, p in res.checks[-1].residual_top if p > 0}
    assert residual == pytest.approx({4: 0.5, 5: 0.5})


def test_draw_follows_the_weights_and_never_draws_a_zero():
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 5.5])  # unnormalised, zeros inside and at the end
    g = torch.Generator().manual_seed(1)
    counts = np.bincount([draw(weights, uniform(g, "cpu")) for _ in range(20_000)], minlength=weights.numel())
    assert counts[weights.numpy() == 0].sum() == 0
    nz = weights.numpy() > 0
    assert chisquare(counts[nz], weights.numpy()[nz] / 10.0 * 20_000).pvalue > 1e-3


def test_draw_is_reproducible_and_handles_a_single_token():
    weights = torch.softmax(torch.randn(1000), 0)
    a = [draw(weights, uniform(torch.Generator().manual_seed(7), "cpu")) for _ in range(3)]
    assert len(set(a)) == 1
    one = torch.zeros(50)
    one[49] = 2.0
    g = torch.Generator().manual_seed(0)
    assert {draw(one, uniform(g, "cpu")) for _ in range(200)} == {49}


def test_a_rejection_that_leaves_no_residual_mass_draws_from_the_target():
    """Rounding can make the last token with mass look rejectable (its probability under the residual a hair below
    1, its uniform above it): the residual is then empty, which `rejections` counts (no token with mass left, where
    a sum could round to a positive value over zeros), and the walk takes the bonus from the target's distribution,
    not from a draw over zeros."""
    probs = torch.zeros(V)
    probs[1] = probs[2] = 0.5
    ahead = rejections(probs, torch.tensor([1, 2, 3]), 8)
    assert ahead.empty.tolist() == [False, True, True]
    assert ahead.p.tolist() == [0.5, 1.0, 0.0]  # the last token with mass holds all that is left
    assert ahead.residual.sum() == 0
    checks = []
    nxt, source = walk_node(TREE, [1, 2, 3], [0.5, 1.0 - 2.0 ** -40, 0.0], [0.9, 1.0 - 2.0 ** -45, 0.5],
                            [False, True, True], ahead.top.tolist(), ahead.shown.tolist(), [0.3] * 7, [1] * 7, text,
                            checks)
    assert (nxt, source) == (None, "target") and len(checks) == 2
    assert not checks[-1].accepted and checks[-1].residual_top == []
    only = torch.full((7, V), 1.0 / V)
    only[0] = 0.0
    only[0, 1] = 0.5  # unnormalised: the node's own mass is what a child's probability is measured against
    res = sample_verify(TREE, lambda s: only[s], [0.3] * 7, [1] * 7, torch.full((7,), 0.99, dtype=torch.float64),
                        text)
    assert res.path[:2] == [0, 1] and res.checks[0].p == 1.0


def test_the_rejections_of_a_node_are_the_sequential_walks():
    """The closed form (each child against the node's mass less its elder siblings') equals zeroing the children
    one by one and renormalising, to float64 rounding, and keeps padding out of the residual."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(200):
        target = torch.softmax(torch.randn(50, generator=gen) * 3, 0)
        xs = torch.randperm(50, generator=gen)[:4]
        ahead = rejections(target, xs, 9)
        p = target.double().clone()
        for j, x in enumerate(xs.tolist()):
            assert float(ahead.p[j]) == pytest.approx(float(p[x] / p.sum()), rel=1e-12)
            p[x] = 0.0
            kept = [i for i in ahead.top.tolist() if i not in xs[:j + 1].tolist()]
            assert ahead.shown[j, [ahead.top.tolist().index(i) for i in kept]].tolist() == \
                pytest.approx((p[kept] / p.sum()).tolist(), rel=1e-12)
        assert torch.equal(ahead.residual, torch.where(p > 0, target, torch.zeros_like(target)))
        padded = rejections(target, torch.cat([xs[:2], xs[:2]]), 9, torch.tensor([True, True, False, False]))
        assert torch.equal(padded.p[:2], ahead.p[:2]) and padded.p[2:].tolist() == [0.0, 0.0]
        assert torch.equal(padded.residual, rejections(target, xs[:2], 9).residual)


def test_emptiness_read_off_the_top_list_is_the_rows_count():
    """Whether a rejection leaves no mass is read off the node's top-n list (n more than its children), not counted
    over the row: the same verdict as counting the row's tokens with mass, for rows with from one to many of them,
    children with and without mass, padding, and a list as long as the vocabulary."""
    gen = torch.Generator().manual_seed(11)
    for trial in range(400):
        target = torch.zeros(50)
        held = torch.randperm(50, generator=gen)[:1 + trial % 12]
        target[held] = torch.rand(len(held), generator=gen) + 0.01
        k = 1 + trial % 4
        rest = [i for i in torch.randperm(50, generator=gen).tolist() if i not in held.tolist()]
        held_first = held[torch.randperm(len(held), generator=gen)].tolist() + rest  # (children that take it all)
        xs = torch.tensor(held_first[:k]) if trial % 2 else torch.randperm(50, generator=gen)[:k]
        valid = torch.rand(k, generator=gen) < 0.8
        counted = torch.cumsum((target[xs] * valid > 0).long(), -1) >= int((target > 0).sum())
        for n in (k + 1, k + 5, 50):
            assert torch.equal(rejections(target, xs, n, valid).empty, counted), (trial, n)


def test_a_trees_rejections_at_once_are_each_nodes_bit_for_bit():
    """The device takes every node's rejections in one batch (`device_cycle.accept_sampled`), the host one node at
    a time: over a real vocabulary's rows the same bits, field by field."""
    gen = torch.Generator().manual_seed(9)
    rows = sampling_probs(torch.randn(16, 49152, generator=gen) * 4, 0.8, 1.0)
    xs = torch.stack([torch.randperm(49152, generator=gen)[:4] for _ in range(16)])
    xs[:, 0] = rows.argmax(-1)  # the likeliest token among them: large masses before the later children
    valid = torch.rand(16, 4, generator=gen) < 0.8
    valid[:, 0] = True
    batch = rejections(rows, xs, 9, valid)
    for r in range(16):
        one = rejections(rows[r], xs[r], 9, valid[r])
        for field in ("p", "empty", "top", "shown", "residual"):
            assert torch.equal(getattr(batch, field)[r], getattr(one, field)), (r, field)


class Items(TorchDispatchMode):
    """Counts the reads that bypass `to_host` (`float(tensor)`, `.item()`: each a wait on a GPU)."""

    def __init__(self):
        super().__init__()
        self.items = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.items += str(func).startswith(("aten._local_scalar_dense", "aten.item"))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed", range(30))
def test_the_walk_reads_once_a_node_and_draws_as_the_sequential_walk_does(seed):
    """Without C reads (a GPU's distributions) each node's rejections are computed ahead and read in one copy:
    one counted read a node with children on the walk, one more for a leaf's bonus, none past the counter; the
    checks, the path and the bonus are the C walk's (which reads as it goes), from the same uniforms."""
    from eagleviz.models.host import counting_reads

    ops = sample_ops.load(cache_dir() / "kernels")
    if ops is None:
        unbuilt("kernels/sample_ops.c", sample_ops.last_error(cache_dir() / "kernels"))
    probs = sampling_probs(torch.randn(7, V, generator=torch.Generator().manual_seed(seed)) * 2, 1.0, 1.0)
    us = cycle_uniforms(torch.Generator().manual_seed(seed), 7, "cpu")
    with Items() as items, counting_reads() as reads:
        ahead = sample_verify(TREE, lambda s: probs[s], [0.5] * 7, [0] * 7, us, text)
    walked = sample_verify(TREE, lambda s: probs[s], [0.5] * 7, [0] * 7, us, text, ops)
    kids = TREE.children()
    assert items.items == 0
    assert reads[0] == sum(1 for s in ahead.path if kids[s]) + (not kids[ahead.path[-1]])
    assert (ahead.path, ahead.bonus_token, ahead.bonus_source) == (walked.path, walked.bonus_token, walked.bonus_source)
    assert ahead.checks == walked.checks
    assert [c.uniform for c in walked.checks] == [float(us[c.slot]) for c in walked.checks]  # slot s's own number
