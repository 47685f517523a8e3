"""eagleviz/decoding/device_cycle.py: a fixed tree's greedy drafted cycle chosen, verified, walked and committed on
the device, read once, against the host's rules (`tree.rerank`, `VerifyTree.mask`, `verify.greedy_verify`,
`KVCache.commit_path`) on thousands of random drafts with ties, and against the host path's traces field by
field, with `Recording` standing in for a CUDA graph's capture (a record of the operations replayed without
the Python: tests/tiny.py)."""

from __future__ import annotations

import dataclasses
import math
import operator
import random

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig, kv_slots
from eagleviz.decoding.calibration import EDGES, Calibration, HeadCalibration
from eagleviz.decoding.costs import CostModel
from eagleviz.decoding import device_cycle
from eagleviz.decoding.device_cycle import Shape, accept_greedy, accept_sampled, ancestor_rows, fits, select
from eagleviz.decoding.device_draft import DeviceDrafter, DraftOut
from eagleviz.decoding.device_policy import PolicyBlock
from eagleviz.decoding.drafting import rebuild
from eagleviz.decoding.engine import Engine
from eagleviz.decoding.policy import TreePolicy
from eagleviz.decoding.tree import Candidates, VerifyTree, rerank
from eagleviz.decoding.verify import cycle_uniforms, greedy_verify, sample_verify, sampling_probs, top_tokens
from eagleviz.models.draft import random_head
from eagleviz.models.host import counting_reads
from eagleviz.models.kv_cache import KVCache
from eagleviz.models.static import BUCKETS, StaticSteps
from eagleviz.models.target import TargetModel
from test_static import Ops
from tiny import Counting, Recording, reverse_kept, tiny_target

PROMPT = "12345 1234 123"
LOGPROBS = (0.0, -0.25, -0.5, -1.0, -1.0, -2.0, -math.inf)  # few values: ties within and across levels


def random_draft(rng: random.Random, k: int, steps: int) -> DraftOut:
    """A drafting as the device makes it: k children a node (distinct tokens), each later level the children of
    k rows of the level before (any k distinct rows: the host takes the frontiers as given)."""
    ids, lps, fronts = [], [], []
    for s in range(steps):
        nodes = 1 if s == 0 else k
        for _ in range(nodes):
            ids += rng.sample(range(50), k)
            lps += sorted((rng.choice(LOGPROBS) for _ in range(k)), reverse=True)
        if s:
            fronts += rng.sample(range(k if s == 1 else k * k), k)
    return DraftOut(torch.tensor(ids), torch.tensor(lps, dtype=torch.float32), torch.tensor(fronts, dtype=torch.int64))


def host_tree(out: DraftOut, k: int, steps: int, m: int) -> tuple[Candidates, VerifyTree]:
    """What the host path keeps of the same drafting (`drafting.grow` with no policy)."""
    cands = Candidates()
    tree = TreeConfig(steps, k, m + 1, adaptive=False)
    rebuild(cands, out.ids.tolist(), out.logprobs.tolist(), out.frontiers.tolist(), tree, None, None, m + 1)
    return cands, VerifyTree.build(cands, rerank(cands, m), root_token=7)


@pytest.mark.parametrize("k,steps", [(1, 1), (2, 3), (3, 4), (4, 5), (8, 3)])
def test_the_device_keeps_the_hosts_tree_with_its_order_parents_and_mask(k, steps):
    rng = random.Random(k * 100 + steps)
    shape = Shape.of(k, steps, torch.device("cpu"))
    for trial in range(300):
        out = random_draft(rng, k, steps)
        m = rng.randint(1, min(63, shape.depth.numel()))
        cands, tree = host_tree(out, k, steps, m)
        sel = select(out, shape, m)
        assert sel.kept.tolist() == tree.node_ids[1:], trial
        assert sel.parents.tolist() == tree.parents
        assert sel.depths.tolist() == tree.depths[1:]
        assert sel.tokens.tolist() == tree.tokens[1:]
        assert torch.equal(ancestor_rows(sel.parents, steps), tree.mask())


def random_tree(rng: random.Random, size: int) -> VerifyTree:
    parents, depths, tokens = [-1], [0], [5]
    for s in range(1, size):
        p = rng.randrange(s)
        taken = {tokens[c] for c in range(s) if parents[c] == p}
        parents.append(p)
        depths.append(depths[p] + 1)
        tokens.append(rng.choice([t for t in range(30) if t not in taken]))  # siblings: distinct tokens
    return VerifyTree(list(range(-1, size - 1)), tokens, parents, depths)


