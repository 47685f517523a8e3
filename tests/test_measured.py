"""eagleviz/measured.py: this machine's results are preferred over the shipped ones, the newer verify-cost
file wins, and a file that is malformed in any way is skipped, never raised."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eagleviz import measured

SHIPPED_BENCH = json.loads((measured.SHIPPED_DIR / "bench-T0.json").read_text())
CURVE = {"prefix": 200, "ms": {"1": 30.0, "2": 31.0, "16": 36.0}, "relative": {"1": 1.0, "2": 1.03, "16": 1.2}}


@pytest.fixture
def dirs(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(cache, shipped): an empty EAGLEVIZ_CACHE and an empty stand-in for assets/bench."""
    cache, shipped = tmp_path / "cache", tmp_path / "shipped"
    cache.mkdir(), shipped.mkdir()
    monkeypatch.setenv("EAGLEVIZ_CACHE", str(cache))
    monkeypatch.setattr(measured, "SHIPPED_DIR", shipped)
    return cache, shipped


def write(path: Path, data, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_cache_dir_follows_the_model_loaders_rule(monkeypatch, tmp_path):
    from eagleviz.paths import cache_dir

    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path))
    assert measured.cache_dir() == cache_dir() == tmp_path
    monkeypatch.delenv("EAGLEVIZ_CACHE")
    assert measured.cache_dir() == cache_dir()


def test_the_repo_ships_a_valid_greedy_bench():
    found = measured._first_valid([(measured.SHIPPED_DIR / "bench-T0.json", True)], measured._is_bench)
    assert found is not None and found.shipped and "eagle-tree" in found.data["rows"]


def test_nothing_found_is_none(dirs):
    assert measured.latest_bench(0) is None and measured.latest_verify_cost() is None


def test_this_machines_bench_is_preferred_over_the_shipped_one(dirs):
    cache, shipped = dirs
    write(shipped / "bench-T0.json", SHIPPED_BENCH)
    found = measured.latest_bench(0)
    assert found.shipped and found.path == shipped / "bench-T0.json" and "shipped" in found.origin
    mine = dict(SHIPPED_BENCH, prompts=3)
    write(measured.user_bench_path(0), mine)
    found = measured.latest_bench(0.0)
    assert not found.shipped and found.data["prompts"] == 3 and found.path == cache / "bench" / "bench-T0.json"
    assert "this machine" in found.origin and str(found.path) in found.origin
    assert measured.latest_bench(1) is None              # another temperature is another file


def test_bench_names_follow_the_temperature():
    assert [measured.bench_name(t) for t in (0, 0.0, 1, 0.7)] == ["bench-T0.json"] * 2 + ["bench-T1.json",
                                                                                          "bench-T0.7.json"]


MALFORMED_BENCH = [
    "{not json",
    b"\xff\xfe{}",
    "[]",
    {},
    dict(SHIPPED_BENCH, rows={}),
    dict(SHIPPED_BENCH, rows={"plain": {"tokens_per_s": "fast", "speedup": 1.0, "tau": None}}),
    dict(SHIPPED_BENCH, rows={"plain": {"tokens_per_s": float("nan"), "speedup": 1.0, "tau": None}}),
    dict(SHIPPED_BENCH, rows={"plain": {"tokens_per_s": 3.0, "speedup": 1.0, "tau": "x"}}),
    dict(SHIPPED_BENCH, rows={"eagle": {"tokens_per_s": 3.0, "speedup": 1.0, "tau": 2.0,
                                        "phase_ms": {"draft": "x", "verify": 1.0}}}),
    dict(SHIPPED_BENCH, tree="5/4/16"),
    dict(SHIPPED_BENCH, tree={"steps": 5}),
    dict(SHIPPED_BENCH, machine=["cpu"]),
    dict(SHIPPED_BENCH, sampling=None),
    dict(SHIPPED_BENCH, reference=None),
    dict(SHIPPED_BENCH, greedy_mismatches=[{"method": "plain", "top2_gap": None}]),
]


@pytest.mark.parametrize("bad", MALFORMED_BENCH, ids=range(len(MALFORMED_BENCH)))
def test_a_malformed_bench_is_skipped_for_the_next_candidate(dirs, bad):
    cache, shipped = dirs
    write(measured.user_bench_path(0), bad)
    assert measured.latest_bench(0) is None
    write(shipped / "bench-T0.json", SHIPPED_BENCH)
    assert measured.latest_bench(0).shipped


