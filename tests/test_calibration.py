"""eagleviz/decoding/calibration.py: tables are monotone, fit what they observe, shrink empty bins towards
EAGLE-2's assumption, and round-trip through the head's calibration.json."""

from __future__ import annotations

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