def test_the_device_walk_accepts_the_hosts_path():
    rng = random.Random(3)
    for trial in range(2000):
        tree = random_tree(rng, rng.randint(1, 24))
        depth = max(tree.depths)
        argmax = [rng.randrange(30) for _ in tree.tokens]
        for s, p in enumerate(tree.parents):  # most parents' argmax is one of their children's: long walks
            if p >= 0 and rng.random() < 0.6:
                argmax[p] = tree.tokens[s]
        want = greedy_verify(tree, argmax, [1.0] * len(tree), [1.0] * len(tree), str).path
        path, n = accept_greedy(torch.tensor(argmax), torch.tensor(tree.tokens), torch.tensor(tree.parents), depth)
        assert int(n) == len(want), trial
        assert path.tolist() == want + list(range(len(want), depth + 1))


def random_rows(rng: random.Random, t: int, v: int) -> torch.Tensor:
    """Logits (t, v) a sampled walk can go deep in: a peaked row, a flat one, or one whose mass sits on one token
    (after the temperature, a rejection there can leave no residual)."""
    rows = torch.randn(t, v, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    for r in range(t):
        kind = rng.random()
        if kind < 0.3:
            rows[r] *= 6.0
        elif kind < 0.4:
            rows[r] = -60.0
            rows[r, rng.randrange(v)] = 60.0
    return rows


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.3, 1.0), (0.8, 0.7)])
def test_the_device_sampled_walk_is_the_hosts(temperature, top_p):
    """`accept_sampled` on random trees and rows (the tree's tokens often the rows' likely ones, so walks go deep),
    replayed by the host from its record (`replay_sampled`), against `verify.sample_verify` with the same uniforms:
    the same path, checks (uniforms, probabilities under each residual, the residuals' top tokens), bonus and
    source; the probabilities the trace shows at each slot, and the root's most likely tokens."""
    rng = random.Random(int(temperature * 10 + top_p * 100))
    v, k = 30, 4
    sampling = device_cycle.Sampling(temperature, top_p, v)
    sources = set()
    for trial in range(150):
        tree = random_tree(rng, rng.randint(1, 16))
        while max(len(c) for c in tree.children()) > k:
            tree = random_tree(rng, rng.randint(1, 16))
        t, depth = len(tree), max(max(tree.depths), 1)
        logits = random_rows(rng, t, v)
        for s, p in enumerate(tree.parents):  # a child's token made its parent's most likely: long walks (no tie:
            if p >= 0 and rng.random() < 0.5:  # tied residual tokens may be listed in any order)
                logits[p, tree.tokens[s]] = logits[p].max() + rng.choice([0.5, 1.0, 3.0])
        us = cycle_uniforms(torch.Generator().manual_seed(trial), t + 2, "cpu")
        probs = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
        rows = probs if top_p >= 1.0 else sampling_probs(logits, temperature, top_p)
        argmax = logits.argmax(dim=-1).tolist()
        qs = [0.5] * t
        want = sample_verify(tree, lambda s: rows[s], qs, argmax, us, str)
        path, n, tprobs, walk = accept_sampled(logits, torch.tensor(tree.tokens), torch.tensor(tree.parents), us,
                                               depth, k, sampling)
        reading = device_cycle.parse_sampled(torch.cat([us[:t], walk]).tolist(), t, depth, k, sampling)
        got = device_cycle.replay_sampled(tree, reading, qs, argmax, str)
        assert int(n) == len(want.path) and path.tolist() == want.path + list(range(len(want.path), depth + 1))
        assert (got.path, got.checks, got.bonus_token, got.bonus_source) == \
            (want.path, want.checks, want.bonus_token, want.bonus_source), trial
        assert reading.residual == (want.bonus_source == "residual")
        assert tprobs.tolist() == probs.gather(-1, torch.tensor(argmax)[:, None])[:, 0].tolist()
        assert [i for i, _ in reading.root_top] == top_tokens(rows[0], sampling.root_n)[0]  # (`Engine._root_top`)
        sources.add((len(want.path) > 2, want.bonus_source))
    assert {(True, "target"), (True, "residual"), (False, "residual")} <= sources  # deep walks; residual draws


def test_the_sampled_walk_adds_a_bounded_number_of_operations_to_the_verifications_graph():
    """What walking at T > 0 adds to a drafted cycle's second graph (each operation a kernel on a GPU): every node's
    rejections in one batch, then a few operations a level. It was 402 for 5/4/16 when each level took its node's
    rejections in turn; the test fails when the walk grows by tens of operations a level again."""
    from test_device_policy import _Operations

    rng = random.Random(5)
    counts = {}
    for k, depth, t in ((4, 5, 16), (4, 8, 16), (8, 6, 64)):
        parents = [-1] + [rng.randrange(s) for s in range(1, t)]
        with _Operations() as walk:
            accept_sampled(torch.randn(t, 64), torch.randint(0, 64, (t,)), torch.tensor(parents),
                           torch.rand(t, dtype=torch.float64), depth, k, device_cycle.Sampling(0.8, 1.0, 64))
        counts[k, depth, t] = walk.count
    print(f"the sampled walk's operations by (k, depth, slots): {counts}")
    assert counts[4, 5, 16] <= 200
    assert counts[4, 8, 16] - counts[4, 5, 16] <= 3 * 15  # three levels more: ~12 operations each (the rejections
    # a level at a time were ~65)


