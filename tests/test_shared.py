"""Identical runs asked for at once are decoded once (`eagleviz.app.shared`)."""

from __future__ import annotations

import threading
import time

import pytest

from eagleviz.app.shared import SHARED_RUN_NOTE, SharedRuns, sent_once, snapshot
from eagleviz.trace import RunTrace


def bare_run() -> RunTrace:
    return RunTrace(prompt="p", prompt_tokens=1, config={}, seed=0, device="cpu", dtype="float32", attn_impl="torch",
                    model="m", head="h")


class Source:
    """A run's generator stand-in: yields (run, None) then (run, i) for i < n, counting starts, closes and the
    most threads ever inside it at once."""

    def __init__(self, n: int, pause: float = 0.0, fail_at: int | None = None):
        self.n, self.pause, self.fail_at = n, pause, fail_at
        self.starts = self.closed = self.inside = self.most_inside = 0
        self.runs: list[RunTrace] = []
        self._lock = threading.Lock()

    def _enter(self):
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)

    def _exit(self):
        with self._lock:
            self.inside -= 1

    def __call__(self):
        self.starts += 1
        run = bare_run()
        self.runs.append(run)

        def gen():
            try:
                yield run, None
                for i in range(self.n):
                    self._enter()
                    try:
                        time.sleep(self.pause)
                        if i == self.fail_at:
                            raise ValueError("the run's own error")
                        run.cycles.append(i)
                    finally:
                        self._exit()
                    yield run, i
            finally:
                self.closed += 1

        return gen()


def cycles(events) -> list:
    return [c for _, c in events]


def test_two_viewers_of_one_key_read_one_run_made_once():
    shared, source = SharedRuns(), Source(5)
    a, b = shared.stream("k", source), shared.stream("k", source)
    first_a, first_b = next(a), next(b)
    assert first_a[0] is first_b[0] and source.starts == 1
    rest_a, rest_b = list(a), list(b)
    assert cycles([first_a] + rest_a) == cycles([first_b] + rest_b) == [None, 0, 1, 2, 3, 4]
    assert source.starts == 1 and source.closed == 1
    run = first_a[0]
    assert run.cycles == [0, 1, 2, 3, 4]
    assert [n for n in run.notes if n.startswith(SHARED_RUN_NOTE)] == [
        f"{SHARED_RUN_NOTE}: 2 visitors asked for this same run (model, prompt and knobs) while it ran; it was decoded "
        "once and shown to each."]
    assert shared.going == 0


def test_a_lone_run_says_nothing_of_sharing_and_different_keys_run_apart():
    shared, source = SharedRuns(), Source(3)
    a, b = shared.stream("k", source), shared.stream("other", source)
    assert cycles(a) == cycles(b) == [None, 0, 1, 2]
    assert source.starts == 2 and all(run.notes == [] for run in source.runs)


def test_a_viewer_who_joins_mid_run_gets_every_event_so_far_then_the_rest():
    shared, source = SharedRuns(), Source(6)
    a = shared.stream("k", source)
    seen_a = [next(a) for _ in range(4)]   # (run, None), cycles 0-2
    b = shared.stream("k", source)
    assert cycles([next(b) for _ in range(4)]) == cycles(seen_a)  # at once: nothing more was decoded for them
    assert source.runs[0].cycles == [0, 1, 2]
    assert cycles(list(b)) == [3, 4, 5] and cycles(list(a)) == [3, 4, 5] and source.starts == 1


def test_a_viewer_who_leaves_leaves_the_run_going_for_the_others_and_the_last_one_closes_it():
    shared, source = SharedRuns(), Source(8)
    a, b = shared.stream("k", source), shared.stream("k", source)
    next(a), next(b), next(a), next(b)
    a.close()   # a Stop on one page
    assert source.closed == 0 and shared.going == 1
    assert cycles(list(b)) == [1, 2, 3, 4, 5, 6, 7]
    c, d = shared.stream("k2", source), shared.stream("k2", source)
    next(c), next(c), next(d)
    c.close()
    d.close()   # the last viewer gone: the run is closed there, as a lone run is
    assert source.closed == 2 and source.runs[1].cycles == [0] and shared.going == 0


def test_a_finished_run_is_not_served_again():
    shared, source = SharedRuns(), Source(2)
    list(shared.stream("k", source))
    assert cycles(shared.stream("k", source)) == [None, 0, 1] and source.starts == 2


def test_the_runs_error_reaches_every_viewer():
    shared, source = SharedRuns(), Source(5, fail_at=2)
    a, b = shared.stream("k", source), shared.stream("k", source)
    next(a), next(b)
    for viewer in (a, b):
        with pytest.raises(ValueError, match="own error"):
            list(viewer)
    assert source.starts == 1


def test_viewers_on_threads_read_the_same_run_advanced_by_one_at_a_time():
    shared, source = SharedRuns(), Source(20, pause=0.005)
    got: dict[int, list] = {}
    barrier = threading.Barrier(6)

    def viewer(k: int) -> None:
        barrier.wait()
        got[k] = cycles(shared.stream("k", source))

    threads = [threading.Thread(target=viewer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert source.starts == 1 and source.most_inside == 1
    assert all(seen == [None, *range(20)] for seen in got.values()) and len(got) == 6


def test_a_snapshot_stays_as_it_was_while_the_run_goes_on():
    run = bare_run()
    run.cycles.append(0)
    copy = snapshot(run)
    copy.stop_reason = "stopped by the user"
    run.cycles.append(1)
    run.notes.append("later")
    assert copy.cycles == [0] and copy.notes == [] and run.stop_reason == ""


def test_a_value_made_once_for_a_runs_viewers_and_each_time_for_any_other_run():
    shared, source = SharedRuns(), Source(3)
    made = []

    def make():
        made.append(1)
        return object()

    a, b = shared.stream("k", source), shared.stream("k", source)
    (run, _), _ = next(a), next(b)
    assert shared.viewers(run) == 2 and shared.viewers(bare_run()) == 1
    first = shared.once(run, "views", make)
    assert shared.once(run, "views", make) is first and len(made) == 1
    assert shared.once(run, "other", make) is not first and len(made) == 2
    list(a), list(b)
    assert shared.once(run, "views", make) is not first and len(made) == 3   # the run is over: made again
    stray = bare_run()
    assert shared.once(stray, "views", make) is not shared.once(stray, "views", make)


def test_sent_once_serialises_a_pictures_figures_once():
    import plotly.graph_objects as go
    from gradio.components.plot import PlotData

    figure = go.Figure(go.Bar(y=[1, 2]))
    sent = sent_once((figure, "words", None))
    assert isinstance(sent[0], PlotData) and sent[0].plot == figure.to_json() and sent[1:] == ("words", None)
