"""eagleviz/decoding/engine.py on tiny random models: greedy speculation equals greedy decoding exactly (fp32), sampling
reproduces the target distribution, and every cycle's trace is internally consistent."""

import dataclasses
import itertools
import os
import types

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.costs import CostModel, Prices
from eagleviz.decoding.engine import PHASES, REFERENCE_NOTE, Engine
from eagleviz.errors import UserFacingError
from eagleviz.models.draft import DraftConfig, DraftHead
from eagleviz.decoding.policy import Ledger, TreePolicy
from eagleviz.trace import KVMap, RunTrace
from eagleviz.decoding.verify import sampling_probs
from eagleviz.paths import cache_dir
from kernels import sample_ops
from tiny import CPU_COSTS, tiny_engine, tiny_target

FIXED = [TreeConfig.create(3, 1, 4, adaptive=False), TreeConfig.create(5, 4, 16, adaptive=False),
         TreeConfig.create(6, 8, 64, adaptive=False), TreeConfig.create(1, 3, 4, adaptive=False),
         TreeConfig.create(4, 2, 9, adaptive=False)]
CONFIGS = FIXED + [TreeConfig.create(5, 4, 16), TreeConfig.create(4, 2, 9, source="eagle+lookup"),
                   TreeConfig.create(5, 1, 6, adaptive=False, source="lookup"),
                   TreeConfig.create(3, 4, 12, adaptive=False, source="eagle+lookup")]


def run(engine, ids, tree, sampling):
    trace = engine.new_run("x", ids, tree, sampling)
    list(engine.plain(ids, sampling, trace) if tree is None else engine.speculate(ids, tree, sampling, trace))
    return trace


@pytest.mark.parametrize("model_type,arch", [("llama", "eagle1"), ("qwen2", "eagle1"), ("qwen3", "eagle3"),
                                             ("mistral", "eagle3")])
def test_greedy_speculation_equals_greedy_decoding(model_type, arch):
    for vocab, seed in itertools.product((8, 64), (0, 1)):
        engine = tiny_engine(model_type, arch, seed=seed, vocab=vocab)
        sampling = SamplingConfig(max_new_tokens=40)
        ids = [1, 2, 3, 4, 5][: 2 + seed]
        plain = run(engine, ids, None, sampling).token_ids
        for costs, tree in itertools.chain(((None, t) for t in CONFIGS), ((CPU_COSTS, t) for t in CONFIGS[5:7])):
            spec = run(engine.with_policy(costs=costs), ids, tree, sampling)
            assert spec.token_ids == plain, (vocab, seed, tree, costs)
            check_trace(spec, tree)


def test_the_cost_aware_tree_shrinks_on_a_steep_curve_and_says_why():
    engine = tiny_engine("llama", vocab=64, seed=1)
    engine.ledger = False  # the prices as given: a run's clock would find a tiny model's forwards nearly flat
    tree, sampling = TreeConfig.create(5, 4, 16), SamplingConfig(max_new_tokens=40)
    flat = run(engine, [1, 2, 3], tree, sampling)
    steep = run(engine.with_policy(costs=CPU_COSTS), [1, 2, 3], tree, sampling)
    assert steep.token_ids == flat.token_ids
    size = lambda r: sum(c.num_tree_tokens for c in r.cycles) / len(r.cycles)
    assert size(steep) < size(flat)
    assert any(c.decision for c in steep.cycles) and all(c.expected_accept is not None for c in steep.cycles)
    assert all(1 <= c.draft_levels <= tree.steps for c in steep.cycles if not c.decision.startswith("The head rests"))


def test_a_lost_head_rests_and_decoding_stays_lossless(monkeypatch):
    """Verification so dear that no tree pays: the policy verifies the root alone, then rests the head for 1, 2,
    4 ... cycles; the positions it skipped are encoded when it runs again, and the output is unchanged. Every
    cycle verifies only the root, so the output cannot tell a wrong encoding: the test compares the head's
    draft after each rest with the draft of a fresh run from the same committed tokens, whose head encodes
    them all at once. (On such prices a greedy run would start with the head resting, `TreePolicy.head_pays`:
    held True here, so that the head drafts and the back-off is what rests it.)"""
    monkeypatch.setattr(TreePolicy, "head_pays", lambda self, *a: True)
    dear = CostModel(verify=((1, 1.0), (2, 3.0), (64, 100.0)), draft_level=0.05, overhead=0.05)
    tree, prompt = TreeConfig.create(4, 2, 8), [1, 2, 3]
    for model_type, arch in (("llama", "eagle1"), ("qwen3", "eagle3")):
        engine = tiny_engine(model_type, arch, vocab=64, seed=2).with_policy(costs=dear)
        sampling = SamplingConfig(max_new_tokens=40)
        plain = run(engine, prompt, None, sampling).token_ids
        spec = run(engine, prompt, tree, sampling)
        assert spec.token_ids == plain
        rests = [c.decision.startswith("The head rests") for c in spec.cycles]
        assert all(c.draft_levels == 0 and c.kv_draft.appended == [] for c, r in zip(spec.cycles, rests) if r)
        assert all(c.num_tree_tokens == 1 for c in spec.cycles)
        after = [c for c, r, before in zip(spec.cycles[1:], rests[1:], rests) if before and not r]
        assert len(after) >= 2, "the head should rest and run again more than once in 40 tokens"
        for c in after:
            committed = c.kv_target.before - len(prompt)  # new tokens in the target's cache; the next is the root
            fresh = run(engine, prompt + spec.token_ids[:committed],
                        tree, SamplingConfig(max_new_tokens=sampling.max_new_tokens - committed)).cycles[0]
            assert fresh.tokens[0] == c.tokens[0] and c.draft_levels >= 1
            assert [(n.parent, n.token) for n in c.nodes] == [(n.parent, n.token) for n in fresh.nodes]
            assert [n.prob for n in c.nodes] == pytest.approx([n.prob for n in fresh.nodes], abs=1e-5)


