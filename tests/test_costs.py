"""eagleviz/decoding/costs.py: the price list is in plain decoding steps, and a plain step is what a decoded
token takes after the prompt's prefill."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eagleviz.decoding import costs


class _Engine:
    """Runs that took `prefill_ms` for the prompt, then `step_ms` per token (a tree: 3 tokens a cycle, each cycle
    0.5 ms of drafting once, 1 ms per draft level, a verification of 10 ms and 15 ms in all with 4 levels, 16.5
    ms at T > 0). Priced out of every tree (`with_policy`), one token a cycle of 6.5 ms (7 ms at T > 0)."""

    head = object()

    def __init__(self, prefill_ms: float, step_ms: float, resting: bool = False):
        self.prefill_ms, self.step_ms, self.target, self.resting = prefill_ms, step_ms, None, resting

    def with_policy(self, costs=None, calibration=None):
        assert costs.verify_cost(2) > 1e3 and costs.draft_cost(1) > 1e3  # nothing worth drafting or verifying
        return _Engine(self.prefill_ms, self.step_ms, resting=True)

    def generate(self, prompt, tree, sampling):
        n, sampled = sampling.max_new_tokens, sampling.temperature > 0
        if tree is None:  # the prefill writes the first token, then n steps
            return SimpleNamespace(wall_s=(self.prefill_ms + n * self.step_ms) / 1e3, prefill_ms=self.prefill_ms,
                                   output=[0] * (n + 1), cycles=[], prompt_tokens=20)
        if self.resting:
            assert tree.source == "lookup"
            cycles = [SimpleNamespace(timings_ms={"draft": 0.1, "verify": 5.0}) for _ in range(n)]
            cycle_ms = 7.0 if sampled else 6.5
        else:
            cycles = [SimpleNamespace(timings_ms={"draft": 0.5 + tree.steps, "verify": 10.0}) for _ in range(n // 3)]
            cycle_ms = 16.5 if sampled and tree.steps == 4 else 15.0
        return SimpleNamespace(wall_s=(self.prefill_ms + cycle_ms * len(cycles)) / 1e3, prefill_ms=self.prefill_ms,
                               output=[0] * n, cycles=cycles)


def test_a_plain_step_leaves_the_prefill_out(monkeypatch):
    monkeypatch.setattr(costs, "forward_ms", lambda target, sizes, prefix=200: {n: 4.0 + n for n in sizes})
    slow_prompt, quick_prompt = (costs.measure(_Engine(prefill, 6.0)) for prefill in (300.0, 1.0))
    for measured in (slow_prompt, quick_prompt):
        assert abs(measured.step_ms - 6.0) < 1e-9
        assert abs(measured.verify_cost(1) - 5.0 / 6.0) < 1e-9 and abs(measured.verify_cost(8) - 12.0 / 6.0) < 1e-9
        assert abs(measured.draft_level - 1.0 / 6.0) < 1e-9 and abs(measured.draft_fixed - 0.5 / 6.0) < 1e-9
        assert abs(measured.overhead - 0.5 / 6.0) < 1e-9
        assert measured.draft_cost(0) == 0.0 and abs(measured.draft_cost(2) - 2.5 / 6.0) < 1e-9
        assert costs.CostModel.from_dict(measured.to_dict()) == measured


def test_every_price_is_in_plain_steps_of_the_probes_own_context(monkeypatch):
    """The forward curve is measured after a long context, where a forward takes longer than at the probe's:
    its shape is kept, its one-token price is a one-token forward's share of a plain step at the probe's own
    context, and the probe's runs are priced by the plain step they ran beside (a resting cycle of 6.5 ms beside
    6 ms steps costs 1.08 steps, not 1.0 of a long context's forward)."""
    contexts = []

    def forward(target, sizes, prefix=200):
        contexts.append(prefix)
        return {n: (4.0 + n) * (1.3 if prefix >= 200 else 1.0) for n in sizes}

    monkeypatch.setattr(costs, "forward_ms", forward)
    measured = costs.measure(_Engine(1.0, 6.0))
    assert contexts[0] == 200 and contexts[1] < 200  # the curve, then the unit at the probe's context
    assert measured.step_ms == pytest.approx(6.0) and measured.rest_cost() == pytest.approx(6.5 / 6.0)
    assert measured.verify_cost(1) == pytest.approx(5.0 / 6.0) and measured.verify_cost(8) == pytest.approx(2.0)
    assert measured.draft_level == pytest.approx(1.0 / 6.0)