def test_the_device_commit_moves_the_hosts_slots():
    rng = random.Random(4)
    for _ in range(200):
        start, depth = rng.randrange(10), rng.randint(1, 6)
        n = rng.randint(1, depth + 1)
        rel = [0] + sorted(rng.sample(range(1, 3 * depth + 2), n - 1))
        caches = [KVCache.allocate(2, 2, 40, 4, torch.float32) for _ in range(2)]
        for c in caches:
            torch.manual_seed(0)
            c.k.copy_(torch.randn_like(c.k))
            c.v.copy_(torch.randn_like(c.v))
            c.length = start + rel[-1] + 1
        host, dev = caches
        moves = host.commit_path(start, [start + s for s in rel])
        dev.commit_moves(torch.tensor([start]), torch.tensor(rel + list(range(n, depth + 1))))
        assert dev.settle(start, [start + s for s in rel]) == moves
        assert dev.length == host.length
        assert torch.equal(dev.k[:, :, :host.length], host.k[:, :, :host.length])
        assert torch.equal(dev.v[:, :, :host.length], host.v[:, :, :host.length])


def test_only_trees_one_captured_step_holds_run_on_the_device():
    assert not fits(1) and fits(2) and fits(BUCKETS[-1]) and not fits(BUCKETS[-1] + 1)


# ---------------------------------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def target() -> TargetModel:
    """A tiny model on PyTorch's operations (as a GPU runs them: no C layer)."""
    t = tiny_target()
    return TargetModel(t.hf, t.tokenizer, t.name, fused=False)


def engine(target, arch: str = "eagle1", seed: int = 1, std: float = 0.5, **kwargs) -> Engine:
    e = Engine(target, random_head(target, arch, seed=seed, std=std), "random", decode="static",
               compiled_sampling=False, **kwargs)
    e.make_graphs = Recording
    return e


@pytest.fixture(scope="module")
def engines(target):
    """`engine(target, arch, device_cycle=on)` made once per module: its pool keeps the states and their captures
    (each a make_fx record here) from one test's runs to the next's, as an app's engine keeps them."""
    made: dict[tuple, Engine] = {}

    def get(arch: str = "eagle1", on: bool = True, head: tuple[int, float] = (1, 0.5)) -> Engine:
        if (arch, on, head) not in made:
            # (no clock in the books: a cost-aware tree's rests would follow the wall time, not the cycle's logic)
            made[arch, on, head] = engine(target, arch, *head, device_cycle=on, ledger=False)
        return made[arch, on, head]

    return get


def runs(engines, tree: TreeConfig, arch: str = "eagle1", tokens: int = 32, policy: dict | None = None,
         head: tuple[int, float] = (1, 0.5), sampling: SamplingConfig | None = None):
    """The same run (greedy, or `sampling`'s) with the cycle on the device and on the host, and the reads each made;
    `policy`: the prices and calibration (`Engine.with_policy`) of a cost-aware tree; `head`: the random head's seed
    and spread."""
    out = {}
    sampling = sampling or SamplingConfig(max_new_tokens=tokens)
    for on in (True, False):
        e = engines(arch, on, head).with_policy(**(policy or {}))
        with counting_reads() as reads:
            out[on] = e.generate(PROMPT, tree, sampling), reads[0]
        assert not [note for note in out[on][0].notes if "failed" in note]  # every capture held
    return out


def fields(cycle) -> dict:
    return {k: v for k, v in dataclasses.asdict(cycle).items() if k != "timings_ms"}


