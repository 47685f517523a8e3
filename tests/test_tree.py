"""eagleviz/decoding/tree.py: expansion, reranking closed under ancestors, the verification tree's mask and paths."""

import random

import pytest
import torch

from eagleviz.decoding.tree import Candidates, VerifyTree, rerank, select_frontier


def random_candidates(rng: random.Random, steps: int, topk: int) -> Candidates:
    """Grow candidates the way drafting does: top-k children per frontier node, global top-k frontier."""
    cands = Candidates()

    def children(parent):
        lps = sorted((-rng.expovariate(1.0) for _ in range(topk)), reverse=True)
        ids = cands.add_children(parent, [rng.randrange(100) for _ in range(topk)], lps)
        return ids

    level = children(-1)
    for _ in range(1, steps):
        frontier = select_frontier(cands, level, topk)
        level = []
        for node in frontier:
            cands.expanded[node] = True
            level += children(node)
    return cands


def test_rerank_keeps_budget_closed_under_ancestors_and_topological():
    rng = random.Random(0)
    for trial in range(200):
        steps, topk = rng.randint(1, 6), rng.randint(1, 5)
        cands = random_candidates(rng, steps, topk)
        budget = rng.randint(1, len(cands))
        kept = rerank(cands, budget)
        assert len(kept) == budget
        seen = set()
        for node in kept:
            parent = cands.parents[node]
            assert parent < 0 or parent in seen, "a kept node's parent must be kept and verified before it"
            seen.add(node)
        # best scores win: nothing dropped scores above the worst kept node unless it has a dropped ancestor
        worst = min(cands.scores[n] for n in kept)
        assert all(cands.scores[n] <= worst + 1e-12 for n in range(len(cands)) if n not in seen)


def test_rerank_is_closed_even_with_exact_ties():
    cands = Candidates()
    a, b = cands.add_children(-1, [5, 6], [0.0, 0.0])
    cands.add_children(a, [7], [0.0])  # same score as its parent
    kept = rerank(cands, 2)
    assert all(cands.parents[n] < 0 or cands.parents[n] in kept for n in kept)


def test_mask_is_ancestor_or_self_and_depth_is_row_sum_minus_one():
    rng = random.Random(1)
    for _ in range(50):
        cands = random_candidates(rng, rng.randint(1, 5), rng.randint(1, 4))
        tree = VerifyTree.build(cands, rerank(cands, rng.randint(1, len(cands))), root_token=1)
        mask = tree.mask()
        for i in range(len(tree)):
            ancestors, j = {i}, i
            while tree.parents[j] >= 0:
                j = tree.parents[j]
                ancestors.add(j)
            assert {j for j in range(len(tree)) if mask[i, j]} == ancestors
        assert (mask.sum(1) - 1).tolist() == tree.depths


def test_paths_are_root_to_leaf_chains_covering_every_node():
    rng = random.Random(2)
    cands = random_candidates(rng, 5, 3)
    tree = VerifyTree.build(cands, rerank(cands, 20), root_token=1)
    kids = tree.children()
    covered = set()
    for path in tree.paths():
        assert path[0] == 0 and not kids[path[-1]]
        assert all(tree.parents[b] == a for a, b in zip(path, path[1:]))
        covered.update(path)
    assert covered == set(range(len(tree)))


def test_chain_when_topk_is_one():
    cands = random_candidates(random.Random(3), steps=6, topk=1)
    tree = VerifyTree.build(cands, rerank(cands, 6), root_token=1)
    assert tree.parents == [-1, 0, 1, 2, 3, 4, 5]
    assert torch.equal(tree.mask(), torch.ones(7, 7, dtype=torch.bool).tril())


def test_the_mask_equals_the_kernels_ancestor_mask_at_every_size():
    """`VerifyTree.mask` builds rows from bits, unpacked 62 columns at a time: the kernels' `ancestor_mask` agrees
    on random trees of 1 to 130 slots (one, two and three words a row), and a parent after its child is refused."""
    from kernels.tree_attention import ancestor_mask

    rng = random.Random(4)
    for size in list(range(1, 70)) + [100, 124, 125, 130]:
        parents = [-1] + [rng.randrange(s) for s in range(1, size)]
        tree = VerifyTree(node_ids=list(range(size)), tokens=[0] * size, parents=parents, depths=[0] * size)
        assert torch.equal(tree.mask(), ancestor_mask(torch.tensor(parents))), size
    with pytest.raises(ValueError, match="topological"):
        VerifyTree(node_ids=[0, 1, 2], tokens=[0] * 3, parents=[-1, 2, 0], depths=[0] * 3).mask()
