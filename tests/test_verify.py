"""eagleviz/decoding/verify.py: greedy matching and multi-round speculative sampling, pinned to exact distributions."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch.utils._python_dispatch import TorchDispatchMode

from eagleviz.decoding.tree import VerifyTree
from eagleviz.decoding.verify import draw, greedy_verify, sample_verify, sampling_probs
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
        res = sample_verify(TREE, lambda s: probs[s], [0.5] * 7, [0] * 7, g, text)
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
    res = sample_verify(TREE, lambda s: probs[s], [0.3] * 7, [4] * 7, g, text)
    assert res.path == [0] and res.bonus_source == "residual" and res.bonus_token in (4, 5)
    assert all(not c.accepted and c.accept_prob == 0.0 and 0.0 <= c.uniform < 1.0 for c in res.checks)
    residual = {t: p for t, _, p in res.checks[-1].residual_top if p > 0}
    assert residual == pytest.approx({4: 0.5, 5: 0.5})


def test_draw_follows_the_weights_and_never_draws_a_zero():
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 5.5])  # unnormalised, zeros inside and at the end
    g = torch.Generator().manual_seed(1)
    counts = np.bincount([draw(weights, g) for _ in range(20_000)], minlength=weights.numel())
    assert counts[weights.numpy() == 0].sum() == 0
    nz = weights.numpy() > 0
    assert chisquare(counts[nz], weights.numpy()[nz] / 10.0 * 20_000).pvalue > 1e-3


def test_draw_is_reproducible_and_handles_a_single_token():
    weights = torch.softmax(torch.randn(1000), 0)
    a = [draw(weights, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert len(set(a)) == 1
    one = torch.zeros(50)
    one[49] = 2.0
    g = torch.Generator().manual_seed(0)
    assert {draw(one, g) for _ in range(200)} == {49}


def test_a_rejection_that_leaves_no_residual_mass_draws_from_the_target():
    """Rounding can make a token that holds all the mass look rejectable (p = 0.99999994, u above it): the
    residual is then empty. Constructed here with p(x) = 0.5 on the only token with mass and a uniform drawn
    above it; the bonus must come from the target's distribution, not crash."""
    probs = torch.zeros(7, V)
    probs[0, 1] = 0.5  # slot 1 carries token 1: the only token with mass at the root
    seed = next(s for s in range(100) if float(torch.rand((), generator=torch.Generator().manual_seed(s))) >= 0.5)
    res = sample_verify(TREE, lambda s: probs[s], [0.3] * 7, [1] * 7, torch.Generator().manual_seed(seed), text)
    assert res.path == [0] and res.bonus_token == 1 and res.bonus_source == "target"
    assert not res.checks[0].accepted and res.checks[0].residual_top == []


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
    checks, the path, the bonus and the generator's state after it are the C walk's (which reads as it goes)."""
    from eagleviz.models.host import counting_reads

    ops = sample_ops.load(cache_dir() / "kernels")
    if ops is None:
        unbuilt("kernels/sample_ops.c", sample_ops.last_error(cache_dir() / "kernels"))
    probs = sampling_probs(torch.randn(7, V, generator=torch.Generator().manual_seed(seed)) * 2, 1.0, 1.0)
    a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    with Items() as items, counting_reads() as reads:
        ahead = sample_verify(TREE, lambda s: probs[s], [0.5] * 7, [0] * 7, a, text)
    walked = sample_verify(TREE, lambda s: probs[s], [0.5] * 7, [0] * 7, b, text, ops)
    kids = TREE.children()
    assert items.items == 0
    assert reads[0] == sum(1 for s in ahead.path if kids[s]) + (not kids[ahead.path[-1]])
    assert (ahead.path, ahead.bonus_token, ahead.bonus_source) == (walked.path, walked.bonus_token, walked.bonus_source)
    assert ahead.checks == walked.checks
    assert torch.equal(a.get_state(), b.get_state())