def near(a, b) -> bool:
    """Equal, floats within a few float32 steps: a cycle whose tree is the root alone verifies it in the step of the
    tree it could have verified on the device, in a step of one token on the host, and a CPU's products round a
    row's last bits by the rows beside it (its probabilities, and the features the head drafts from next)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(near(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(near(x, y) for x, y in zip(a, b))
    return a == b


TREES = [TreeConfig.create(5, 4, 16, adaptive=False, source="eagle"), TreeConfig.create(3, 2, 4, adaptive=False,
                                                                                         source="eagle"),
         TreeConfig.create(6, 8, 64, adaptive=False, source="eagle")]


@pytest.mark.parametrize("tree,arch", [(TREES[0], "eagle1"), (TREES[0], "eagle3"), (TREES[1], "eagle1"),
                                       (TREES[2], "eagle3")], ids=["5/4/16", "5/4/16-eagle3", "3/2/4", "6/8/64-eagle3"])
def test_a_device_cycle_writes_the_host_paths_trace_and_reads_once(engines, tree, arch):
    both = runs(engines, tree, arch)
    (device, device_reads), (host, host_reads) = both[True], both[False]
    assert [o.token for o in device.output] == [o.token for o in host.output]
    assert len(device.cycles) == len(host.cycles) > 5
    for a, b in zip(device.cycles, host.cycles):
        assert fields(a) == fields(b), a.index
    assert device_reads == 1 + len(device.cycles)  # the prefill's, then one a drafted cycle
    assert host_reads == 1 + 2 * len(host.cycles)  # the drafting's and the verdict's


STEEP = CostModel(verify=((1, 1.0), (2, 1.25), (4, 1.6), (16, 3.5), (64, 11.0)), draft_level=0.15, overhead=0.1,
                  draft_fixed=0.1)  # a CPU's curve: small trees, and draftings not worth verifying
TABLE = Calibration(edges=EDGES, accept=(0.0,) * 6 + (0.05, 0.1, 0.1, 0.2, 0.3, 0.3, 0.5, 0.5, 0.7, 0.8, 0.9, 0.95),
                    child=(0.6, 0.2, 0.1, 0.05))  # a fitted table's shape: few distinct values (ties)


@pytest.mark.parametrize("arch,policy", [
    ("eagle1", {}), ("eagle3", {}),
    ("eagle1", {"costs": STEEP}),
    ("eagle1", {"costs": STEEP, "calibration": HeadCalibration(TABLE, TABLE)}),
    ("eagle3", {"calibration": HeadCalibration(TABLE, TABLE)})],
    ids=["flat", "flat-eagle3", "steep", "steep-table", "flat-table-eagle3"])
def test_a_cost_aware_cycle_on_the_device_writes_the_host_paths_trace_and_reads_once(engines, arch, policy):
    """The default tree's greedy cycles, chosen on the device (levels kept, nodes verified, root alone) from the
    price list and the calibration as the run's own acceptance moves it, are the host path's field by field; every
    cycle reads once, where the host path reads a drafted cycle twice."""
    both = runs(engines, TreeConfig.create(source="eagle"), arch, tokens=40, policy=policy, head=(2, 0.05))
    (device, device_reads), (host, host_reads) = both[True], both[False]
    assert [o.token for o in device.output] == [o.token for o in host.output]
    alone = False
    for a, b in zip(device.cycles, host.cycles):
        alone = alone or len(a.tokens) == 1
        assert (near if alone else operator.eq)(fields(a), fields(b)), a.index  # exact before the first root alone
    assert len(device.cycles) == len(host.cycles)
    drafted = sum(c.draft_levels > 0 for c in device.cycles)
    assert drafted > 3
    assert device_reads == 1 + len(device.cycles)
    assert host_reads == 1 + len(host.cycles) + drafted
    if policy.get("costs") is STEEP:  # choices the fixed tree never makes: fewer levels, the root alone
        assert any(0 < c.draft_levels < 5 for c in device.cycles)
        if "calibration" in policy:  # (the run's own acceptance lowers the table's values until none pays)
            assert any(c.draft_levels > 0 and len(c.tokens) == 1 for c in device.cycles)
    elif arch == "eagle1":
        assert sum(c.accept_length for c in device.cycles) >= 3  # (this random head's guesses are taken at times)


def test_over_static_steps_a_tree_keeping_fewer_levels_pays_for_every_level_the_device_drafted(target, engines,
                                                                                               monkeypatch):
    """Over static steps the head drafts all K levels in one captured call, whatever a cost-aware tree keeps: the
    block the device chooses from and the host path's policy over the same drafter price keeping L levels as
    drafting K (`CostModel.drafting_at_once`); an eager engine, which drafts level by level, prices the levels it
    drafts."""
    tree, blocks, hosts = TreeConfig.create(source="eagle"), [], []
    write, budget = PolicyBlock.write, TreePolicy.budget
    monkeypatch.setattr(PolicyBlock, "write", lambda self, policy: (blocks.append(self), write(self, policy))[1])
    monkeypatch.setattr(TreePolicy, "budget", lambda self, *a: (hosts.append(self.costs), budget(self, *a))[1])
    eager = Engine(target, random_head(target, "eagle1", seed=2, std=0.05), "random", decode="eager",
                   compiled_sampling=False, ledger=False)
    for e in (engines("eagle1", True, (2, 0.05)), engines("eagle1", False, (2, 0.05)), eager):
        blocks.clear(), hosts.clear()
        e.with_policy(costs=STEEP).generate(PROMPT, tree, SamplingConfig(max_new_tokens=8))
        whole, device = e is not eager, e is not eager and e.device_cycle
        assert bool(blocks) == device and bool(hosts) != device  # (a cycle is chosen on one side or the other)
        for block in blocks:
            assert block.draft.tolist() == pytest.approx([0.0] + [STEEP.draft_cost(tree.steps)] * tree.steps)
        assert {c.draft_cost(1) for c in hosts} <= {STEEP.draft_cost(tree.steps) if whole else STEEP.draft_cost(1)}


def test_cycles_with_a_lookup_take_the_host_path_and_the_others_the_device(engines):
    both = runs(engines, TreeConfig.create(4, 3, 12, adaptive=False), tokens=48)
    (device, device_reads), (host, _) = both[True], both[False]
    assert [fields(c) for c in device.cycles] == [fields(c) for c in host.cycles]
    looked = sum(c.lookup_ngram > 0 for c in device.cycles)
    assert 0 < looked < len(device.cycles)
    assert device_reads == 1 + len(device.cycles) + looked


@pytest.mark.parametrize("tree,temperature", [(TreeConfig.create(5, 4, 16, adaptive=False, source="eagle"), 0.0),
                                              (TreeConfig.create(source="eagle"), 0.0),
                                              (TreeConfig.create(5, 4, 16, adaptive=False, source="eagle"), 1.0)],
                         ids=["fixed", "cost-aware", "fixed-sampled"])
def test_nothing_after_the_read_touches_the_device(engines, monkeypatch, tree, temperature):
    """After its one read a cycle's pictures come from what it read: the record and the drafting's outputs
    (rewritten by the next drafting of their size on a GPU) and a sampled cycle's uniforms poisoned right after the
    read, the run is the same."""
    last: list = []
    launch, read = DeviceDrafter.launch, device_cycle.to_host

    def remembered(self, *args):
        last[:] = [launch(self, *args), self.uniforms]
        return last[0]

    def poisoning(*tensors):
        values = read(*tensors)
        for t in [*tensors, last[0].ids, last[0].logprobs, last[0].frontiers, last[1]]:
            t.fill_(-1 if not t.is_floating_point() else math.nan)
        return values

    sampling = SamplingConfig(max_new_tokens=32, temperature=temperature, seed=2)
    clean = engines().generate(PROMPT, tree, sampling)
    monkeypatch.setattr(DeviceDrafter, "launch", remembered)
    monkeypatch.setattr(device_cycle, "to_host", poisoning)
    poisoned = engines().generate(PROMPT, tree, sampling)
    assert len(poisoned.cycles) > 5
    assert [fields(c) for c in poisoned.cycles] == [fields(c) for c in clean.cycles]


def test_a_drafted_cycle_replays_two_captures_all_made_before_the_run(target):
    """The head's drafting, then the selection, verification, walk and commit: two replays a drafted cycle, one a
    cycle that did not draft, one the prompt's prefill. `Engine.prepare` captures every graph first: the runs capture nothing (plain
    decoding's, the fixed tree's, and the cost-aware tree's, whose cycles choose on the device too)."""
    made: list[Counting] = []
    e = Engine(target, random_head(target, "eagle3", seed=1, std=0.5), "random", decode="static",
               compiled_sampling=False)  # (an EAGLE-3 head's runs lease a state of their own beside plain decoding's)
    e.make_graphs = lambda: made.append(Counting()) or made[-1]
    fixed = TreeConfig.create(5, 4, 16, adaptive=False, source="eagle")
    sampling = SamplingConfig(max_new_tokens=32)
    for tree in (None, fixed, TreeConfig.create()):  # (the last one's drafting was captured with the fixed tree's)
        captured = e.prepare(kv_slots(len(e.encode_prompt(PROMPT)), 32, tree), tree)
        assert captured > 0  # (the cost-aware tree's drafting was captured with the fixed tree's: its verification)
        captures, replays = sum(g.captures for g in made), sum(g.replays for g in made)
        run = e.generate(PROMPT, tree, sampling)
        assert sum(g.captures for g in made) == captures
        if tree is not None:
            drafted = sum(c.draft_levels > 0 for c in run.cycles)
            assert drafted > 2
            assert sum(g.replays for g in made) - replays == 1 + 2 * drafted + len(run.cycles) - drafted  # 1: the
            # prefill's (the prompt after the chat's opening: one chunk)
    assert e.with_decode("eager").prepare(512, fixed) == 0
    # sampled: the same two replays a drafted cycle; its verification, whose capture freezes the temperature and
    # the nucleus, captured by `prepare` given the run's sampling, else at its first use in the run
    for temperature, prepare in ((1.0, True), (0.6, False)):
        sampling = SamplingConfig(max_new_tokens=16, temperature=temperature)
        if prepare:
            assert e.prepare(kv_slots(len(e.encode_prompt(PROMPT)), 16, fixed), fixed, sampling) > 0
        captures, replays = sum(g.captures for g in made), sum(g.replays for g in made)
        run = e.generate(PROMPT, fixed, sampling)
        drafted = sum(c.draft_levels > 0 for c in run.cycles)
        assert drafted > 2 and sum(g.replays for g in made) - replays == 1 + 2 * drafted + len(run.cycles) - drafted
        assert (sum(g.captures for g in made) == captures) == prepare
        assert not [note for note in run.notes if "failed" in note]


