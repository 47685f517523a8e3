"""eagleviz/decoding/calibration.py: tables are monotone, fit what they observe, shrink empty bins towards
EAGLE-2's assumption, and round-trip through the head's calibration.json."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from eagleviz.decoding import calibration as C


def test_isotonic_is_the_monotone_least_squares_fit():
    assert C.isotonic([1, 3, 2, 4], [1, 1, 1, 1]) == [1, 2.5, 2.5, 4]
    assert C.isotonic([3, 1], [1, 3]) == [1.5, 1.5]
    assert C.isotonic([0.1, 0.2], [1, 1]) == [0.1, 0.2]


def test_identity_is_eagle2s_assumption():
    table = C.Calibration.identity_table()
    for score in (-5.0, -1.0, -0.1, 0.0):
        assert table.path_accept(score) == pytest.approx(math.exp(score))


def test_a_fit_recovers_a_known_acceptance_curve_and_is_monotone():
    rng = random.Random(0)
    truth = lambda s: 0.8 * math.exp(s / 2)  # an over-confident head: acceptance below the draft's belief
    scored = [(s, rng.random() < truth(s)) for s in (-rng.expovariate(0.5) for _ in range(40000))]
    table = C.fit(scored, [(1, True)] * 50 + [(1, False)] * 50, [(2, True)] * 30 + [(2, False)] * 70, "test")
    assert list(table.accept) == sorted(table.accept)
    for score in (-4.0, -2.0, -1.0, -0.5):
        assert table.path_accept(score) == pytest.approx(truth(score), abs=0.06)
    assert table.child_accept(0) == pytest.approx(0.5, abs=0.03)
    assert table.lookup_accept(2) == pytest.approx(0.3, abs=0.05)
    assert table.samples == len(scored)


def test_empty_bins_keep_the_prior():
    table = C.fit([], [], [], "nothing observed")
    ident = C.Calibration.identity_table()
    assert table.accept == pytest.approx(ident.accept)


def test_child_rates_never_rise_with_rank():
    child = [(1, True)] * 10 + [(2, True)] * 30 + [(2, False)] * 5 + [(1, False)] * 40
    table = C.fit([], child, [], "ranks")
    assert list(table.child) == sorted(table.child, reverse=True)


def test_round_trip_and_damaged_files(tmp_path):
    head = C.HeadCalibration(C.fit([(-1.0, True), (-3.0, False)], [], [], "a"), C.Calibration.identity_table())
    (tmp_path / C.FILE).write_text(head.to_json())
    back = C.read(tmp_path)
    assert back == head and back.at(0) == head.greedy and back.at(0.7) == head.sampling
    assert C.read(tmp_path / "nowhere") is None and C.read(None) is None
    (tmp_path / C.FILE).write_text('{"version": 99}')
    with pytest.raises(ValueError, match="calibration"):
        C.read(tmp_path)


def test_tables_are_checked():
    with pytest.raises(ValueError):
        C.Calibration(edges=(-1.0, -2.0), accept=(0.1, 0.2, 0.3))
    with pytest.raises(ValueError):
        C.Calibration(edges=(-1.0,), accept=(0.1,))
    with pytest.raises(ValueError):
        C.Calibration(edges=(-1.0,), accept=(0.1, 1.5))


def test_a_target_from_blocks_reads_its_own_table_where_one_was_fitted(tmp_path):
    dense = C.HeadCalibration(C.Calibration.identity_table(), C.Calibration.identity_table())
    table = C.Calibration.identity_table()
    blocks = C.HeadCalibration(C.Calibration(table.edges, tuple(0.5 * a for a in table.accept), table.child,
                                             table.lookup, 10, "fitted from blocks"), table)
    (tmp_path / C.FILE).write_text(dense.to_json())
    assert C.read(tmp_path, "blocks") == dense  # no own table yet: the dense one
    (tmp_path / C.file_for("blocks")).write_text(blocks.to_json())
    assert C.file_for("blocks") == "calibration-blocks.json" and C.file_for("dense") == C.FILE
    assert C.read(tmp_path, "blocks") == blocks and C.read(tmp_path, "dense") == C.read(tmp_path) == dense


def _table() -> C.Calibration:
    return C.Calibration(edges=C.EDGES, accept=tuple(min(1.0, 0.05 * i) for i in range(len(C.EDGES) + 1)),
                         child=(0.4, 0.1, 0.05, 0.02), lookup=(0.3, 0.5, 0.7), source="test")


def test_a_run_learns_its_lookup_rate_and_starts_from_the_table():
    run = C.RunAcceptance(_table(), lookup_weight=8.0)
    assert run.table() == _table()  # nothing seen: the table itself
    # 40 one-token matches verified below the root, 4 accepted: 0.1 where the table says 0.3
    for k in range(40):
        counted = run.observe([0], {0} if k < 4 else set(), parents=[-1], sources=["lookup"], scores=[0.0], ngram=1)
        assert counted
    rate = run.table().lookup[0]
    assert rate == pytest.approx((4 + 8 * 0.3) / (40 + 8))
    assert run.table().lookup[1:] == (0.5, 0.7)  # longer matches unseen: the table's (still non-decreasing)
    assert run.table().accept == _table().accept  # no head node seen: the head's values unchanged


def test_a_runs_lookup_rates_follow_its_own_text_within_a_few_matches():
    """By default the lookups' rates are shrunk towards the table by two pseudo-observations, the head's scale by
    eight: on a table whose token after a 2-token match is accepted 0.73 of the time (the shipped greedy table's,
    fitted on ShareGPT), two such tokens rejected bring the run to 0.37, and on a price list where verifying a second
    token costs 0.30 plain steps (a 2-core AVX2-only AMD EPYC's) a lone token after a 2-token match is no longer
    verified; shrunk by eight, it still was (0.58), the losing lookup cycles of docs/performance.md entry 43."""
    from eagleviz.decoding.costs import CostModel
    from eagleviz.decoding.drafting import lookup_worth
    from eagleviz.decoding.lookup import Match
    from eagleviz.decoding.policy import TreePolicy

    table = dataclasses.replace(_table(), lookup=(0.34, 0.73, 0.90))
    steep = CostModel(verify=((1, 0.97), (2, 1.30), (4, 1.99), (16, 6.39)), draft_level=0.134, overhead=0.143,
                      rest=1.0)
    match = Match(tokens=(7,), ngram=2)
    run, heavy = C.RunAcceptance(table), C.RunAcceptance(table, lookup_weight=8.0)
    assert run.weight == 8.0 and run.lookup_weight == 2.0
    assert lookup_worth(TreePolicy(steep, run.table()), match, 16)
    for learned in (run, heavy):
        for _ in range(2):
            learned.observe([0], set(), parents=[-1], sources=["lookup"], scores=[0.0], ngram=2)
    assert run.table().lookup[1] == pytest.approx(2 * 0.73 / 4)
    assert not lookup_worth(TreePolicy(steep, run.table()), match, 16)
    assert lookup_worth(TreePolicy(steep, heavy.table()), match, 16)


def test_lookup_rates_stay_non_decreasing_in_match_length():
    run = C.RunAcceptance(_table(), lookup_weight=2.0)
    for _ in range(30):  # two-token matches never accepted, one-token ones always
        run.observe([0], set(), [-1], ["lookup"], [0.0], ngram=2)
        run.observe([0], {0}, [-1], ["lookup"], [0.0], ngram=1)
    lookup = run.table().lookup
    assert all(a <= b + 1e-12 for a, b in zip(lookup, lookup[1:]))


def test_head_nodes_scale_the_table_by_observed_over_expected():
    base = _table()
    run = C.RunAcceptance(base, weight=4.0)
    score = -0.5  # the table's chance of a depth-1 node with this score
    p = base.path_accept(score)
    for _ in range(20):  # never accepted, where the table expects p each time
        run.observe([0], set(), [-1], ["eagle"], [score], ngram=0)
    f = run.head_scale()
    assert f == pytest.approx(4.0 / (20 * p + 4.0))
    table = run.table()
    assert table.accept == tuple(min(1.0, a * f) for a in base.accept)
    assert table.child == tuple(c * f for c in base.child)
    # a node below a rejected parent says nothing; nor does one both sources proposed
    before = (run.head_hits, run.head_expected)
    assert not run.observe([1], set(), [0, 0], ["eagle", "eagle"], [score, score - 1], ngram=0)
    assert not run.observe([0], set(), [-1], ["both"], [score], ngram=1)
    assert (run.head_hits, run.head_expected) == before


def test_a_child_is_judged_given_its_parent():
    base = _table()
    run = C.RunAcceptance(base, weight=1.0)
    parent, child = -0.3, -1.0
    run.observe([0, 1], {0, 1}, [-1, 0], ["eagle", "eagle"], [parent, child], ngram=0)
    given = min(1.0, base.path_accept(child) / base.path_accept(parent))
    assert run.head_hits == 2
    assert run.head_expected == pytest.approx(base.path_accept(parent) + given)


def test_an_identity_table_learns_lookup_only():
    run = C.RunAcceptance(C.IDENTITY)
    run.observe([0], {0}, [-1], ["eagle"], [-0.1], ngram=0)
    assert run.head_expected == 0 and run.table().identity
