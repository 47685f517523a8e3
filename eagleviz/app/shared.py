"""What many pages are sent, made once: identical runs asked for at once decoded once (a visitor who presses Run
with the model, prompt and knobs of a run that is going joins it instead of starting another), and a picture's
figures serialised once for everyone it is sent to.

    SharedRuns()                 one per server, beside its line to the model (`scheduler.Turns`)
    SharedRuns.stream(key, start)
                                 the run's events, (run, None) then (run, cycle) per cycle, as `start()` yields
                                 them: every event so far at once, then each as it comes; `start` is called only
                                 where no run of `key` is going
    SharedRuns.once(run, what, make)
                                 make() for a run going now, made by its first viewer, the same value for the others
    SharedRuns.viewers(run)      how many pages read a run now
    sent_once(values, components)
                                 a picture's values as Gradio sends them, for many pages (a room's followers, a
                                 shared run's viewers)

Why: a workshop's "now everyone press Run" is mostly one preset thirty times (docs/performance.md entries 50 and
69). Each of those runs would write the same tokens (greedy, or sampled from the same seed) through thirty first
steps one after another on a CPU, the last visitor waiting for all of them. Joined, the thirty first figures wait
for one first step. What a joiner sees is the run the engine made: its trees, verdicts and timings are that run's,
and the run says how many visitors it was shown to (`SHARED_RUN_NOTE`).

The run's generator is advanced by whichever viewer needs the next event first (never by two at once), so a run
goes on while any viewer is still reading it; when the last viewer leaves (a Stop, a closed page), it is closed,
as a lone run is. A viewer that stops keeps a copy of the run as it was (`snapshot`): the others' run goes on.
An error raised by the run reaches every viewer. A finished run is not served again: the next request starts a
new one.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence

import gradio as gr
import plotly.graph_objects as go
from gradio.components.plot import PlotData
from gradio.data_classes import GradioModel, GradioRootModel

from eagleviz.trace import CycleTrace, RunTrace

Event = tuple[RunTrace, CycleTrace | None]

SHARED_RUN_NOTE = "Shared run"


def sent_once(values: tuple, components: Sequence[gr.components.Component] | None = None) -> tuple:
    """A picture's values as Gradio sends them, made once for many pages: each page's answer would otherwise
    serialise the same figures again, thirty pages thirty times over. With the output components: each value as
    its component's postprocess makes it (the picture's event then runs with `postprocess=False`: nothing of it is
    processed again per page, no thread hop per output); without: the figures' JSON (`PlotData`, which a plot's
    postprocess passes on as it is). Updates (a component) and states go as they are: Gradio applies those
    itself."""
    if components is None:
        return tuple(PlotData(type="plotly", plot=v.to_json()) if isinstance(v, go.Figure) else v for v in values)
    return tuple(v if isinstance(v, (gr.blocks.Block, dict)) or c.stateful else _dumped(c.postprocess(v))
                 for c, v in zip(components, values, strict=True))


def _dumped(value):
    return value.model_dump() if isinstance(value, (GradioModel, GradioRootModel)) else value


def snapshot(run: RunTrace) -> RunTrace:
    """The run as it is now, apart from the run that goes on (its cycles, tokens and notes lists copied)."""
    return dataclasses.replace(run, cycles=list(run.cycles), output=list(run.output), notes=list(run.notes))


class _Flight:
    """One run's events, made once and read by every viewer."""

    def __init__(self, start: Callable[[], Iterator[Event]]):
        self._start, self._gen = start, None
        self._cond = threading.Condition()
        self.events: list[Event] = []
        self.done, self.error, self.pulling = False, None, False
        self.viewers = self.joined = 0
        self.made: dict[Hashable, object] = {}   # `SharedRuns.once`'s values

    def get(self, i: int) -> Event | None:
        """Event i, waiting for it (or making it: the first viewer to need it advances the run); None past the end."""
        with self._cond:
            while i >= len(self.events) and not self.done:
                if self.pulling:
                    self._cond.wait()
                    continue
                self.pulling = True
                self._cond.release()
                try:
                    if self._gen is None:
                        self._gen = self._start()
                    event = next(self._gen)
                except StopIteration:
                    event = None
                except BaseException as exc:  # (the run's own error, for every viewer)
                    event, self.error = None, exc
                finally:
                    self._cond.acquire()
                    self.pulling = False
                if event is None:
                    self._end()
                else:
                    self.events.append(event)
                self._cond.notify_all()
            if i < len(self.events):
                return self.events[i]
            if self.error is not None:
                raise self.error
            return None

    def _end(self) -> None:
        """With the lock held: the run is over; where more than one visitor watched it, it says so."""
        self.done = True
        if self.joined > 1 and self.events and self.error is None:
            self.events[-1][0].notes.append(f"{SHARED_RUN_NOTE}: {self.joined} visitors asked for this same run "
                                            "(model, prompt and knobs) while it ran; it was decoded once and shown "
                                            "to each.")

    def leave(self) -> bool:
        """A viewer is gone; True when it was the last of a run not finished (closed now)."""
        with self._cond:
            self.viewers -= 1
            if self.viewers or self.done:
                return False
            self.done = True
            gen, self._gen = self._gen, None
        if gen is not None:
            gen.close()
        return True


class SharedRuns:
    """The runs going now, by what they were asked with (thread-safe; one per server)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._going: dict[Hashable, _Flight] = {}
        self._runs: dict[int, _Flight] = {}   # id of a run going -> its flight (`once`)

    def stream(self, key: Hashable, start: Callable[[], Iterator[Event]]) -> Iterator[Event]:
        with self._lock:
            flight = self._going.get(key)
            if flight is None or flight.done:
                flight = self._going[key] = _Flight(start)
            with flight._cond:
                flight.viewers += 1
                flight.joined += 1
        i = 0
        try:
            while (event := flight.get(i)) is not None:
                if i == 0:
                    with self._lock:
                        self._runs[id(event[0])] = flight
                yield event
                i += 1
        finally:
            flight.leave()
            with self._lock, flight._cond:
                if self._going.get(key) is flight and flight.done:
                    del self._going[key]
                if flight.done and not flight.viewers and flight.events:
                    self._runs.pop(id(flight.events[0][0]), None)

    def viewers(self, run: RunTrace) -> int:
        """How many pages read this run now (1 for a run this server is not streaming)."""
        with self._lock:
            flight = self._runs.get(id(run))
        if flight is None or not flight.events or flight.events[0][0] is not run:
            return 1
        with flight._cond:
            return max(flight.viewers, 1)

    def once(self, run: RunTrace, what: Hashable, make: Callable[[], object]) -> object:
        """`make()` for a run this server is streaming now (`what`: which value), made by the first of its viewers
        to ask and the same object for the others, while it goes; made each time for any other run."""
        with self._lock:
            flight = self._runs.get(id(run))
        if flight is None or not flight.events or flight.events[0][0] is not run:
            return make()
        with flight._cond:   # (made under the run's lock: its other viewers wait for this value, not make it)
            if what not in flight.made:
                flight.made[what] = make()
            return flight.made[what]

    @property
    def going(self) -> int:
        """Runs going now."""
        with self._lock:
            return sum(not f.done for f in self._going.values())