@pytest.mark.parametrize("tree,sampling", [
    (TREES[0], SamplingConfig(max_new_tokens=32, temperature=1.0, seed=3)),
    (TREES[1], SamplingConfig(max_new_tokens=32, temperature=0.7, top_p=0.9, seed=5)),
    (TreeConfig.create(source="eagle"), SamplingConfig(max_new_tokens=32, temperature=0.3, seed=4))],
    ids=["5/4/16-T1", "3/2/4-nucleus", "cost-aware-T0.3"])
def test_a_sampled_device_cycle_writes_the_host_paths_trace_and_reads_once(engines, tree, sampling):
    """At T > 0 the walk is decided on the device too (`accept_sampled`, the cycle's uniforms drawn into the drafter's
    buffer at its launch): the same tokens for the same seed as the host path's walk, every cycle's trace the same
    field by field (checks with their uniforms and residuals, bonus and source, the root's distribution), and one
    read a cycle, where the host path reads the drafting, then once a node on the walk."""
    both = runs(engines, tree, head=(2, 0.05), sampling=sampling)
    (device, device_reads), (host, host_reads) = both[True], both[False]
    assert [o.token for o in device.output] == [o.token for o in host.output]
    assert len(device.cycles) == len(host.cycles)
    alone = False
    for a, b in zip(device.cycles, host.cycles):
        alone = alone or len(a.tokens) == 1
        assert (near if alone else operator.eq)(fields(a), fields(b)), a.index
    drafted = sum(c.draft_levels > 0 for c in device.cycles)
    assert drafted > 3 and any(len(c.committed) > 1 for c in device.cycles)  # drafts accepted (a random head's
    # few: `test_the_device_sampled_walk_is_the_hosts` walks deep)
    assert any(c.bonus_source == "residual" for c in device.cycles) and any(c.root_top for c in device.cycles)
    assert device_reads == 1 + len(device.cycles)
    assert host_reads >= 1 + len(host.cycles) + 2 * drafted


