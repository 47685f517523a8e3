"""eagleviz/decoding/policy.py: the verified budget maximises expected tokens per unit cost, a flat (GPU-like)
curve grows big trees where a steep (CPU-like) one keeps them small, drafting stops when a level cannot pay,
and a lost head falls back to verifying the root alone (a plain step)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from eagleviz.decoding.calibration import Calibration
from eagleviz.decoding.costs import CostModel
from eagleviz.decoding.policy import HeadRest, Ledger, TreePolicy
from tiny import CPU_COSTS

GPU = CostModel(verify=((1, 1.0), (64, 1.05)), draft_level=0.05, overhead=0.05)
CAL = Calibration.identity_table()


def policy(costs: CostModel) -> TreePolicy:
    return TreePolicy(costs, CAL)


def test_the_budget_is_the_best_prefix_by_brute_force():
    rng = random.Random(0)
    for _ in range(50):
        values = sorted((rng.random() ** 2 for _ in range(rng.randrange(1, 30))), reverse=True)
        levels = rng.randrange(1, 6)
        pol = policy(CPU_COSTS)
        got = pol.budget(values, levels, 63)
        rates = [(1 + sum(values[:m])) / pol.cycle_cost(levels, m + 1) for m in range(len(values) + 1)]
        assert got.rate == pytest.approx(max(rates))
        assert got.size == rates.index(max(rates))
        assert got.expected_tokens == pytest.approx(1 + sum(values[:got.size]))


def test_the_budget_respects_the_cap():
    values = [0.9] * 40
    assert policy(GPU).budget(values, 3, 10).size == 10


def test_a_flat_curve_verifies_far_more_than_a_steep_one():
    values = sorted([0.8, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01], reverse=True)
    gpu, cpu = policy(GPU).budget(values, 4, 63), policy(CPU_COSTS).budget(values, 4, 63)
    assert gpu.size == len(values) and cpu.size < gpu.size


def test_a_lost_head_verifies_the_root_alone():
    assert policy(CPU_COSTS).budget([0.01, 0.005, 0.001], 1, 15).size == 0


def test_a_confident_head_keeps_drafting_and_a_lost_one_stops():
    pol = policy(CPU_COSTS)
    assert pol.another_level([0.9, 0.1], [0.9, 0.1], 1, 15, 2, 4)
    assert not pol.another_level([0.02, 0.01], [0.02, 0.01], 1, 15, 2, 4)
    assert not pol.another_level([0.9], [0.9], 1, 15, 2, 0)  # no level left


def test_drafting_decisions_agree_with_the_budget_they_predict():
    """Whenever another level is refused, no predicted level (one or two deeper) has a better best rate."""
    rng = random.Random(1)
    pol = policy(CPU_COSTS)
    for _ in range(100):
        frontier = sorted((rng.random() ** 3 for _ in range(2)), reverse=True)
        values = sorted(frontier + [rng.random() ** 3 for _ in range(3)], reverse=True)
        if pol.another_level(values, frontier, 2, 15, 2, 3):
            continue
        now = pol.budget(values, 2, 15).rate
        kids = [v * CAL.child_accept(k) for v, k in itertools.product(frontier, range(2))]
        assert pol.budget(sorted(values + kids, reverse=True), 3, 15).rate <= now


def test_the_head_rests_1_2_4_cycles_while_it_proposes_nothing_worth_verifying():
    rest, pattern = HeadRest(most=4), []
    for kept in [False, False, False, False, True, False]:
        while not rest.head_runs():
            pattern.append("rest")
        pattern.append("run")
        rest.record(kept)
    assert pattern == ["run", "rest", "run", "rest", "rest", "run", "rest", "rest", "rest", "rest", "run",
                       "rest", "rest", "rest", "rest", "run", "run"]
    assert rest.streak == 1 and rest.left == 1
    assert rest.head_runs() is False and rest.note().endswith("this cycle without it.")


def test_a_tree_must_beat_the_resting_cycles_price():
    """A cycle of the root alone costs `rest` (about a plain step), where a tree adds its acceptance's overhead:
    a node is verified only when its value pays for that too; at T > 0 the sampled overhead is the price."""
    import dataclasses

    costs = CostModel(verify=((1, 1.0), (2, 1.2), (4, 1.5)), draft_level=0.1, overhead=0.2, rest=1.0,
                      sampled_overhead=0.4, sampled_rest=1.05)
    pol = policy(costs)
    assert pol.cycle_cost(0, 1) == pytest.approx(1.0) and pol.cycle_cost(1, 1) == pytest.approx(1.1)
    assert pol.cycle_cost(0, 2) == pytest.approx(1.4)
    assert pol.budget([0.35], 0, 15).size == 0   # 1.35 / 1.4 < 1 / 1.0
    assert pol.budget([0.45], 0, 15).size == 1   # 1.45 / 1.4 > 1
    sampled = policy(costs.at(1.0))
    assert sampled.cycle_cost(0, 1) == pytest.approx(1.05) and sampled.cycle_cost(0, 2) == pytest.approx(1.6)
    assert sampled.budget([0.45], 0, 15).size == 0  # the same node does not pay for a rejection's residual
    old = dataclasses.replace(costs, rest=None)  # a list without the price: verify(1) + overhead, as before
    assert policy(old).cycle_cost(0, 1) == pytest.approx(1.2)


def test_the_ledger_judges_drafted_cycles_together_by_the_clock_against_a_resting_cycle():
    ledger = Ledger()
    assert not ledger.wants_reference()  # the run's first cycle drafts
    assert ledger.observe(9.0, 1, drafted=True, alone=False)  # no reference yet: no verdict
    assert ledger.wants_reference()
    assert ledger.observe(4.0, 1, drafted=False, alone=True) and ledger.rest_ms() == 4.0
    assert not ledger.wants_reference()
    assert ledger.observe(12.0, 1, drafted=True, alone=False)  # lost 2 resting cycles, but one cycle is no verdict
    assert ledger.observe(6.0, 3, drafted=True, alone=False)
    assert ledger.observe(8.4, 2, drafted=True, alone=False)   # 0.1 of a resting cycle lost
    assert not ledger.observe(9.0, 2, drafted=True, alone=False)  # 4 cycles: 8 tokens in 35.4 ms > 8 * 4.0
    assert ledger.losing() and ledger.losses == pytest.approx([2.0, 0.1, 0.25])
    assert ledger.span() == math.ceil((2.0 + 0.1 + 0.25) / 3 / Ledger.PROBE_SHARE)
    assert ledger.observe(4.1, 1, drafted=False, alone=True)
    assert ledger.observe(7.0, 2, drafted=True, alone=False)  # a probe that pays: judged afresh
    assert ledger.drafted == [(7.0, 2)] and not ledger.losing()
    assert ledger.observe(30.0, 1, drafted=False, alone=False)  # lookup candidates alone: no reference
    assert ledger.rests == [4.0, 4.1]
    for _ in range(Ledger.REFERENCE_EVERY - 2):
        ledger.observe(5.0, 3, drafted=True, alone=False)
    assert ledger.wants_reference()  # 64 cycles without a resting one: time a plain step again


def test_a_probe_every_span_cycles_costs_under_one_percent():
    """A head that never pays: after EVIDENCE unpaid cycles (rests of 1, 2, 4 between them) it rests `span` cycles,
    drafts once, rests again; the unpaid probes' extra time is then under 1% of the run's (capped at 256 cycles of
    rest: a probe losing more than 2.56 resting cycles is rarer). The first probes find it out: they cost more
    in the first 200 cycles."""
    ledger, rest = Ledger(), HeadRest()
    spent, extra = [], []
    ledger.observe(4.0, 1, drafted=False, alone=True)
    for _ in range(5000):
        if rest.head_runs():
            ms = 7.0  # one token: 0.75 of a resting cycle lost per probe
            winning = ledger.observe(ms, 1, drafted=True, alone=False)
            rest.most = ledger.span()
            rest.record(winning, losing=not winning)
        else:
            ms = 4.0
            ledger.observe(ms, 1, drafted=False, alone=True)
        spent.append(ms)
        extra.append(ms - 4.0)
    assert rest.most == 75 and ledger.losing()
    assert sum(extra[200:]) / sum(spent[200:]) < 0.01
    assert sum(extra[:200]) / sum(spent[:200]) < 0.03


def test_a_sampled_run_starts_in_doubt_and_drafts_on_only_once_a_probe_pays():
    """Sampled, the head starts a run judged losing: it rests `span` cycles, an unpaid probe keeps it resting,
    and a probe that pays clears the doubt, after which the head is judged by its drafted cycles as a greedy
    run's is. Greedy, the head drafts from the start."""
    assert not Ledger.for_run(greedy=True).losing()
    ledger = Ledger.for_run(greedy=False)
    assert ledger.losing() and ledger.span() == 150  # its first probe's loss taken as Ledger.FIRST_LOSS
    assert ledger.observe(4.0, 1, drafted=False, alone=True)   # a resting cycle: the reference
    assert not ledger.observe(6.0, 1, drafted=True, alone=False)  # an unpaid probe: still losing
    assert ledger.doubt and ledger.losses == [0.5] and ledger.span() == 50
    assert ledger.observe(4.0, 1, drafted=False, alone=True)
    assert ledger.observe(6.0, 2, drafted=True, alone=False)   # a probe that pays
    assert not ledger.doubt and ledger.drafted == [(6.0, 2)]
    assert ledger.observe(9.0, 1, drafted=True, alone=False)   # one unpaid cycle after it is no verdict
    assert "a run starts without it" in HeadRest(left=3).note()