def test_resting_and_sampled_cycles_have_their_own_prices(monkeypatch):
    monkeypatch.setattr(costs, "forward_ms", lambda target, sizes, prefix=200: {n: 4.0 + n for n in sizes})
    measured = costs.measure(_Engine(1.0, 6.0))
    assert measured.rest_cost() == pytest.approx(6.5 / 6.0)
    sampled = measured.at(1.0)
    assert sampled.rest_cost() == pytest.approx(7.0 / 6.0) and sampled.overhead == pytest.approx(2.0 / 6.0)
    assert measured.at(0.0) is measured and sampled.at(0.7) == sampled  # a list priced for T > 0 stays so
    assert sampled.verify == measured.verify and sampled.draft_level == measured.draft_level
    # a list without them prices the root alone as a verification of one token plus a cycle's overhead
    bare = costs.CostModel(verify=((1, 1.0), (4, 2.0)), draft_level=0.1, overhead=0.2)
    assert bare.rest_cost() == pytest.approx(1.2) and bare.at(1.0) is bare


def test_a_price_list_is_kept_per_cpu_vector_unit(monkeypatch):
    """An emulated AVX2 run (or a second machine sharing the cache) measures its own prices."""
    import dataclasses

    from kernels import capability
    from tiny import tiny_engine

    engine = tiny_engine("llama", vocab=8)
    native = costs.key(engine)
    here = capability.detect()  # (a run under EAGLEVIZ_CPU=avx2 already emulates AVX2: then the other one)
    other = ("x86-64", "DEFAULT") if here.emulating == "avx2" else ("avx2", "AVX2")
    emulated = dataclasses.replace(here, emulating=other[0], vector_isa=other[1])
    monkeypatch.setattr(capability, "detect", lambda: emulated)
    assert costs.key(engine) != native


def test_the_forward_curve_is_measured_through_the_steps_the_runs_take():
    """Over static steps (a GPU's path, here uncaptured) the curve is timed on the engine's leased state, which
    goes back to its pool; a price list kept for one decode path is never read for another."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.target import TargetModel
    from tiny import tiny_engine

    base = tiny_engine()
    target = TargetModel(base.target.hf, base.target.tokenizer, base.target.name, fused=False)
    eager = Engine(target, base.head, "random", decode="eager")
    static = eager.with_decode("static")
    curve = costs.forward_ms(static, prefix=16, sizes=(1, 2, 4), repeats=1)
    assert list(curve) == [1, 2, 4] and all(ms > 0 for ms in curve.values())
    assert static.pool.free() == 1  # the state it leased, given back
    assert costs.key(eager) != costs.key(static)


def test_the_curve_is_timed_on_a_state_a_run_made_in_inference_mode():
    """A price list is measured when a cost-aware tree first needs it, which can be after a run leased (and gave
    back) the static state the curve is timed on, from outside any inference-mode block (a bench's report asks for
    it after its runs): that state's buffers are inference tensors, written in place by every step."""
    from eagleviz.config import SamplingConfig
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.target import TargetModel
    from tiny import tiny_engine

    base = tiny_engine()
    target = TargetModel(base.target.hf, base.target.tokenizer, base.target.name, fused=False)
    static = Engine(target, base.head, "random", decode="static")
    static.generate("Hello", None, SamplingConfig(max_new_tokens=2))  # its state made inside inference mode
    assert costs.torch.is_inference_mode_enabled() is False
    curve = costs.forward_ms(static, prefix=16, sizes=(1, 2), repeats=1)
    assert list(curve) == [1, 2] and static.pool.free() == 1