def test_a_head_whose_cycles_take_longer_than_they_bring_rests_at_any_temperature(monkeypatch):
    """Verification nearly free but drafting dear (5 plain steps a cycle) and a head that guesses at random: sampled,
    its cycles are expected to lose to the same cycles without it, so it rests; greedy, on prices whose average
    guess pays (`TreePolicy.head_pays` held True) the forecast keeps its nodes once drafted, but the run's clock
    (`Ledger`) sees a drafted cycle take longer than the resting cycle it timed while committing about as many
    tokens, so it rests there too (and writes plain decoding's tokens). Sampled, and greedy on these prices as
    they are, the run starts with the head resting (`Ledger.doubt`): its first 150 cycles are plain steps (the
    first of them the clock's reference), then a probe."""
    pricey = CostModel(verify=((1, 1.0), (64, 1.3)), draft_level=0.05, overhead=0.05, draft_fixed=5.0)
    engine = tiny_engine("llama", vocab=64, seed=2).with_policy(costs=pricey)
    tree, prompt = TreeConfig.create(4, 2, 8), [1, 2, 3]
    assert not engine.policy(tree, SamplingConfig()).head_pays(tree.topk, tree.steps, tree.draft_tokens - 1)
    greedy = run(engine, prompt, tree, SamplingConfig(max_new_tokens=40))
    assert all("a run starts without it" in c.decision and c.draft_levels == 0 for c in greedy.cycles)
    assert greedy.token_ids == run(engine, prompt, None, SamplingConfig(max_new_tokens=40)).token_ids
    monkeypatch.setattr(TreePolicy, "head_pays", lambda self, *a: True)
    for temperature in (0.0, 1.0):
        # greedy, 96 tokens: the clock judges by what the cycles take, which a loaded machine blurs over a short run
        sampling = SamplingConfig(temperature=temperature, max_new_tokens=96 if temperature == 0 else 200)
        spec = run(engine, prompt, tree, sampling)
        unpaid = sum(c.decision.startswith("The head rests (its guesses did not pay") for c in spec.cycles)
        timed = [c.index for c in spec.cycles if c.decision == REFERENCE_NOTE]
        assert unpaid > 0, temperature
        if temperature == 0:
            assert timed[:1] == [1] and spec.cycles[0].draft_levels > 0
            assert spec.token_ids == run(engine, prompt, None, sampling).token_ids
        else:
            doubt = [c.index for c in spec.cycles if "a run starts without it" in c.decision]
            assert timed == [] and doubt == list(range(150)) and spec.cycles[150].draft_levels > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_resting_cycle_is_a_plain_step_through_the_same_calls(monkeypatch, temperature):
    """A head that always rests: each cycle makes plain decoding's calls (one forward of one token, one read-out)
    and no drafting's (no tree grown, no acceptance), so its tokens are plain decoding's at any temperature (the
    same draws from the same generator), and its trace shows the target's argmax and, sampled, that token's
    probability (greedy, none: plain decoding reads the argmax alone)."""
    from eagleviz.decoding import engine as engine_module
    from eagleviz.decoding.policy import HeadRest

    engine = tiny_engine("llama", vocab=64, seed=4)
    calls: dict[str, list] = {}
    for name in ("_read_out", "_accept", "_accept_root"):
        def counted(self, *a, _name=name, _f=getattr(engine_module.Engine, name), **k):
            calls.setdefault(_name, []).append(a[0].shape)
            return _f(self, *a, **k)
        monkeypatch.setattr(engine_module.Engine, name, counted)
    grown = []
    monkeypatch.setattr(engine_module, "grow", lambda *a, **k: grown.append(1))
    monkeypatch.setattr(HeadRest, "head_runs", lambda self: False)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=30, seed=7)
    plain = run(engine, [1, 2, 3], None, sampling)
    plain_calls, calls = calls, {}
    spec = run(engine, [1, 2, 3], TreeConfig.create(source="eagle"), sampling)
    assert spec.token_ids == plain.token_ids and not grown and set(calls) == set(plain_calls) == {"_read_out"}
    assert len(calls["_read_out"]) == len(plain_calls["_read_out"]) == 30  # the prefill's, then one a token
    for c in spec.cycles:
        assert c.tokens == [c.tokens[0]] and c.path == [0] and c.draft_levels == 0 and c.kv_draft.appended == []
        assert c.kv_target == KVMap(before=c.positions[0], appended=c.positions, moves=[], after=c.positions[0] + 1)
    # the trace's argmax and probability, from the logits of a fresh target pass over the same tokens
    ids = [1, 2, 3] + spec.token_ids
    logits = engine.target.forward(torch.tensor(ids), torch.arange(len(ids)), engine.target.new_cache(len(ids)),
                                   torch.ones(len(ids), len(ids), dtype=torch.bool).tril()).logits
    for c in spec.cycles:
        row = logits[c.positions[0]] / (1.0 if temperature == 0 else temperature)
        assert c.target_tokens == [int(row.argmax())]
        if temperature == 0:
            assert c.target_probs == [None]
        else:
            assert c.target_probs == pytest.approx([float(torch.softmax(row.double(), -1).max())], rel=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_resting_cycles_run_as_a_stretch_of_plain_steps_and_trace_as_one_at_a_time(monkeypatch, temperature):
    """On a CPU the cycles after a resting one that rest too (the head and the lookups resting on: nothing to
    decide) run as plain decoding's loop, up to REST_BATCH forwards back to back, their traces written after the
    last and handed back (Y) after the last trace, so what the caller runs between two yields (another model's
    forward, in `bench --lockstep`) finds no trace left to write: the same cycles, tokens, decisions, reads and
    caches as one cycle at a time (`rest_batch` 1)."""
    from eagleviz.decoding import engine as engine_module
    from eagleviz.models.static import EagerSteps

    monkeypatch.setattr(Ledger, "for_run", classmethod(  # rest from the start
        lambda cls, greedy, pays=True, lookups=False, gpu=False: cls(doubt=True, lookups=lookups)))
    engine = tiny_engine("llama", vocab=64, seed=4)
    sampling, tree = SamplingConfig(temperature=temperature, max_new_tokens=50, seed=7), TreeConfig.create()
    events = []
    forward, write = EagerSteps.forward, engine_module.Engine._rest_trace
    monkeypatch.setattr(EagerSteps, "forward", lambda *a, **k: events.append("F") or forward(*a, **k))
    monkeypatch.setattr(engine_module.Engine, "_rest_trace",
                        staticmethod(lambda *a, **k: events.append("T") or write(*a, **k)))
    batched = engine.new_run("x", [1, 2, 3], tree, sampling)
    for _ in engine.speculate([1, 2, 3], tree, sampling, batched):
        events.append("Y")
    batch, stretches = engine_module.REST_BATCH, [len(list(g)) for k, g in itertools.groupby(events)]
    assert events[:3 * batch] == ["F"] * batch + ["T"] * batch + ["Y"] * batch  # forwards, traces, cycles
    assert stretches[:9] == [batch] * 9
    events.clear()
    single = engine.new_run("x", [1, 2, 3], tree, sampling)
    list(engine.speculate([1, 2, 3], tree, sampling, single, rest_batch=1))
    assert events[:4] == ["F", "T", "F", "T"]
    assert batched.token_ids == single.token_ids == run(engine, [1, 2, 3], None, sampling).token_ids
    assert len(batched.cycles) == len(single.cycles) == 49  # and the prefill's token
    for a, b in zip(batched.cycles, single.cycles):
        assert (a.index, a.tokens, a.positions, a.target_tokens, a.target_probs, a.committed, a.kv_target, a.kv_draft,
                a.decision) == (b.index, b.tokens, b.positions, b.target_tokens, b.target_probs, b.committed,
                                b.kv_target, b.kv_draft, b.decision)
        assert set(a.timings_ms) == set(PHASES) and a.timings_ms["verify"] > 0


def test_while_the_lookups_look_resting_cycles_run_as_stretches_that_end_before_a_match_worth_verifying(monkeypatch):
    """Greedy with the head resting and the context's lookups looking, on a CPU's steep prices (verifying a second
    token costs 0.30 plain steps, so a short match is passed over and a long one verified): the resting cycles
    between two lookup cycles run as stretches of plain steps too, each step's token indexed and the next cycle's
    match looked up as that cycle would, a stretch ending before a cycle whose match is worth verifying. The same
    cycles, tokens, decisions (the passed-over matches named) and traces as one cycle at a time (`rest_batch` 1),
    where before a run whose lookups looked took every resting cycle alone. The phases' clock is fake, so the
    run's own prices move the same way in both; the lookups' verdict is left out (it reads the wall clock)."""
    from eagleviz.models import host
    from eagleviz.models.static import EagerSteps

    monkeypatch.setattr(Ledger, "for_run", classmethod(
        lambda cls, greedy, pays=True, lookups=False, gpu=False: cls(doubt=not lookups, lookups=lookups)))  # the head rests
    monkeypatch.setattr(Ledger, "LOOKUP_EVIDENCE", 10 ** 6)
    steep = CostModel(verify=((1, 0.97), (2, 1.30), (4, 1.99), (16, 6.39)), draft_level=0.134, overhead=0.143,
                      rest=1.0)
    engine = tiny_engine("llama", vocab=16, seed=0).with_policy(costs=steep)
    ids, tree, sampling = [1, 2, 3, 4] * 3, TreeConfig.create(), SamplingConfig(max_new_tokens=60)
    now, events, forward = [0.0], [], EagerSteps.forward

    def timed(self, tokens, positions, mask):  # 4 ms a token on the phases' clock
        events.append("F")
        now[0] += 0.004 * len(tokens)
        return forward(self, tokens, positions, mask)

    monkeypatch.setattr(EagerSteps, "forward", timed)
    monkeypatch.setattr(host, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    runs = {}
    for batch in (None, 1):
        events.clear()
        runs[batch] = engine.new_run("x", ids, tree, sampling)
        for _ in engine.speculate(ids, tree, sampling, runs[batch], rest_batch=batch):
            events.append("Y")
        runs[batch].events = "".join(events)
    batched, single = runs[None], runs[1]
    kinds = ["lookup" if len(c.tokens) > 1 else "passed" if c.lookup_ngram else "rest" for c in batched.cycles]
    assert {"lookup", "passed", "rest"} <= set(kinds)
    longest = {batch: max(map(len, r.events.split("Y"))) for batch, r in runs.items()}  # forwards in a row
    assert longest[None] >= 4 and longest[1] == 1
    assert batched.token_ids == single.token_ids == run(engine, ids, None, sampling).token_ids
    assert len(batched.cycles) == len(single.cycles)
    for a, b in zip(batched.cycles, single.cycles):
        assert (a.index, a.tokens, a.positions, a.committed, a.kv_target, a.decision, a.lookup_ngram) == (
            b.index, b.tokens, b.positions, b.committed, b.kv_target, b.decision, b.lookup_ngram)
        assert a.timings_ms == pytest.approx(b.timings_ms)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_where_a_step_returns_before_its_kernels_finish_the_next_is_launched_before_the_host_writes_the_last(
        monkeypatch, temperature):
    """On a GPU (`steps.queued`) plain decoding launches its next step before it yields a token, and a stretch of
    resting cycles launches each next step before the cycle before it is traced, so the host's work runs while the
    device computes; no step is launched past the run's last token. Here a CPU's steps are marked queued: the
    order of forwards (F), traces (T) and yielded tokens (Y) is the pipelined one, and the tokens, cycles and
    traces are those of the unqueued run."""
    from eagleviz.decoding import engine as engine_module
    from eagleviz.models.static import EagerSteps

    monkeypatch.setattr(Ledger, "for_run", classmethod(  # rest from the start
        lambda cls, greedy, pays=True, lookups=False, gpu=False: cls(doubt=True, lookups=lookups)))
    engine = tiny_engine("llama", vocab=64, seed=4)
    sampling, tree = SamplingConfig(temperature=temperature, max_new_tokens=50, seed=7), TreeConfig.create()
    events, queued = [], [False]
    init, forward, write = EagerSteps.__init__, EagerSteps.forward, engine_module.Engine._rest_trace

    def marked(self, *a, **k):
        init(self, *a, **k)
        self.queued = queued[0]

    monkeypatch.setattr(EagerSteps, "__init__", marked)
    monkeypatch.setattr(EagerSteps, "forward", lambda *a, **k: events.append("F") or forward(*a, **k))
    monkeypatch.setattr(engine_module.Engine, "_rest_trace",
                        staticmethod(lambda *a, **k: events.append("T") or write(*a, **k)))

    def plain_order():
        events.clear()
        trace = engine.new_run("x", [1, 2, 3], None, sampling)
        for _ in engine.plain([1, 2, 3], sampling, trace):
            events.append("Y")
        return trace, "".join(events)

    def spec_order():
        events.clear()
        return run(engine, [1, 2, 3], tree, sampling), "".join(events)

    (plain, plain_events), (spec, spec_events) = plain_order(), spec_order()
    queued[0] = True
    (plain_q, plain_q_events), (spec_q, spec_q_events) = plain_order(), spec_order()
    assert plain_events.startswith("YFYFY") and plain_q_events.startswith("FYFYF")  # the prefill's token first
    assert plain_q_events.count("F") == plain_events.count("F") == 49 and plain_q_events.endswith("FYY")
    batch = engine_module.REST_BATCH
    stretch = "FF" + "TF" * (batch - 2) + "TT"  # each next step before the trace of the one before
    assert spec_q_events.startswith(stretch * 3) and not spec_events.startswith(stretch)
    assert spec_q_events.count("F") == spec_events.count("F") == spec_q_events.count("T") == 49
    assert plain.token_ids == plain_q.token_ids == spec.token_ids == spec_q.token_ids
    assert plain.stop_reason == plain_q.stop_reason and spec.stop_reason == spec_q.stop_reason
    for a, b in zip(spec.cycles, spec_q.cycles, strict=True):
        assert (a.index, a.tokens, a.positions, a.target_tokens, a.target_probs, a.committed, a.kv_target,
                a.decision) == (b.index, b.tokens, b.positions, b.target_tokens, b.target_probs, b.committed,
                                b.kv_target, b.decision)
        assert set(b.timings_ms) == set(PHASES) and b.timings_ms["verify"] > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_lookup_not_worth_verifying_leaves_the_cycle_a_plain_step(monkeypatch, temperature):
    """Without the head, a cycle whose context's lookup continuation is not worth verifying (the policy's choice
    over that chain, made before growing a tree: on a steep price list a short match's tokens are not) is a plain
    step through `_rest_steps`: no tree grown; its trace names the continuation it passed over. Every cycle that grew
    a tree verified some of the lookup's tokens; greedy, the tokens are plain decoding's."""
    from eagleviz.decoding import engine as engine_module

    steep = CostModel(verify=((1, 1.0), (2, 1.5), (4, 2.0), (8, 3.0), (16, 5.0)), draft_level=0.07, overhead=0.1)
    engine = tiny_engine("llama", vocab=8, seed=2).with_policy(costs=steep)
    engine.ledger = False  # the forecast alone decides (the run's clock would reprice a tiny model's forwards)
    grown, verdicts, rests = [], [], []
    for name, spy in (("grow", grown), ("lookup_worth", verdicts)):
        def spied(*a, _f=getattr(engine_module, name), _spy=spy, **k):
            _spy.append(_f(*a, **k))
            return _spy[-1]
        monkeypatch.setattr(engine_module, name, spied)
    resting = engine_module.Engine._rest_steps

    def counted(*a, **k):
        for row in resting(*a, **k):
            rests.append(row)
            yield row

    monkeypatch.setattr(engine_module.Engine, "_rest_steps", counted)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=60, seed=3)
    prompt = [1, 2, 3, 4] * 4
    plain = run(engine, prompt, None, sampling)
    spec = run(engine, prompt, TreeConfig.create(source="lookup"), sampling)
    assert spec.token_ids == plain.token_ids or temperature > 0  # sampled, a verified lookup draws otherwise
    passed = [c for c in spec.cycles if c.lookup_ngram and len(c.tokens) == 1]
    # asked once for each (n-gram, length, budget) while the policy stays the same
    assert passed and False in verdicts and True in verdicts and len(grown) > 0
    assert len(verdicts) <= len(passed) + len(grown)
    assert len(rests) == len(spec.cycles) - len(grown)
    for c in passed:
        assert c.nodes == [] and "The context's lookup proposed" in c.decision and c.draft_levels == 0
    assert all(len(d.tree) > 1 for d in grown)


def test_lookups_whose_cycles_take_longer_than_they_bring_rest_and_decoding_stays_lossless(monkeypatch):
    """The context's lookups are judged by the run's clock as the head is: where a forward of several tokens
    costs far more than their acceptance brings (here each token beyond the first takes 30 ms more), lookup cycles
    stop once two of them lost together and the resting cycles say why; where a forward costs the same whatever
    its size (10 ms, far above the tiny model's own time and its noise) they are never rested. The tokens are
    plain decoding's either way."""
    import time

    from eagleviz.decoding.engine import LOOKUP_REST_NOTE
    from eagleviz.models.static import EagerSteps

    engine = tiny_engine("llama", vocab=8, seed=0)
    ids, tree = [1, 2, 3, 4] * 4, TreeConfig.create(5, 1, 6, source="lookup")
    sampling = SamplingConfig(max_new_tokens=60)
    plain = run(engine, ids, None, sampling).token_ids
    forward, extra = EagerSteps.forward, [0.0]

    def priced(self, tokens, positions, mask):
        time.sleep(0.01 + extra[0] * (len(tokens) - 1))
        return forward(self, tokens, positions, mask)

    monkeypatch.setattr(EagerSteps, "forward", priced)
    free = run(engine, ids, tree, sampling)
    assert free.token_ids == plain and not any(LOOKUP_REST_NOTE in c.decision for c in free.cycles)
    extra[0] = 0.03
    spec = run(engine, ids, tree, sampling)
    assert spec.token_ids == plain
    looked = [len(c.tokens) > 1 for c in spec.cycles]
    rested = [LOOKUP_REST_NOTE in c.decision for c in spec.cycles]
    first = rested.index(True)
    assert sum(looked[:first]) >= Ledger.LOOKUP_EVIDENCE  # then, each lost cycle worth dozens of plain steps, the
    assert all(rested[first:]) and not any(looked[first:])  # longest rest (Ledger.SPAN[1]) outlasts the run


def test_a_sampled_runs_lookups_start_resting_and_probe_after_their_span():
    """Sampled, the context's lookups start in doubt as the head does (`Ledger.for_run`): on text that repeats
    itself, a greedy run verifies lookup candidates from its first cycles, a sampled one rests them for its first
    150 cycles (no match looked up; the traces say so), then probes."""
    from eagleviz.decoding.engine import LOOKUP_DOUBT_NOTE

    engine = tiny_engine("llama", vocab=8, seed=0)
    ids, tree = [1, 2, 3, 4] * 4, TreeConfig.create(5, 1, 6, source="lookup")
    greedy = run(engine, ids, tree, SamplingConfig(max_new_tokens=40))
    assert any(len(c.tokens) > 1 for c in greedy.cycles[:4])
    assert not any(LOOKUP_DOUBT_NOTE in c.decision for c in greedy.cycles)
    sampled = run(engine, ids, tree, SamplingConfig(temperature=1.0, max_new_tokens=200, seed=1))
    rested = [c.index for c in sampled.cycles if LOOKUP_DOUBT_NOTE in c.decision]
    assert rested[:150] == list(range(150)) and 150 not in rested  # the probe
    assert all(len(c.tokens) == 1 for c in sampled.cycles[:150])


def test_a_run_prices_its_trees_by_its_own_clock_where_the_list_is_off(monkeypatch):
    """A price list that says each token beyond the first costs a third of a one-token forward, on a machine
    where each costs a whole one (the phases' clock sees every token of a forward take 4 ms): the run's clock
    (`RunCosts`) raises the list's prices as it goes (about 3 times), so its trees come near in size to those of
    a run whose list is right (without the clock, twice that), and its tokens are still plain decoding's. The
    clock is all fake, so the sizes are the same each time."""
    from eagleviz.decoding import engine as engine_module
    from eagleviz.decoding.policy import TreePolicy
    from eagleviz.models import host
    from eagleviz.models.static import EagerSteps

    priced: list[CostModel] = []

    @dataclasses.dataclass(frozen=True)
    class Recorded(TreePolicy):
        def __post_init__(self):
            priced.append(self.costs)

    monkeypatch.setattr(engine_module, "TreePolicy", Recorded)
    # the clock's reference cycle gives the unit; its verdict on the head is left out (it would rest the head)
    monkeypatch.setattr(Ledger, "EVIDENCE", 10 ** 6)
    monkeypatch.setattr(Ledger, "LOOKUP_EVIDENCE", 10 ** 6)
    forward = EagerSteps.forward

    now = [0.0]  # the phases' clock: it moves only in the target's forwards, 4 ms a token (no noise of its own)

    def dear(self, tokens, positions, mask):
        out = forward(self, tokens, positions, mask)
        now[0] += 0.004 * len(tokens)
        return out

    monkeypatch.setattr(EagerSteps, "forward", dear)
    monkeypatch.setattr(host, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    ids, tree, sampling = [1, 2, 3], TreeConfig.create(4, 2, 12), SamplingConfig(max_new_tokens=60)
    off = CostModel(verify=((1, 1.0), (64, 22.0)), draft_level=0.01, overhead=0.01)
    right = CostModel(verify=((1, 1.0), (64, 64.0)), draft_level=0.01, overhead=0.01)
    sizes = []
    for listed, clocked in ((off, True), (off, False), (right, False)):  # the run's clock on or off (`ledger`)
        engine = tiny_engine("llama", vocab=8, seed=0).with_policy(costs=listed)
        engine.ledger = clocked
        priced.clear()
        spec = run(engine, ids, tree, sampling)
        assert spec.token_ids == run(engine, ids, None, sampling).token_ids
        sizes.append(sum(len(c.tokens) for c in spec.cycles[5:]) / len(spec.cycles[5:]))
        if not sizes[1:]:
            assert priced[-1].verify_cost(9) - 1 > 1.5 * (listed.verify_cost(9) - 1)
    repriced, as_listed, right_list = sizes  # ~1.7, 3.3 and 1.5 tokens a cycle
    assert repriced < 0.6 * as_listed and repriced < 1.3 * right_list, sizes


def test_lookup_candidates_are_verified_and_accepted_on_repetitive_text():
    """A context that repeats itself: lookup nodes enter the tree marked as such, and some are accepted."""
    engine = tiny_engine("llama", vocab=8, seed=0)
    ids = [1, 2, 3, 4] * 4
    spec = run(engine, ids, TreeConfig.create(5, 1, 6, adaptive=False, source="lookup"), SamplingConfig(max_new_tokens=40))
    assert spec.token_ids == run(engine, ids, None, SamplingConfig(max_new_tokens=40)).token_ids
    nodes = [n for c in spec.cycles for n in c.nodes]
    assert nodes and all(n.source == "lookup" and not n.expanded for n in nodes)
    assert all(c.draft_levels == 0 and c.kv_draft.appended == [] for c in spec.cycles)
    assert sum(c.accept_length for c in spec.cycles) > 0
    both = run(engine, ids, TreeConfig.create(3, 2, 8, adaptive=False, source="eagle+lookup"),
               SamplingConfig(max_new_tokens=40))
    assert {"eagle", "lookup"} <= {n.source for c in both.cycles for n in c.nodes} | {"eagle"}
    assert any(n.source in ("lookup", "both") for c in both.cycles for n in c.nodes)


def test_deep_accepts_happen_with_a_small_vocabulary():
    """With 8 tokens and topk 4 the random head covers half the vocabulary: long paths get accepted, so the
    losslessness above is exercised on multi-token commits, not only on bonus tokens."""
    engine = tiny_engine("llama", vocab=8)
    spec = run(engine, [1, 2, 3], TreeConfig.create(6, 4, 64, adaptive=False), SamplingConfig(max_new_tokens=60))
    assert max(spec.summary()["accept_lengths"]) >= 3


def check_trace(trace: RunTrace, tree: TreeConfig):
    emitted = [t.token for t in trace.output]
    pos = 1
    for c in trace.cycles:
        assert len(c.tokens) <= tree.draft_tokens
        assert c.accept_length == len(c.path) - 1
        assert c.committed == [c.tokens[s] for s in c.path[1:]] + [c.bonus_token]
        assert emitted[pos:pos + len(c.committed)] == c.committed[: len(emitted) - pos]
        pos += len(c.committed)
        assert c.kv_target.after == c.kv_target.before + c.accept_length + 1
        assert len(c.kv_target.appended) == len(c.tokens)
        assert c.positions == [c.kv_target.before + sum(row) - 1 for row in c.mask]
        assert all(c.parents[b] == a for a, b in zip(c.path, c.path[1:]))
        kept = [n for n in c.nodes if n.kept]
        assert len(kept) == len(c.tokens) - 1 and sorted(n.slot for n in kept) == list(range(1, len(c.tokens)))
        expanded = sum(n.expanded for n in c.nodes)
        if tree.source == "lookup":
            assert expanded == 0 and c.draft_levels == 0
        elif not tree.adaptive:
            assert expanded == (tree.steps - 1) * tree.topk or len(c.nodes) < tree.topk
            assert len(c.tokens) == min(tree.draft_tokens, len(c.nodes) + 1) or trace.stop_reason == "context"
        elif c.draft_levels == 0:  # a resting cycle (the run's reference plain step, or a head that did not pay)
            assert expanded == 0 and c.decision.startswith("The head rests")
        else:
            assert expanded == (c.draft_levels - 1) * tree.topk and 1 <= c.draft_levels <= tree.steps
        assert c.expected_accept is not None and 0.0 <= c.expected_accept <= len(c.tokens) - 1
        assert all(n.value is not None and (n.parent < 0 or n.value <= by_id(c)[n.parent].value + 1e-12)
                   for n in c.nodes)
        if tree.is_chain and tree.source == "eagle":
            assert c.parents == list(range(-1, len(c.tokens) - 1))
        for check in c.checks:
            assert check.accepted == (check.slot in c.path)
    assert pos >= len(emitted)


def by_id(cycle):
    return {n.id: n for n in cycle.nodes}


def exact_joint(target, prompt, n, temperature, top_p):
    """Exact P(x1..xn | prompt) under the sampling distribution, by brute force through the HF model: row b of
    the batch is prompt + prefix_b (every prefix of length n - 1); its offset k gives P(x_k+1 | x_1..x_k)."""
    v = target.vocab_size
    prefixes = list(itertools.product(range(v), repeat=n - 1))
    with torch.no_grad():
        logits = target.hf(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, len(prompt) - 1:]
    probs = sampling_probs(logits.float(), temperature, top_p).numpy()
    joint = np.zeros((v,) * n)
    for b, prefix in enumerate(prefixes):
        for last in range(v):
            xs = prefix + (last,)
            joint[xs] = np.prod([probs[b, k, xs[k]] for k in range(n)])
    return joint


SAMPLED = [(1.0, 1.0, TreeConfig.create(3, 2, 7, adaptive=False)),
           (0.7, 0.9, TreeConfig.create(3, 2, 7, source="eagle+lookup"))]  # the policy (steep costs), lookup nodes
SAMPLED_IDS = ["T1-fixed", "T0.7-top-p-cost-aware-lookup"]


def sampled_counts(temperature, top_p, tree, runs):
    """The first n = 3 tokens of `runs` seeded speculative runs on a 6-token tiny model, counted by outcome (6, 6, 6),
    with the exact joint distribution they should follow (`exact_joint`). Asserts the runs accepted drafts."""
    engine = tiny_engine("llama", vocab=6, layers=2, scale=3.0)
    if tree.adaptive:  # the forecast alone decides: the run's clock would start a sampled run resting
        engine = engine.with_policy(costs=CPU_COSTS)
        engine.ledger = False
    prompt, n = [1, 2, 3, 1, 2], 3
    counts = np.zeros((6,) * n)
    accepted = 0
    for seed in range(runs):
        trace = run(engine, prompt, tree, SamplingConfig(temperature, top_p, max_new_tokens=n, seed=seed))
        counts[tuple(trace.token_ids[:n])] += 1
        accepted += sum(c.accept_length for c in trace.cycles)
    assert accepted > runs * 0.2, "too few accepted drafts for the test to exercise speculation"
    return counts, lambda t: exact_joint(engine.target, prompt, n, t, top_p)


def agreement(counts, joint) -> float:
    """Chi-square p-value of `counts` against the distribution `joint`, over the outcomes expected 5 times or more;
    the rare ones together must stay within 3 times what they expect."""
    expected = joint * counts.sum()
    keep = expected >= 5
    assert counts[~keep].sum() <= max(20, 3 * expected[~keep].sum())
    obs, exp = counts[keep], expected[keep]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def skip_held_to_avx2():
    if os.environ.get("EAGLEVIZ_CPU") == "avx2":
        pytest.skip("held to AVX2 the draws are bitwise the PyTorch reference's and the engine's tokens those of "
                    "PyTorch's sampling (tests/test_sample_ops.py); this distribution is checked in the native pass")


def audit_sampled_run(target, prompt, trace, temperature, top_p) -> int:
    """Walks every cycle of a sampled run against the target's exact distributions, each recomputed by a causal
    forward of the committed text and the accepted path (no cache, no tree): each tried draft token's p is its
    probability under the residual its rejected elder siblings leave (zeroed, renormalised), it is accepted iff
    its uniform < p, the walk goes on from the accepted child only, and the bonus token has mass where it was
    drawn (the last residual after a rejection, else the target's own distribution). Returns the checks audited."""
    def probs(prefix):
        with torch.no_grad():
            return sampling_probs(target.hf(torch.tensor([prefix])).logits[0, -1].float(), temperature, top_p)

    context = list(prompt)
    assert probs(context)[trace.token_ids[0]] > 0  # the prefill's token
    context.append(trace.token_ids[0])
    audited = 0
    for c in trace.cycles:
        prefix, cur, p, rejected = list(context), 0, probs(context), False
        for check in c.checks:
            assert c.parents[check.slot] == cur, "a token tried off the accepted path"
            assert check.p == pytest.approx(float(p[check.token]), abs=1e-5), (c.index, check.slot)
            assert check.accepted == (check.uniform < check.p) and check.accept_prob == check.p
            audited += 1
            if check.accepted:
                prefix.append(check.token)
                cur, p, rejected = check.slot, probs(prefix), False
                continue
            residual = p.clone()
            residual[check.token] = 0.0
            if float(residual.sum()) > 0:
                p, rejected = residual / residual.sum(), True
        assert c.path[-1] == cur and c.committed == prefix[len(context):] + [c.bonus_token]
        assert c.bonus_source == ("residual" if rejected else "target") and float(p[c.bonus_token]) > 0
        context += c.committed
    assert context[len(prompt):][:len(trace.token_ids)] == trace.token_ids  # the last cycle's tail is cut
    return audited


@pytest.mark.parametrize("temperature,top_p,tree", SAMPLED, ids=SAMPLED_IDS)
def test_every_sampled_verdict_follows_the_rule_on_the_targets_exact_distribution(temperature, top_p, tree):
    """The default run's check of the sampling rule, decision by decision (`audit_sampled_run`) over 40 seeded runs
    of 24 tokens: a wrong p (temperature, top-p, a residual not renormalised, a stale position), a wrong comparison
    or a walk off the accepted path fails it at once. With the draws held bit for bit by tests/test_sample_ops.py
    and their law by tests/test_verify.py, it stands for the 20,000-run distribution test (`-m slow`)."""
    engine = tiny_engine("llama", vocab=6, layers=2, scale=3.0)
    if tree.adaptive:
        engine = engine.with_policy(costs=CPU_COSTS)
        engine.ledger = False
    prompt = [1, 2, 3, 1, 2]
    audited = rejected = 0
    for seed in range(40):
        trace = run(engine, prompt, tree, SamplingConfig(temperature, top_p, max_new_tokens=24, seed=seed))
        audited += audit_sampled_run(engine.target, prompt, trace, temperature, top_p)
        rejected += sum(not check.accepted for c in trace.cycles for check in c.checks)
    assert audited > 200 and rejected > 50  # accepted and rejected drafts alike were checked


@pytest.mark.parametrize("temperature,top_p,tree", SAMPLED, ids=SAMPLED_IDS)
@pytest.mark.usefixtures("one_thread")
def test_speculative_sampling_matches_target_distribution(temperature, top_p, tree):
    """3,000 runs, three tokens each, against the exact joint distribution: the whole loop (seeds, caches, the
    draws themselves) in the default run. The 20,000-run version (`-m slow`) resolves differences 2.6 times
    smaller; the audit above catches a wrong rule outright."""
    skip_held_to_avx2()
    counts, joint = sampled_counts(temperature, top_p, tree, runs=3_000)
    assert agreement(counts, joint(temperature)) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,tree", SAMPLED, ids=SAMPLED_IDS)
@pytest.mark.usefixtures("one_thread")
def test_speculative_sampling_matches_target_distribution_over_20000_runs(temperature, top_p, tree):
    skip_held_to_avx2()  # 20,000 runs each, 3-7 minutes on a 2-core machine
    counts, joint = sampled_counts(temperature, top_p, tree, runs=20_000)
    assert agreement(counts, joint(temperature)) > 1e-3


def test_trace_json_round_trip():
    engine = tiny_engine("llama", vocab=8)
    trace = run(engine, [1, 2], TreeConfig.create(4, 3, 10), SamplingConfig(0.8, 0.95, max_new_tokens=20, seed=3))
    back = RunTrace.from_json(trace.to_json())
    assert back.to_dict() == RunTrace.from_json(back.to_json()).to_dict()
    assert back.token_ids == trace.token_ids and len(back.cycles) == len(trace.cycles)
    assert back.cycles[0].kv_target.moves == trace.cycles[0].kv_target.moves
    assert back.kv_dtype == str(engine.target.kv_dtype).removeprefix("torch.")
    assert back.cpu_layer == ("compiled" if engine.target.ops is not None else "torch")
    older = {k: v for k, v in trace.to_dict().items() if k not in ("kv_dtype", "cpu_layer", "notes")}
    assert RunTrace.from_dict(older).kv_dtype == ""  # traces written before these fields still load
    assert RunTrace.from_dict(older).notes == []
    with pytest.raises(ValueError, match="schema"):
        RunTrace.from_dict(trace.to_dict() | {"schema_version": 99})
    with pytest.raises(ValueError, match="unknown"):
        RunTrace.from_dict(trace.to_dict() | {"evil": 1})


def test_stops_at_eos_and_at_max_new_tokens():
    engine = tiny_engine("llama", vocab=8)
    sampling = SamplingConfig(max_new_tokens=25)
    plain = run(engine, [1, 2, 3], None, sampling).token_ids
    assert len(plain) == 25
    eos = plain[7]
    engine.target.eos_token_ids = frozenset({eos})
    spec = run(engine, [1, 2, 3], TreeConfig.create(5, 4, 16), sampling)
    assert spec.token_ids == plain[: plain.index(eos) + 1] and spec.stop_reason == "eos"


def test_prompt_over_context_limit_is_a_clear_error_before_any_price_list_is_measured():
    """The refusal comes first: a cost-aware tree whose price list is still to be measured (tens of seconds on a
    CPU without weight blocks) does not measure it for a prompt it refuses."""
    engine = tiny_engine("llama")
    engine.prices = Prices(lambda: pytest.fail("a price list was measured for a prompt over the context limit"))
    with pytest.raises(UserFacingError, match="context limit"):
        run(engine, [1] * 300, TreeConfig(), SamplingConfig())


def test_reduced_draft_vocabulary_maps_to_target_ids():
    target = tiny_target(vocab=16)
    head = DraftHead(DraftConfig.for_target(target, "eagle3", draft_vocab_size=4)).eval()
    head.d2t.copy_(torch.tensor([3, 6, 9, 12]) - torch.arange(4))
    from eagleviz.decoding.engine import Engine

    engine = Engine(target, head, "vd4")
    trace = run(engine, [1, 2], TreeConfig.create(3, 2, 7, source="eagle"), SamplingConfig(max_new_tokens=12))
    assert all(n.token in (3, 6, 9, 12) for c in trace.cycles for n in c.nodes)  # the head's nodes only
    assert trace.token_ids == run(engine, [1, 2], None, SamplingConfig(max_new_tokens=12)).token_ids


@pytest.mark.triton
def test_greedy_lossless_with_the_triton_kernel_in_the_interpreter():
    """The Triton tree-attention kernel (TRITON_INTERPRET=1, see conftest) serves prefill, drafting and
    verification, and the trace records which implementation ran."""
    from eagleviz.decoding.engine import Engine

    ref = tiny_engine("llama", vocab=8, layers=2)
    engine = Engine(ref.target, ref.head, "random", attn_impl="triton")
    sampling = SamplingConfig(max_new_tokens=10)
    spec = run(engine, [1, 2, 3], TreeConfig.create(3, 2, 6), sampling)
    assert spec.attn_impl == "triton"
    assert spec.token_ids == run(ref, [1, 2, 3], None, sampling).token_ids


def test_greedy_verification_takes_the_argmax_of_the_logits():
    """Two logits one float step apart have the same softmax probability in fp32: the target's choice must be
    the larger logit, as plain decoding's `logits.argmax()` picks, not the first of the tied probabilities."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.decoding.tree import Candidates, VerifyTree

    lo = torch.tensor(0.1)
    logits = torch.tensor([[0.1, float(torch.nextafter(lo, torch.tensor(1.0))), -3.0, -4.0]])
    probs = torch.softmax(logits, dim=-1)[0]
    assert probs[0] == probs[1] and logits[0, 1] > logits[0, 0]  # the tie this test is about
    root = VerifyTree(node_ids=[-1], tokens=[0], parents=[-1], depths=[0])
    compiled = sample_ops.load(cache_dir() / "kernels")
    for ops in (None, compiled) if compiled is not None else (None,):  # PyTorch's argmax, then the C one
        engine = types.SimpleNamespace(sample_ops=ops)
        result, argmax, tprobs, _ = Engine._accept(engine, root, Candidates(), logits, SamplingConfig(), None, str)
        assert argmax == [1] and result.bonus_token == 1 == int(logits[0].argmax())
        assert tprobs == [float(probs[1])]


@pytest.mark.parametrize("tree", [TreeConfig.create(5, 4, 16), TreeConfig.create(3, 1, 4)])
def test_speculation_runs_to_the_context_limit_like_plain_decoding(tree):
    """Near the model's context limit (256 here) the tree is cut to the room left: speculation stops at the
    same length as plain decoding instead of `draft_tokens` tokens earlier."""
    engine = tiny_engine("llama", vocab=8)
    ids = [1, 2, 3, 4] * 59  # 236 tokens, 20 from the limit
    sampling = SamplingConfig(max_new_tokens=64)
    plain = run(engine, ids, None, sampling)
    spec = run(engine, ids, tree, sampling)
    assert plain.stop_reason == spec.stop_reason == "context"
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 256 - len(ids)
    check_trace(spec, tree)


def test_an_attention_fallback_is_noted_in_every_trace(monkeypatch):
    """The engine asks `choose_attention` once, with its device, KV dtype and the injected check, and every run
    it starts carries the choice's notes (what the page shows) through JSON."""
    import eagleviz.decoding.engine as engine_mod
    from kernels.self_check import AttentionChoice

    note = "the Triton tree-attention kernel disagreed with PyTorch attention on cuda:0; verification uses PyTorch"
    asked = []

    def choose(impl, device, dtype, check):
        asked.append((impl, device, dtype, check))
        return AttentionChoice("torch", (note,))

    ref = tiny_engine("llama", vocab=8, layers=2)
    monkeypatch.setattr(engine_mod, "choose_attention", choose)

    def check(device, dtype):
        raise AssertionError("never called by the stand-in")

    engine = engine_mod.Engine(ref.target, ref.head, "random", kernel_check=check)
    assert asked == [("auto", ref.target.device, ref.target.kv_dtype, check)]
    for tree in (TreeConfig.create(3, 2, 6), None):
        trace = run(engine, [1, 2, 3], tree, SamplingConfig(max_new_tokens=8))
        assert trace.attn_impl == "torch" and trace.notes == [note]
        assert RunTrace.from_json(trace.to_json()).notes == [note]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_cycle_of_the_root_alone_decides_as_the_full_acceptance_does(compiled):
    """The read-out of a root-only cycle (`_accept_root`) gives the token, argmax and probability `_accept` gives
    for the same tree and the cycle's uniforms, at T = 0, T > 0 and with nucleus truncation; given none, it draws
    its uniform from the generator as plain decoding does."""
    from eagleviz.decoding.tree import Candidates, VerifyTree
    from eagleviz.decoding.verify import cycle_uniforms, uniform

    engine = tiny_engine("llama", vocab=64, seed=3)
    if not compiled:
        engine.sample_ops = None
    tree = VerifyTree.build(Candidates(), [], root_token=5)
    for seed in range(20):
        logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed)) * 3
        for sampling in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.7),
                         SamplingConfig(temperature=1.0), SamplingConfig(temperature=1.3, top_p=0.8)):
            us = cycle_uniforms(torch.Generator().manual_seed(seed), 4, "cpu")  # a drafted cycle's block
            full, argmax, tprobs, _ = engine._accept(tree, Candidates(), logits, sampling, us, str)
            root, root_argmax, root_tprobs = engine._accept_root(logits[0], sampling, None, u=us[:1])
            assert (root.bonus_token, root.path, root.checks, root.bonus_source) == \
                (full.bonus_token, full.path, full.checks, full.bonus_source)
            assert root_argmax == argmax and root_tprobs == pytest.approx(tprobs, rel=1e-6)
            gen = torch.Generator().manual_seed(seed)  # plain decoding's read-out: its uniform from the generator
            plain = engine._accept_root(logits[0], sampling, gen)[0]
            assert plain.bonus_token == engine._accept_root(logits[0], sampling, None,
                                                            u=uniform(torch.Generator().manual_seed(seed), "cpu"))[0].bonus_token