def test_a_greedy_run_starts_in_doubt_where_the_prices_say_the_heads_average_guess_does_not_pay():
    """Greedy, the head drafts from the start where drafting from the root is expected to beat a resting cycle at
    the calibration's average acceptance (`TreePolicy.head_pays`): on CPU_COSTS (a second token verified for 0.09
    plain steps) it is; on a price list measured on a 2-core AVX2-only AMD EPYC (a second token for 0.30, a level
    0.13, 0.14 a cycle's overhead), where its drafted cycles took 1.7 resting cycles for 1.44 tokens
    (docs/performance.md entry 42), it is not, and the run starts in doubt as a sampled run does."""
    steep = CostModel(verify=((1, 0.97), (2, 1.30), (4, 1.99), (8, 3.36), (16, 6.39), (64, 26.15)),
                      draft_level=0.134, overhead=0.143, draft_fixed=0.08, rest=1.0)  # a resting cycle: 1.00 steps
    assert policy(CPU_COSTS).head_pays(4, 5, 15) and policy(GPU).head_pays(4, 5, 15)
    assert not policy(steep).head_pays(4, 5, 15)
    assert not Ledger.for_run(greedy=True, pays=True).losing()
    doubt = Ledger.for_run(greedy=True, pays=False)
    assert doubt.losing() and doubt.span() == Ledger.for_run(greedy=False).span() == 150
    assert Ledger.for_run(greedy=False, pays=True).doubt