@pytest.mark.parametrize("source", ["eagle", "eagle+lookup", "cost-aware"])
def test_on_a_gpu_the_next_cycle_is_launched_before_the_last_is_traced(target, engines, monkeypatch, source):
    """Where a step returns before the device is done (`steps.queued`), a device cycle's successor is launched
    right after its read, before the host rebuilds its candidates and walk and writes its trace, when the run goes
    on and the next cycle is a device cycle too (no lookup match to merge): launch (L), read (R), the host's books
    (V), trace (T) in the pipelined order, and the traces of the unqueued run (a cost-aware tree's too: its choice,
    made by the books before the last cycle's, is the same where those books moved nothing, as here without a
    clock). Here a CPU's steps are marked queued."""
    from eagleviz.decoding import engine as engine_module

    tree = (TreeConfig.create(source="eagle") if source == "cost-aware" else
            TreeConfig.create(5, 4, 16, adaptive=False, source=source))
    sampling = SamplingConfig(max_new_tokens=32 if source == "eagle" else 48)
    unqueued = engines().generate(PROMPT, tree, sampling)
    events = []
    init, launch, read = StaticSteps.__init__, device_cycle.DeviceCycle.launch, device_cycle.DeviceCycle.read
    verdict = device_cycle.DeviceCycle.verdict
    trace = engine_module.CycleTrace

    def marked(self, *a, **k):
        init(self, *a, **k)
        self.queued = True

    monkeypatch.setattr(StaticSteps, "__init__", marked)
    monkeypatch.setattr(device_cycle.DeviceCycle, "launch", lambda *a, **k: events.append("L") or launch(*a, **k))
    monkeypatch.setattr(device_cycle.DeviceCycle, "read", lambda *a, **k: events.append("R") or read(*a, **k))
    monkeypatch.setattr(device_cycle.DeviceCycle, "verdict", lambda *a, **k: events.append("V") or verdict(*a, **k))
    monkeypatch.setattr(engine_module, "CycleTrace", lambda *a, **k: events.append("T") or trace(*a, **k))
    queued = engine(target, ledger=False).generate(PROMPT, tree, sampling)  # new states: marked queued as made
    cycles = len(queued.cycles)
    assert [fields(c) for c in queued.cycles] == [fields(c) for c in unqueued.cycles]
    if source != "eagle+lookup":
        assert "".join(events) == "L" + "RLVT" * (cycles - 1) + "RVT"  # none launched past the last
    else:  # the cycles that merge a lookup's chain run on the host, launched after the trace before them
        looked = sum(c.lookup_ngram > 0 for c in queued.cycles)
        assert 0 < looked < cycles and events.count("L") == events.count("R") == cycles - looked


