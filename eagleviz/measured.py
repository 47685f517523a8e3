"""Where the app finds measured speed: the user's own latest results first, then the ones shipped in the repo.

    bench          `python -m eagleviz bench` copies its result to <cache>/bench/bench-T{T}.json;
                   shipped: assets/bench/bench-T{T}.json
    verify cost    `python -m eagleviz tune` saves it in <cache>/tuned.json, `tune --curve-only` in
                   <cache>/verify-cost.json (the newer of the two wins); shipped: assets/bench/verify-cost.json
    ceiling        `python -m eagleviz ceiling` copies its result to <cache>/bench/ceiling-T0.json; shipped:
                   assets/bench/ceiling-T0.json
    tuned tree     `python -m eagleviz tune` saves the fastest tree in <cache>/tuned.json (T = 0) or
                   <cache>/tuned-T{T}.json (`tune --temperature T`, T > 0); shipped: assets/bench/tuned.json,
                   the fastest tree for the shipped head on the project's own CPU (the page's default tree
                   where this machine has not run `tune`)

<cache> is EAGLEVIZ_CACHE, default ~/.cache/eagleviz. Stdlib only (no torch): the page reads these files at
start-up without a model. A file that is missing, unreadable or not shaped like a result is skipped, never
raised: the next candidate is tried, and the finders return None when none is usable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from eagleviz.paths import SHIPPED_BENCH, cache_dir

SHIPPED_DIR = SHIPPED_BENCH
VERIFY_COST_FILE = "verify-cost.json"
TUNED_FILE = "tuned.json"
CEILING_FILE = "ceiling-T0.json"
TREE_KEYS = ("steps", "topk", "draft_tokens")



def bench_name(temperature: float) -> str:
    """The file name of a bench result: bench-T0.json, bench-T1.json, bench-T0.7.json."""
    return f"bench-T{temperature:g}.json"


def tuned_name(temperature: float) -> str:
    """The file name of a `tune` result: tuned.json at T = 0 (greedy), tuned-T1.json, tuned-T0.7.json."""
    return TUNED_FILE if temperature == 0 else f"tuned-T{temperature:g}.json"


def user_bench_path(temperature: float) -> Path:
    return cache_dir() / "bench" / bench_name(temperature)


def user_ceiling_path() -> Path:
    return cache_dir() / "bench" / CEILING_FILE


def user_verify_cost_path() -> Path:
    return cache_dir() / VERIFY_COST_FILE


@dataclass(frozen=True)
class Measured:
    """A result read from disk. `data` is the file's JSON object; `shipped` is True for the repo's own files."""

    data: dict
    path: Path
    shipped: bool
    modified: float = 0.0   # the file's mtime when it was read

    @property
    def origin(self) -> str:
        """Where the numbers come from, for the page."""
        if self.shipped:
            return f"shipped with eagleviz (`assets/bench/{self.path.name}`)"
        when = datetime.fromtimestamp(self.modified).strftime("%Y-%m-%d %H:%M")
        return f"measured on this machine (`{self.path}`, {when})"


def latest_bench(temperature: float) -> Measured | None:
    """The latest `bench` result at this temperature: this machine's, else the shipped one, else None."""
    return _first_valid([(user_bench_path(temperature), False), (SHIPPED_DIR / bench_name(temperature), True)],
                        _is_bench)


def latest_ceiling() -> Measured | None:
    """The latest `ceiling` result: this machine's, else the shipped one, else None. `data["rows"]` maps
    plain, foresight-k, eagle-chain-k and eagle to {"speedup", "ci", "tau", "cycle_steps", "tau_needed", ...}."""
    return _first_valid([(user_ceiling_path(), False), (SHIPPED_DIR / CEILING_FILE, True)], _is_ceiling)


def latest_verify_cost() -> Measured | None:
    """The latest verification cost curve: the newer of this machine's `tune` and `tune --curve-only` results,
    else the shipped one, else None. `data["verify_cost"]` is {"prefix", "ms": {n: ms}, "relative": {n: r}}
    (keys are strings once read back from JSON)."""
    mine = [p for p in (user_verify_cost_path(), cache_dir() / TUNED_FILE) if p.is_file()]
    mine.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return _first_valid([(p, False) for p in mine] + [(SHIPPED_DIR / VERIFY_COST_FILE, True)],
                        lambda d: _is_curve(d.get("verify_cost")) and isinstance(d.get("machine", {}), dict))


