"""Fair turns at the model: many runs active at once, each advancing one step (the prefill with the first cycle,
then one cycle) per turn, in the order they asked for it.

    Turns(slots)        a first-come-first-served line for `slots` steps at a time (EAGLEVIZ_CONCURRENCY)
    Turns.steps(gen)    the same generator, each `next()` taken in a turn; the time spent waiting in the line and
                        the time spent stepping are counted (`Paced.waited_s`, `Paced.busy_s`)
    Turns.alone()       every slot at once, for work that must be timed alone (the race)

Why: the engine is a generator that yields one CycleTrace per speculation cycle, and a page's run holds the
model for its whole length when served first-come-first-served: with thirty visitors clicking at the same
moment, the median waited 17.5 s before its first figure. Taking turns cycle by cycle is round-robin: a run
that has stepped goes back to the end of the line, so each of N active runs advances once per N steps. A
run's first step (its prefill and first cycle, which bring its first figures) goes ahead of the other runs'
later steps, so a visitor who arrives while others are mid-run waits only for the first steps before his. The model does the same work
in the same total time (one step at a time, as before: concurrent forwards on a CPU slow each other far more
than they gain, docs/performance.md section 1), so the last run ends when it would have ended anyway.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Turns:
    """A first-come-first-served line for `slots` concurrent steps. Thread-safe; one per model."""

    def __init__(self, slots: int = 1, clock: Callable[[], float] = time.perf_counter):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots, self._clock = slots, clock
        self._lock = threading.Lock()
        # (ticket, slots it needs) in arrival order: first steps (a run's prefill and first cycle) ahead of the
        # rest. A ticket is a condition on the one lock: only the head of the line is woken, not every waiter.
        self._first: deque[tuple[threading.Condition, int]] = deque()
        self._line: deque[tuple[threading.Condition, int]] = deque()
        self._busy = 0

    @property
    def waiting(self) -> int:
        """Steps waiting in line now."""
        with self._lock:
            return len(self._first) + len(self._line)

    def _head(self) -> deque:
        return self._first if self._first else self._line

    def _wake_head(self) -> None:
        """Called with the lock held: the step at the head of the line checks whether it may go."""
        head = self._head()
        if head:
            head[0][0].notify()

    @contextmanager
    def turn(self, need: int = 1, first: bool = False) -> Iterator[float]:
        """Hold `need` slots (at most `slots`) for the body, after everyone who asked before (a `first` step:
        after the first steps that asked before, ahead of later steps); yields the seconds spent waiting."""
        need = min(need, self.slots)
        asked = self._clock()
        ticket = threading.Condition(self._lock)
        line = self._first if first else self._line
        with self._lock:
            line.append((ticket, need))
            while self._head()[0][0] is not ticket or self._busy + need > self.slots:
                ticket.wait()
            self._head().popleft()
            self._busy += need
            self._wake_head()  # the next in line may fit in the slots left
        try:
            yield self._clock() - asked
        finally:
            with self._lock:
                self._busy -= need
                self._wake_head()

    def alone(self):
        """Every slot: nothing else steps while the body runs (for timings that must not be shared)."""
        return self.turn(self.slots)

    def steps(self, gen: Iterator[T]) -> Paced[T]:
        return Paced(self, gen)


class Paced(Generic[T]):
    """A generator stepped in turns. `waited_s`: time spent in line; `busy_s`: time spent stepping (the run's
    own share of the model)."""

    def __init__(self, turns: Turns, gen: Iterator[T]):
        self._turns, self._gen = turns, gen
        self._steps = 0
        self.waited_s = 0.0
        self.busy_s = 0.0

    def __iter__(self) -> Paced[T]:
        return self

    def __next__(self) -> T:
        with self._turns.turn(first=self._steps == 0) as waited:
            self._steps += 1
            self.waited_s += waited
            start = self._turns._clock()
            try:
                return next(self._gen)
            finally:
                self.busy_s += self._turns._clock() - start

    def close(self) -> None:
        close = getattr(self._gen, "close", None)
        if close is not None:
            close()