def test_a_cost_aware_cycle_launched_ahead_is_chosen_and_rested_by_the_books_before_the_last_cycles(target,
                                                                                                      monkeypatch):
    """On a GPU a cost-aware tree's next cycle is launched at the last one's read, before that cycle's books are
    kept: it chooses by the policy in force when the last cycle began (the run's own acceptance has moved the
    values since: the lag is real), and a rest those books impose starts a cycle later. Greedy, every token is
    still plain decoding's. The books are the cycles' logic here, not the wall clock: each cycle wins its ledger,
    the prices stay as listed, no plain step is timed, so a head rests after a cycle none of whose nodes was worth
    verifying (`HeadRest`)."""
    from eagleviz.decoding.costs import RunCosts
    from eagleviz.decoding.policy import Ledger

    monkeypatch.setattr(Ledger, "observe", lambda self, *a, **k: True)
    monkeypatch.setattr(Ledger, "losing", lambda self: False)
    monkeypatch.setattr(Ledger, "wants_reference", lambda self: False)
    monkeypatch.setattr(RunCosts, "observe", lambda self, *a: False)
    entered = []  # each drafted cycle's: the cycle launched ahead of it (or None) and the policy in force
    on_device = Engine._on_device
    monkeypatch.setattr(Engine, "_on_device", lambda self, r, p: entered.append((r.queued, r.policy)) or
                        on_device(self, r, p))
    init = StaticSteps.__init__

    def marked(self, *a, **k):
        init(self, *a, **k)
        self.queued = True

    tree, sampling = TreeConfig.create(source="eagle"), SamplingConfig(max_new_tokens=32)
    engines = {False: engine(target, "eagle1", 2, 0.05, device_cycle=True)}   # ... and one whose states are made
    plain = engines[False].generate(PROMPT, None, sampling)                   # marked queued (its pool's own)

    def run(queued: bool, **policy):
        entered.clear()
        monkeypatch.setattr(StaticSteps, "__init__", marked if queued else init)
        if queued not in engines:
            engines[queued] = engine(target, "eagle1", 2, 0.05, device_cycle=True)
        out = engines[queued].with_policy(**policy).generate(PROMPT, tree, sampling)
        assert [o.token for o in out.output] == [o.token for o in plain.output]
        assert any(launched is not None for launched, _ in entered) == queued
        return out, list(entered)

    # the values, moved by the run's acceptance after every cycle here
    _, launches = run(True, calibration=HeadCalibration(TABLE, TABLE))
    ahead = [k for k, (launched, _) in enumerate(launches) if launched is not None]
    assert len(ahead) > 10 and 0 not in ahead
    assert all(launches[k][0].policy is launches[k - 1][1] for k in ahead)  # the policy before the last books
    assert all(launches[k][1] is not launches[k - 1][1] for k in ahead)  # ... which moved it since
    # the rests: on a CPU's curve many draftings are not worth verifying
    steep = {"costs": STEEP, "calibration": HeadCalibration(TABLE, TABLE)}
    unqueued, queued = run(False, **steep)[0], run(True, **steep)
    resting = [[c.index for c in r.cycles if "The head rests" in c.decision] for r in (unqueued, queued[0])]
    assert resting[0] and resting[1] and resting[0] != resting[1]
    drafted = [c.index for c in queued[0].cycles if c.draft_levels > 0]
    assert [c.index for c in queued[0].cycles if c.draft_levels > 0 and len(c.tokens) == 1]  # (rests' cause)
    for j in resting[1]:  # a rest's first cycle follows two drafted ones, the second launched ahead of the books
        if j - 1 in drafted:  # that imposed the rest
            k = drafted.index(j - 1)
            assert k > 0 and drafted[k - 1] == j - 2 and queued[1][k][0] is not None


def test_a_verification_captured_over_one_drafter_is_never_replayed_for_another(engines):
    """The target's state keeps a drafted cycle's captured verification under the drafter's serial and the tree's
    shape: a freed drafter's `id` can be a new one's (of another tree), whose drafting the old capture would read
    with the old shape (a random-weights run on a GPU kept nodes out of order: "parents[1] = 6")."""
    import gc

    e = engines()
    tree, other = TREES[0], TreeConfig.create(3, 2, 4, adaptive=False, source="eagle")
    made = DeviceDrafter(e, 64, tree, Recording())
    first = made.serial
    del made
    gc.collect()
    again = [DeviceDrafter(e, 64, other, Recording()) for _ in range(8)]  # one may well sit where the first did
    assert len({d.serial for d in again} | {first}) == 9
    state = StaticSteps(e.target, 128, e.attn_impl, None, Recording())
    keys = [device_cycle.DeviceCycle(state, d, other).key(4, 3) for d in again]
    assert [key[:3] for key in keys] == [(d.serial, other.topk, other.steps) for d in again]


def test_a_device_selection_that_is_not_a_tree_is_a_mismatch_not_a_crash(engines, monkeypatch):
    """The host's books check the device's kept nodes before building the tree from them: nodes out of
    verification order (a child before its parent) end the run with `DeviceVerdictMismatch`, naming them."""
    reverse_kept(monkeypatch)
    with pytest.raises(device_cycle.DeviceVerdictMismatch, match="not a tree in verification order") as raised:
        engines().generate(PROMPT, TREES[0], SamplingConfig(max_new_tokens=16))
    evidence = raised.value.evidence  # the device's choice replayed on a CPU from the drafting it read: the true one
    assert evidence["cpu_kept"] == evidence["kept"][::-1] and "evidence_error" not in evidence