def test_a_character_spelled_over_byte_tokens_is_written_whole_once_finished():
    """SmolLM2's byte-level tokenizer spells an emoji over several tokens, each decoded alone as U+FFFD: the run's
    text is the tokenizer's own decoding of its tokens (never "\ufffd\ufffd"), committed a token at a time or several
    at once; the token that finishes a character carries it, those before it add nothing and show as parts; a byte
    no token finishes stays U+FFFD, as the tokenizer writes it; the pieces survive a trace's JSON."""
    from transformers import AutoTokenizer

    from eagleviz.decoding.engine import Engine, _TokenText
    from eagleviz.models.loading import embedded_snapshot
    from eagleviz.visuals.output_text import PART_MARK, output_tokens

    try:
        tok = AutoTokenizer.from_pretrained(str(embedded_snapshot()))
    except UserFacingError as exc:  # the embedded model package is not installed
        pytest.skip(str(exc))
    text = _TokenText(tok, len(tok))

    def written(ids: list[int], at_once: int) -> RunTrace:
        run = RunTrace(prompt="", prompt_tokens=0, config={}, seed=0, device="cpu", dtype="float32",
                       attn_impl="torch", model="", head="")
        for i in range(0, len(ids), at_once):
            Engine._emit(run, [(t, "draft") for t in ids[i:i + at_once]], i, frozenset(), 10 ** 6, text)
        return run

    words = "Hi \U0001f985 eagle \U0001f600 \u00e9 \u4e2d\u6587 done"
    ids = tok.encode(words)
    assert sum("\ufffd" in tok.decode([t]) for t in ids) >= 4          # the emoji are split into byte tokens
    for at_once in (1, 3, len(ids)):
        run = written(ids, at_once)
        assert run.text == tok.decode(ids) == words, at_once
    parts = [t.piece for t in run.output]
    assert parts[1:4] == ["", "", " \U0001f985"] and parts[0] is None
    shown = [s for s, _ in output_tokens(run)]
    assert shown[1:4] == [PART_MARK, PART_MARK, " \U0001f985"] and "\ufffd" not in "".join(shown)
    assert RunTrace.from_json(run.to_json()).text == words
    stray = [ids[1], tok.encode(" eagle")[0]]                            # a first byte no token finishes
    assert written(stray, 1).text == tok.decode(stray) and "\ufffd" in tok.decode(stray)


def test_on_a_gpu_a_sampled_runs_head_drafts_from_its_first_cycle(monkeypatch):
    """At T > 0 a CPU's run starts with its head in doubt (resting); a GPU's drafts from the first cycle where its
    price list says the head pays (`Ledger.for_run`'s `gpu`; here the flat, GPU-like default list)."""
    engine = tiny_engine("llama", vocab=8, seed=0)
    tree, sampling = TreeConfig.create(3, 2, 4, source="eagle"), SamplingConfig(temperature=1.0, max_new_tokens=12)
    assert all(c.draft_levels == 0 for c in engine.generate("abc", tree, sampling).cycles)
    monkeypatch.setattr(Engine, "queued", property(lambda self: True))  # (what a CUDA engine says)
    assert engine.generate("abc", tree, sampling).cycles[0].draft_levels > 0