def tuned_tree(temperature: float = 0.0, shipped: bool = True) -> Measured | None:
    """The one reader of `tune` results: the fastest tree this machine measured at this temperature, else
    (T > 0) the one it measured at T = 0, else (with `shipped`, at T = 0) the shipped one, else None. Sampling
    accepts fewer drafted tokens than greedy decoding, so its fastest tree is often smaller: `tune --temperature
    T` measures it. `data["best"]` is {"steps", "topk", "draft_tokens"}; `tuned_config(result)` makes it a TreeConfig."""
    mine = [(cache_dir() / name, False) for name in dict.fromkeys((tuned_name(temperature), TUNED_FILE))]
    ours = [(SHIPPED_DIR / TUNED_FILE, True)] if shipped and temperature == 0 else []
    return _first_valid(mine + ours, _is_tree_result)


def default_tree() -> Measured | None:
    """The tree the page opens with: this machine's `tune` result at T = 0, else the shipped one, else None."""
    return tuned_tree(0.0)


def tuned_config(result: Measured):
    """A tuned result's best tree as a TreeConfig: a fixed tree, as `tune` measured it."""
    from eagleviz.config import TreeConfig

    return TreeConfig.create(**{k: result.data["best"][k] for k in TREE_KEYS}, adaptive=False)


def _is_tree_result(d: dict) -> bool:
    """{"best": {"steps", "topk", "draft_tokens"}} naming a tree the knobs allow, as SGLang would run it."""
    from eagleviz.config import TreeConfig

    best = d.get("best")
    if not isinstance(best, dict) or not all(type(best.get(k)) is int for k in TREE_KEYS):
        return False
    try:
        return not TreeConfig.create(**{k: best[k] for k in TREE_KEYS}).adjustments
    except ValueError:
        return False


def _first_valid(candidates: list[tuple[Path, bool]], valid) -> Measured | None:
    for path, shipped in candidates:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            modified = path.stat().st_mtime
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(data, dict) and valid(data):
            return Measured(data, path, shipped, modified)
    return None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_bench(d: dict) -> bool:
    """The fields the page draws from: rows of numbers, the reference, prompts, sampling, machine, tree and
    mismatches."""
    rows = d.get("rows")
    if not isinstance(rows, dict) or not rows or not all(_is_row(r) for r in rows.values()):
        return False
    tree, mismatches = d.get("tree"), d.get("greedy_mismatches", [])
    if tree is not None and not (isinstance(tree, dict) and all(_number(tree.get(k)) for k in TREE_KEYS)):
        return False
    return (isinstance(d.get("reference"), str) and _number(d.get("prompts"))
            and isinstance(d.get("sampling"), dict) and _number(d["sampling"].get("temperature"))
            and isinstance(d.get("machine"), dict) and isinstance(mismatches, list)
            and all(isinstance(m, dict) and isinstance(m.get("method"), str) and _number(m.get("top2_gap"))
                   for m in mismatches))


def _is_row(row) -> bool:
    """tokens_per_s and speedup numbers, tau a number or None, phase_ms a dict of numbers."""
    if not (isinstance(row, dict) and _number(row.get("tokens_per_s")) and _number(row.get("speedup"))):
        return False
    phases = row.get("phase_ms", {})
    return ((row.get("tau") is None or _number(row["tau"])) and isinstance(phases, dict)
            and all(_number(v) for v in phases.values()))


def _is_ceiling(d: dict) -> bool:
    """Rows of numbers with a plain row, the chains they measured, the target speedup, prompts and machine."""
    rows, chains = d.get("rows"), d.get("chains")
    keys = ("tokens_per_s", "speedup", "tau", "cycle_steps", "tau_needed")
    if not isinstance(rows, dict) or "plain" not in rows or not isinstance(chains, list) or not chains:
        return False
    if not all(isinstance(r, dict) and all(_number(r.get(k)) for k in keys) and _number(r.get("flipped", 0))
               for r in rows.values()):
        return False
    if not all(type(k) is int and k > 0 and f"foresight-{k}" in rows for k in chains) or len(set(chains)) < len(chains):
        return False
    return _number(d.get("target")) and _number(d.get("prompts")) and isinstance(d.get("machine"), dict)


def _is_curve(c) -> bool:
    """{"ms": {n: ms}, "relative": {n: r}} with the same positive integer n (int or string keys), finite values."""
    if not isinstance(c, dict) or not isinstance(c.get("ms"), dict) or not isinstance(c.get("relative"), dict):
        return False
    if not c["ms"] or c["ms"].keys() != c["relative"].keys():
        return False
    try:
        sizes = [int(n) for n in c["ms"]]
    except (TypeError, ValueError):
        return False
    return min(sizes) > 0 and all(_number(v) for v in [*c["ms"].values(), *c["relative"].values()])