def test_a_cost_aware_mismatchs_evidence_replays_the_choice_on_a_cpu(engines, monkeypatch):
    """A cost-aware tree's mismatch carries the block its policy writes and a CPU's choice from it and from the
    drafting as read: the device's own choice where the device is right (here its kept nodes scrambled after the
    read), and the device's block the same numbers."""
    reverse_kept(monkeypatch)
    table = {"calibration": HeadCalibration(TABLE, TABLE)}
    with pytest.raises(device_cycle.DeviceVerdictMismatch, match="a CPU's choice") as raised:
        engines().with_policy(**table).generate(PROMPT, TreeConfig.create(source="eagle"),
                                                SamplingConfig(max_new_tokens=40))
    evidence = raised.value.evidence
    assert evidence["block_on_device_equal"] and "evidence_error" not in evidence
    assert evidence["cpu_kept"] == evidence["kept"][::-1]


def test_a_record_that_holds_no_cycle_is_a_mismatch_not_an_index_error(engines, monkeypatch):
    """A record the device never wrote (zeros: no slot accepted, not even the root) ends the run with
    `DeviceVerdictMismatch` saying what it held, before anything indexes its lists (an H200 run's IndexError)."""
    parse = device_cycle.parse
    monkeypatch.setattr(device_cycle, "parse", lambda flat, shape, m: parse([0.0] * len(flat), shape, m))
    with pytest.raises(device_cycle.DeviceVerdictMismatch, match="holds no cycle: 0 slots accepted") as raised:
        engines().generate(PROMPT, TreeConfig.create(5, 4, 16, adaptive=False), SamplingConfig(max_new_tokens=16))
    evidence = raised.value.evidence  # the record as read (here the values, not what parse was made to see), and
    # whether a capture had fallen back (none here)
    assert evidence["fallbacks"] == ["", ""] and evidence["m"] == 15 and len(evidence["record"]) > 3 * 15


class _Outside(Ops):
    """`test_static.Ops` (the operations that do work) counting only outside the graphs' replays: the host's own
    launches, copies and reads, which a GPU runs eagerly between its two replays."""

    def __init__(self):
        super().__init__()
        self.replaying = False

    @property
    def count(self) -> int:
        return sum(self.work.values()) + self.items

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.replaying:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class _Marking(Recording):
    """`Recording` whose replays tell `_Outside` that they are the graph's work."""

    def __init__(self, outside: _Outside):
        super().__init__()
        self.outside = outside

    def capture(self, fn):
        replay = super().capture(fn)

        def marked():
            self.outside.replaying = True
            try:
                return replay()
            finally:
                self.outside.replaying = False

        return marked


def test_a_drafted_cycle_outside_its_replays_runs_a_few_operations_for_any_tree(target):
    """Outside its two replays a drafted cycle runs a few operations (the inputs' staging and copies, the record's
    read, the trace's mask unpacked from bits 62 columns at a time, a sampled cycle's uniforms drawn and copied):
    13-20 for 3 levels of 2 children or 6 of 8, fixed or cost-aware, greedy or sampled, so nothing per candidate,
    per slot, per level or per node of the walk runs eagerly (on a GPU, a kernel or a host operation each, outside a
    graph). A 64-slot tree's trace mask was a Python loop of ~130 operations."""
    outside = _Outside()
    e = engine(target, device_cycle=True, ledger=False)
    e.make_graphs = lambda: _Marking(outside)
    greedy, sampled = SamplingConfig(max_new_tokens=16), SamplingConfig(max_new_tokens=16, temperature=1.0)
    ids = e.encode_prompt(PROMPT)
    trees = {"3/2/4": (TREES[1], greedy), "6/8/64": (TREES[2], greedy),
             "cost-aware": (TreeConfig.create(source="eagle"), greedy),
             "cost-aware-sampled": (TreeConfig.create(source="eagle"), sampled)}  # (each `prepare` ~10 s here)
    per_cycle = {}
    for name, (tree, sampling) in trees.items():
        e.prepare(kv_slots(len(ids), 16, tree), tree, sampling)
        run = e.new_run(PROMPT, ids, tree, sampling)
        counts = []
        with outside:
            for cycle in e.speculate(ids, tree, sampling, run):
                counts.append((outside.count, cycle.draft_levels > 0))
        drafted = [now - before for (before, _), (now, was) in zip(counts, counts[1:]) if was]
        assert len(drafted) >= 3, name
        per_cycle[name] = sorted(set(drafted))
    print(f"operations outside the replays, a drafted cycle: {per_cycle}")
    assert max(max(counts) for counts in per_cycle.values()) <= 25
