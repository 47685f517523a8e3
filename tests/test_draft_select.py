"""kernels/draft_select.py: a level's children (log-softmax, top-k, the map to target ids) in one kernel, against
PyTorch's operations, in Triton's interpreter: rows longer than one pass, ties, a draft vocabulary's map."""

from __future__ import annotations

import pytest
import torch

from kernels import draft_select as ds
from kernels.tree_attention import pack_mask_bits

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("v,k", [(50, 1), (1500, 4), (2500, 8), (3000, 10)])
@pytest.mark.parametrize("mapped", [False, True])
def test_the_best_children_and_their_log_probabilities_are_pytorchs(v, k, mapped):
    gen = torch.Generator().manual_seed(v + k)
    logits = torch.randn(3, v, generator=gen) * 4
    d2t = torch.randint(0, 1000, (v,), generator=gen) if mapped else None
    values, ids = ds.log_softmax_topk(logits, k, d2t)
    want_values, want_ids = ds.log_softmax_topk_torch(logits, k, d2t)
    assert torch.equal(ids, want_ids)
    assert torch.allclose(values, want_values, atol=1e-5, rtol=1e-6)


def test_ties_go_to_the_lower_index_and_the_best_come_first():
    logits = torch.zeros(2, 1300)
    logits[0, [7, 1100, 3]] = 5.0                      # a three-way tie, across two passes
    logits[1, 1200] = 9.0
    logits[1, [40, 41]] = 2.0
    values, ids = ds.log_softmax_topk(logits, 4)
    assert ids.tolist() == [[3, 7, 1100, 0], [1200, 40, 41, 0]]
    assert (values[:, :-1] >= values[:, 1:]).all()
    assert torch.allclose(values.exp().sum(), torch.log_softmax(logits, -1).topk(4).values.exp().sum())


def test_rows_it_cannot_take_are_refused_in_words():
    with pytest.raises(ValueError, match="fp32 rows"):
        ds.log_softmax_topk(torch.zeros(2, 8, dtype=torch.float16), 2)
    with pytest.raises(ValueError, match="k <= V"):
        ds.log_softmax_topk(torch.zeros(2, 8), 9)


@pytest.mark.parametrize("k,levels", [(1, 4), (2, 5), (4, 5), (8, 6), (3, 12)])
@pytest.mark.parametrize("normed", [False, True])
def test_a_levels_frontier_in_one_kernel_is_the_sorts_and_gathers_it_replaces(k, levels, normed):
    """Level after level as a drafting runs them (each level's children from random log-probabilities, some tied),
    the kernel's frontier, tokens, scores, gathered rows and ancestry are PyTorch's (the ancestry past 32 slots at
    k = 3 over 12 levels: two words)."""
    gen = torch.Generator().manual_seed(k * 10 + levels)
    h_dim = 100
    norm_w = torch.randn(h_dim, generator=gen) if normed else None
    lp = torch.log_softmax(torch.randn(k, generator=gen), -1)
    ids = torch.randint(0, 1000, (k,), generator=gen)
    hs = torch.randn(1, h_dim, generator=gen)
    score = words = anc = None
    for level in range(1, levels):
        got = ds.frontier(lp, ids, score, hs, norm_w, words, k, level, 1e-5)
        want = ds.frontier_torch(lp, ids, score, hs, norm_w, anc, k, level, 1e-5)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        assert torch.allclose(got[3], want[3], atol=1e-5, rtol=1e-5)
        assert torch.equal(got[4], pack_mask_bits(want[4]))
        _, _, score, _, words = got
        anc = want[4]
        hs = torch.randn(k, h_dim, generator=gen)  # the level's outputs, each node's children's
        lp = torch.log_softmax(torch.randn(k, k, generator=gen).round(decimals=1), -1).reshape(-1)  # ties
        ids = torch.randint(0, 1000, (k * k,), generator=gen)


def test_a_frontier_refuses_a_level_without_its_inputs():
    with pytest.raises(ValueError, match="level 2"):
        ds.frontier(torch.zeros(4), torch.zeros(4, dtype=torch.long), None, torch.zeros(2, 8), None, None, 2, 2)
