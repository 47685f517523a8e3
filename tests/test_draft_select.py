"""kernels/draft_select.py: a level's children (log-softmax, top-k, the map to target ids) in one kernel, against
PyTorch's operations, in Triton's interpreter: rows longer than one pass, ties, a draft vocabulary's map."""

from __future__ import annotations

import pytest
import torch

from kernels import draft_select as ds

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