def test_a_slow_moment_of_the_machine_lands_on_every_size_alike(monkeypatch):
    """The curve is timed round by round, one forward of every size a round: five calls in a row taking three
    times as long (the machine busy for a moment) reach no size's median. Timed size by size, they made one
    size cost three times its price."""
    clock, calls = [0.0], []

    class Steps:
        cache = SimpleNamespace(length=0)

        def forward(self, tokens, positions, mask):
            slow = 10 <= len(calls) < 15
            calls.append(len(tokens))
            clock[0] += (1.0 + 0.1 * len(tokens)) * (3.0 if slow else 1.0) / 1e3

    target = SimpleNamespace(device=costs.torch.device("cpu"), vocab_size=50, forward=lambda *a, **k: None)
    monkeypatch.setattr(costs, "target_steps", lambda engine, capacity, layers: Steps())
    monkeypatch.setattr(costs, "release", lambda *a: None)
    monkeypatch.setattr(costs, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    curve = costs.forward_ms(SimpleNamespace(target=target, attn_impl="torch"), prefix=8, sizes=(1, 2, 4, 8))
    assert curve == pytest.approx({n: 1.0 + 0.1 * n for n in (1, 2, 4, 8)})
    assert calls[:8] == [1, 2, 4, 8, 1, 2, 4, 8]  # a warm-up round, then rounds


def test_a_runs_clock_scales_the_price_list_towards_what_its_phases_take():
    """A list measured at a quieter moment says 4 tokens cost 1.2 steps; this run's forwards of 4 tokens take 1.6
    of its one-token forwards and its two draft levels 0.6 where the list said 0.3. Nothing is counted before a
    resting cycle gives the unit; then each cycle moves the list's verification beyond one token and its drafting
    towards what was seen (shrunk by `weight`, never past a factor of 4), and leaves verify(1), the overhead and a
    resting cycle's price as they were."""
    base = costs.CostModel(verify=((1, 1.0), (4, 1.2), (16, 2.0)), draft_level=0.1, overhead=0.1, draft_fixed=0.1,
                           rest=1.05)
    run = costs.RunCosts(base)
    assert not run.observe(4, 2, forward_ms=16.0, draft_ms=6.0) and run.costs() is base
    run.rest(10.0)
    scales = []
    for _ in range(20):
        assert run.observe(4, 2, forward_ms=16.0, draft_ms=6.0)
        scales.append(run.scales())
    (v, d), (v0, d0) = scales[-1], scales[0]
    w = run.weight  # 0.6 seen beyond one token where 0.2 was listed; drafting 0.6 seen, 0.3 listed
    assert 1.0 < v0 < v and v == pytest.approx((20 * 0.6 + w) / (20 * 0.2 + w))
    assert 1.0 < d0 < d and d == pytest.approx((20 * 0.6 + w) / (20 * 0.3 + w))
    fixed = run.costs()
    assert fixed.verify_cost(4) == pytest.approx(1.0 + v * 0.2) and fixed.verify_cost(1) == 1.0
    assert fixed.draft_cost(2) == pytest.approx(d * 0.3) and (fixed.overhead, fixed.rest) == (0.1, 1.05)
    cheap = costs.RunCosts(base)
    cheap.rest(10.0)
    for _ in range(50):
        cheap.observe(16, 0, forward_ms=10.0, draft_ms=0.0)  # a 16-token forward as quick as one: at most 4x off
    assert cheap.scales() == (pytest.approx(1 / costs.RunCosts.LIMIT), 1.0)



def test_a_head_that_drafts_every_level_in_one_call_pays_for_all_of_them_whatever_a_tree_keeps():
    """A GPU's captured drafting runs all K levels; a cost-aware tree that keeps L of them has paid for K. Priced so,
    keeping fewer levels saves no drafting, a run's clock (which times the whole drafting) compares it with the
    whole price, not L levels' (where it would take the head for up to 4x dearer than listed), and the list stays
    itself through the clock's scaling and a round trip."""
    base = costs.CostModel(verify=((1, 1.0), (16, 1.3)), draft_level=0.1, overhead=0.1, draft_fixed=0.2)
    five = base.drafting_at_once(5)
    assert [base.draft_cost(n) for n in range(6)] == pytest.approx([0.0, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert [five.draft_cost(n) for n in range(6)] == pytest.approx([0.0] + [0.7] * 5)
    assert five.scaled(1.0, 2.0).draft_cost(1) == pytest.approx(1.4)
    assert costs.CostModel.from_dict(five.to_dict()) == five and five.verify_cost(16) == base.verify_cost(16)
    scales = []
    for listed in (base, five):  # five levels drafted in 0.7 of a one-token forward, as listed; two kept
        run = costs.RunCosts(listed, weight=1e-9)
        run.rest(10.0)
        run.observe(3, 2, forward_ms=10.0, draft_ms=7.0)
        scales.append(run.scales()[1])
    assert scales == pytest.approx([0.7 / 0.4, 1.0])

def test_a_loaded_engine_measures_its_prices_when_a_cost_aware_tree_first_needs_them(monkeypatch):
    """Plain decoding and a fixed tree price nothing, so they measure nothing; the first cost-aware run measures
    once, before its clock starts (its wall time leaves the measurement out), and the engine's copies share the
    list."""
    import time

    import eagleviz.decoding.load as load
    from eagleviz.config import SamplingConfig, TreeConfig
    from tiny import CPU_COSTS, tiny_target

    measured, ended = [], []

    def measure(engine, progress=None):
        measured.append(engine.head_name)
        time.sleep(0.2)
        ended.append(time.perf_counter())
        return CPU_COSTS

    monkeypatch.setattr(load, "load_target", lambda *args, **kwargs: tiny_target("llama", vocab=16))
    monkeypatch.setattr(load, "load_or_measure", measure)
    engine = load.load_engine("random", "random")
    sampling = SamplingConfig(max_new_tokens=6)
    engine.generate("abc", None, sampling, chat=False)
    engine.generate("abc", TreeConfig.create(3, 2, 4, adaptive=False), sampling, chat=False)
    assert measured == [] and not engine.prices.known
    run = engine.generate("abc", TreeConfig.create(3, 2, 4), sampling, chat=False)
    returned = time.perf_counter()
    assert measured == ["random (untrained)"] and engine.costs is CPU_COSTS
    # measured before the run's clock started: the run's time fits between the measurement's end and now
    assert run.wall_s <= returned - ended[0], (run.wall_s, returned - ended[0])
    copy = engine.with_attention("torch")
    copy.generate("abc", TreeConfig.create(3, 2, 4), sampling, chat=False)
    assert len(measured) == 1 and copy.costs is CPU_COSTS