def test_on_a_gpu_a_sampled_runs_head_drafts_from_the_start_where_its_prices_say_it_pays():
    """A GPU's sampled run: its head is judged by the price list at its temperature as a greedy run's is (in doubt
    only where drafting is not expected to pay); its lookups, sampled, start in doubt everywhere."""
    assert not Ledger.for_run(greedy=False, pays=True, gpu=True).doubt
    assert Ledger.for_run(greedy=False, pays=False, gpu=True).doubt
    assert Ledger.for_run(greedy=False, pays=True, gpu=False).doubt
    assert Ledger.for_run(greedy=False, lookups=True).doubt


def test_the_lookups_ledger_gives_its_verdict_after_two_drafted_cycles_the_heads_after_four():
    """A run meets a few lookup matches (4-11 in 128 tokens on MT-bench at T = 0), so the ledger of the context's
    lookups judges them after LOOKUP_EVIDENCE = 2 cycles: two lookup cycles that each took 1.5 resting cycles for
    one token rest the lookups, where the head's ledger waits for EVIDENCE = 4 (docs/performance.md entry 43)."""
    head, looks = Ledger.for_run(greedy=True), Ledger.for_run(greedy=True, lookups=True)
    assert (Ledger.LOOKUP_EVIDENCE, Ledger.EVIDENCE) == (2, 4) and looks.lookups and not head.lookups
    for ledger in (head, looks):
        ledger.observe(10.0, 1, drafted=False, alone=True)
        assert ledger.observe(15.0, 1, drafted=True, alone=False, probe=False)  # one cycle: no verdict
    assert head.observe(15.0, 1, drafted=True, alone=False, probe=False) and not head.losing()
    assert not looks.observe(15.0, 1, drafted=True, alone=False, probe=False) and looks.losing()
    for _ in range(2):
        head.observe(15.0, 1, drafted=True, alone=False, probe=False)
    assert head.losing()


def test_a_source_that_does_not_draft_every_cycle_says_which_of_its_cycles_is_a_probe():
    """The context's lookups are judged by a ledger too, but their cycles come between resting ones that no rest
    imposed: the engine says which lookup cycle follows an imposed rest (`probe`), and only a paid probe clears
    the evidence against them."""
    ledger = Ledger()
    for tokens in (1, 1, 2, 1):  # paid or not, cycles between plain steps are not probes: evidence accumulates
        ledger.observe(4.0, 1, drafted=False, alone=True)
        ledger.observe(7.0, tokens, drafted=True, alone=False, probe=False)
    assert len(ledger.drafted) == 4 and ledger.losing()
    ledger.observe(4.0, 1, drafted=False, alone=True)
    assert ledger.observe(7.0, 2, drafted=True, alone=False, probe=True)  # a paid probe: a fresh count
    assert ledger.drafted == [(7.0, 2)] and not ledger.losing()