def test_the_newer_of_tune_and_curve_only_wins_then_the_shipped_curve(dirs):
    cache, shipped = dirs
    write(shipped / "verify-cost.json", {"verify_cost": CURVE, "machine": {}})
    assert measured.latest_verify_cost().shipped
    write(cache / "tuned.json", {"verify_cost": dict(CURVE, prefix=1), "best": {}}, mtime=1_000_000)
    write(measured.user_verify_cost_path(), {"verify_cost": dict(CURVE, prefix=2)}, mtime=2_000_000)
    assert measured.latest_verify_cost().data["verify_cost"]["prefix"] == 2
    os.utime(cache / "tuned.json", (3_000_000, 3_000_000))
    found = measured.latest_verify_cost()
    assert found.data["verify_cost"]["prefix"] == 1 and not found.shipped


MALFORMED_CURVES = [
    None,
    {"ms": {}, "relative": {}},
    {"ms": {"1": 1.0}, "relative": {"2": 1.0}},
    {"ms": {"one": 1.0}, "relative": {"one": 1.0}},
    {"ms": {"0": 1.0}, "relative": {"0": 1.0}},
    {"ms": {"1": None}, "relative": {"1": 1.0}},
    {"ms": [1.0], "relative": [1.0]},
]


@pytest.mark.parametrize("bad", MALFORMED_CURVES, ids=range(len(MALFORMED_CURVES)))
def test_a_malformed_curve_is_skipped(dirs, bad):
    cache, shipped = dirs
    write(measured.user_verify_cost_path(), {"verify_cost": bad})
    assert measured.latest_verify_cost() is None
    write(measured.user_verify_cost_path(), {"verify_cost": CURVE, "machine": ["not", "a", "dict"]})
    assert measured.latest_verify_cost() is None
    write(shipped / "verify-cost.json", {"verify_cost": CURVE})
    assert measured.latest_verify_cost().shipped


def test_measured_is_frozen(dirs):
    _, shipped = dirs
    write(shipped / "bench-T0.json", SHIPPED_BENCH)
    found = measured.latest_bench(0)
    with pytest.raises(AttributeError):
        found.shipped = False


CEILING = {"prompts": 2, "chains": [1, 2], "target": 1.5, "machine": {}, "rows": {
    m: {"tokens_per_s": 300.0, "speedup": s, "ci": [s, s], "tau": t, "cycle_steps": c, "tau_needed": 1.5 * c}
    for m, s, t, c in (("plain", 1.0, 1.0, 1.0), ("foresight-1", 1.5, 2.0, 1.3), ("foresight-2", 1.9, 3.0, 1.5),
                       ("eagle-chain-1", 0.98, 1.4, 1.4), ("eagle-chain-2", 0.9, 1.5, 1.7), ("eagle", 1.03, 1.7, 1.6))}}


def test_the_repo_ships_a_valid_ceiling():
    found = measured._first_valid([(measured.SHIPPED_DIR / measured.CEILING_FILE, True)], measured._is_ceiling)
    assert found is not None and {"plain", "foresight-1", "eagle-chain-1", "eagle"} <= set(found.data["rows"])


def test_this_machines_ceiling_is_preferred_and_a_malformed_one_skipped(dirs):
    cache, shipped = dirs
    assert measured.latest_ceiling() is None
    write(shipped / measured.CEILING_FILE, CEILING)
    assert measured.latest_ceiling().shipped
    mine = write(cache / "bench" / measured.CEILING_FILE, CEILING | {"prompts": 80})
    found = measured.latest_ceiling()
    assert not found.shipped and found.path == mine and found.data["prompts"] == 80
    bad_count = {m: dict(r, flipped=None) for m, r in CEILING["rows"].items()}
    for broken in (CEILING | {"chains": [3]}, CEILING | {"chains": [1, 1]}, CEILING | {"chains": [0, 1]},
                   CEILING | {"rows": {"plain": CEILING["rows"]["plain"]}}, CEILING | {"rows": bad_count},
                   CEILING | {"target": "1.5"}, "not json", [1, 2]):
        write(mine, broken)
        assert measured.latest_ceiling().shipped, broken
