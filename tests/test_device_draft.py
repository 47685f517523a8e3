"""eagleviz/decoding/device_draft.py: every level of the head's drafting in one captured function, read once,
against the host's level-by-level drafting (`drafting._head_levels`) on a CPU, with `Recording` standing in
for a CUDA graph's capture (tests/tiny.py)."""

from __future__ import annotations

import math

import pytest

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.models.draft import random_head
from eagleviz.models.static import BUCKETS
from eagleviz.models.target import TargetModel
from tiny import CPU_COSTS, Recording, tiny_target

PROMPT = "12345 1234 123"


@pytest.fixture(scope="module")
def target() -> TargetModel:
    """A tiny model on PyTorch's operations (as a GPU runs them: no C layer)."""
    t = tiny_target()
    return TargetModel(t.hf, t.tokenizer, t.name, fused=False)


def engine(target, decode: str, arch: str = "eagle1", steps: int = 0) -> Engine:
    """Without the run's clock (`Ledger`): the two paths take different times, and it rests the head by time. A
    cost-aware tree of `steps` levels is priced as the static path prices it (every level drafted in one call:
    `CostModel.drafting_at_once`), on the eager path too, so that both choose alike."""
    e = Engine(target, random_head(target, arch, seed=1, std=0.5), "random", decode=decode, compiled_sampling=False,
               costs=CPU_COSTS.drafting_at_once(steps), ledger=False)
    e.make_graphs = Recording
    return e


# A cumulative draft log-probability below this is a node the head all but rules out (p < 1e-30): a random head's
# logits reach ~1e4 there, where the two paths' products, added in other orders, part by ~0.3% (-17616 against
# -17660 on an AVX2-only EPYC). Whether such a node is expanded or kept is compared exactly, its score not.
NEVER = math.log(1e-30)


def agree(host: float, device: float) -> bool:
    """Two cumulative draft scores equal to rounding, or both of nodes the head rules out."""
    return math.isclose(host, device, rel_tol=2e-3, abs_tol=2e-3) or max(host, device) < NEVER


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
@pytest.mark.parametrize("tree", [TreeConfig.create(1, 3, 4, adaptive=False), TreeConfig.create(4, 2, 8, adaptive=False),
                                  TreeConfig.create(6, 3, 30, adaptive=False, source="eagle"), TreeConfig.create()],
                         ids=["one-level", "4/2/8", "6/3/30", "default"])
def test_drafting_on_the_device_grows_the_hosts_trees(target, arch, tree):
    """Every cycle's candidates (tokens, parents, which were expanded and verified, scores to rounding), the
    policy's levels and the output are the host's, for both head architectures, sampled (T = 1: more cycles,
    more varied trees); where a cost-aware policy stops early the decision says the device drafted on."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=40, seed=3)
    runs = {decode: engine(target, decode, arch, tree.steps).generate(PROMPT, tree, sampling)
            for decode in ("eager", "static")}
    host, device = runs["eager"], runs["static"]
    assert [o.token for o in device.output] == [o.token for o in host.output]
    assert len(device.cycles) == len(host.cycles) > 10
    for a, b in zip(host.cycles, device.cycles):
        assert [(n.token, n.parent, n.expanded, n.kept) for n in a.nodes] == \
               [(n.token, n.parent, n.expanded, n.kept) for n in b.nodes]
        assert all(agree(m.score, n.score) for m, n in zip(a.nodes, b.nodes))
        assert a.draft_levels == b.draft_levels and a.path == b.path
        if "stopped" in a.decision:
            assert "the device drafted all" in b.decision


def test_a_prompt_longer_than_every_bucket_is_drafted_uncaptured_at_its_size(target):
    """The first drafting encodes the whole prompt (here ~120 positions, past the largest bucket of 64)."""
    prompt = "1234567 " * 15
    tree = TreeConfig.create(4, 2, 8, adaptive=False)
    runs = {d: engine(target, d).generate(prompt, tree, SamplingConfig(max_new_tokens=24)) for d in ("eager", "static")}
    assert runs["static"].prompt_tokens > BUCKETS[-1]
    assert [o.token for o in runs["static"].output] == [o.token for o in runs["eager"].output]
    assert [c.path for c in runs["static"].cycles] == [c.path for c in runs["eager"].cycles]


def test_the_devices_frontier_and_masks_are_the_hosts_on_a_thousand_random_trees():
    """Each tree grown level by level with random scores (ties made common by rounding): the device's frontier
    is `select_frontier`'s, and its ancestor rows are the host's mask over the expanded nodes' slots."""
    import torch

    from eagleviz.decoding.device_draft import grow_ancestors, pick_frontier
    from eagleviz.decoding.tree import Candidates, select_frontier

    gen = torch.Generator().manual_seed(0)
    for case in range(1000):
        k = int(torch.randint(1, 6, (1,), generator=gen))
        steps = int(torch.randint(2, 6, (1,), generator=gen))
        cands, eye = Candidates(), torch.eye(k, dtype=torch.bool)
        lp = (-torch.rand(k, generator=gen) * 4).round(decimals=1)  # rounded: equal scores happen
        level = cands.add_children(-1, list(range(k)), lp.tolist())
        score = lp.double()
        anc, seen, slots = eye, {}, 0
        for s in range(1, steps):
            order = pick_frontier(score, k)
            frontier = [level[i] for i in order.tolist()]
            assert frontier == select_frontier(cands, level, k), case
            parents = order // k if s > 1 else torch.zeros_like(order)
            if s > 1:
                anc = grow_ancestors(anc, parents, eye)
            for node in frontier:  # the host's bookkeeping (`_head_levels`): a slot per expanded node
                seen[node] = seen.get(cands.parents[node], []) + [slots]
                slots += 1
            host = torch.zeros(k, slots, dtype=torch.bool)
            for r, node in enumerate(frontier):
                host[r, seen[node]] = True
            assert torch.equal(anc, host), case
            lp = (-torch.rand(k, k, generator=gen) * 4).round(decimals=1)
            level = [i for r, node in enumerate(frontier) for i in cands.add_children(node, list(range(k)),
                                                                                       lp[r].tolist())]
            score = (score[order][:, None] + lp.double()).reshape(-1)
