"""A report made of sections (gpu-check's), each passed, failed or skipped with why, and the time budget the
sections share.

A section is a dict: {"skipped": why} where it could not run; {"ok": False, "error": ...} where it raised;
else its results, with "ok" where it checks something, and any of its parts (a dtype, an attention
implementation) a dict of the same kind. `summary` and `describe` read a verdict from that shape.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from eagleviz.errors import UserFacingError


@dataclass(frozen=True)
class Budget:
    """The check's time: `seconds` from its start on `clock`. `spent()` is None while time is left, else the
    reason a part that has not started is skipped."""

    seconds: float = math.inf
    clock: Callable[[], float] = time.perf_counter
    start: float = field(init=False)

    def __post_init__(self):
        if not self.seconds >= 0:  # NaN included
            raise ValueError(f"a time budget is 0 s or more, got {self.seconds}")
        object.__setattr__(self, "start", self.clock())  # frozen: set once, here

    def elapsed(self) -> float:
        return self.clock() - self.start

    def spent(self) -> str | None:
        if self.elapsed() < self.seconds:
            return None
        return f"not started: the time budget (--budget-s {self.seconds:g}) was spent"

    def used(self) -> str:
        """'45 s of the 120 s budget' (without a budget: '45 s')."""
        return f"{self.elapsed():.0f} s" + ("" if math.isinf(self.seconds) else f" of the {self.seconds:g} s budget")


def skipped(why: str) -> dict:
    """A section (or part of one) that cannot run here, and why."""
    return {"skipped": why}


def each_part(names, run: Callable[[str], dict], budget: Budget = Budget()) -> dict:
    """`run(name)` for each name, each part on its own: a model that cannot load here is skipped with its
    reason (e.g. its package is not installed), an error fails that part only, and a part not started once
    `budget` is spent is skipped with that reason."""
    out = {}
    for name in names:
        if why := budget.spent():
            out[name] = skipped(why)
            continue
        try:
            out[name] = run(name)
        except UserFacingError as exc:
            out[name] = skipped(str(exc))
        except Exception as exc:  # e.g. out of memory in one dtype: the others still run
            out[name] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
    return out


def _skips(section: dict, where: str = "") -> list[tuple[str, str]]:
    """(where, why) of every skipped part of a section ("" where the whole section is skipped)."""
    if "skipped" in section:
        return [(where, section["skipped"])]
    return [s for key, part in section.items() if isinstance(part, dict)
            for s in _skips(part, f"{where}.{key}" if where else key)]


def _reasons(skips: list[tuple[str, str]]) -> list[str]:
    """One `why` when every part was skipped for the same reason, else `part: why` for each."""
    if len({why for _, why in skips}) == 1:
        return [skips[0][1]]
    return [f"{where}: {why}" for where, why in skips]


def _failed(section: dict) -> bool:
    if "skipped" in section:
        return False
    if "ok" in section:
        return not section["ok"]
    return any(_failed(v) for v in section.values() if isinstance(v, dict) and ("ok" in v or "error" in v))


def _ran(section: dict) -> bool:
    """Whether anything in the section was measured (not every part skipped)."""
    if "skipped" in section:
        return False
    parts = [v for k, v in section.items() if isinstance(v, dict) and k != "settings"]
    return not parts or any("skipped" not in v for v in parts)


def describe(section: dict) -> str:
    """One line: passed, FAILED, or skipped: why (with the skipped parts of a section that ran)."""
    if _failed(section):
        return "FAILED" + (f" ({section['error']})" if "error" in section else "")
    skips = _skips(section)
    if not _ran(section):
        return "skipped: " + "; ".join(_reasons(skips))
    return "passed" + (f" (skipped {'; '.join(f'{where}: {why}' for where, why in skips)})" if skips else "")


def summary(sections: dict[str, dict]) -> dict:
    """The sections that passed and failed, and `section: why` or `section.part: why` for what was skipped."""
    out = {"passed": [], "failed": [], "skipped": []}
    for name, section in sections.items():
        skips = _skips(section)
        if _failed(section):
            out["failed"].append(name)
        elif _ran(section):
            out["passed"].append(name)
            out["skipped"] += [f"{name}.{where}: {why}" for where, why in skips]
        else:
            out["skipped"] += [f"{name}: {why}" for why in _reasons(skips)]
    return out
