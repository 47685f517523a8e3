"""eagleviz/app/scheduler.py: runs take turns at the model first come, first served, one step per turn, so
active runs advance round-robin; the page's runs go through it (every first figure before any run ends)."""

from __future__ import annotations

import threading
import time

import pytest

from eagleviz.app.limits import Limits
from eagleviz.app.scheduler import Turns
from eagleviz.app.session import SHARED_NOTE, EngineHub, Knobs, stream_run
from tiny import tiny_engine


def steps(name: str, n: int, log: list, gate=None):
    """A run of n steps that records each one; the first waits for `gate` (so that the others are in line)."""
    for i in range(n):
        if i == 0 and gate is not None:
            gate()
        log.append((name, i))
        yield i


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_active_runs_advance_round_robin():
    turns, log = Turns(1), []
    gate = threading.Event()
    threads = [threading.Thread(target=lambda: list(turns.steps(steps("a", 3, log, gate.wait))))]
    threads[0].start()
    wait_for(lambda: log == [] and turns.waiting == 0)   # a holds the turn, waiting at its gate
    for name in "bc":  # b then c join the line while a steps
        threads.append(threading.Thread(target=lambda n=name: list(turns.steps(steps(n, 3, log)))))
        threads[-1].start()
        wait_for(lambda k=len(threads) - 1: turns.waiting == k)
    gate.set()
    for t in threads:
        t.join(10)
    assert log == [(n, i) for i in range(3) for n in "abc"]


def test_waiting_and_stepping_are_counted_apart():
    ticks = iter(range(0, 1000, 10))
    turns = Turns(1, clock=lambda: next(ticks))
    paced = turns.steps(iter("xy"))
    assert list(paced) == ["x", "y"]
    # each turn reads the clock four times: asked, granted, step start, step end (10 s apart here)
    assert (paced.waited_s, paced.busy_s) == (30, 30)


def test_slots_run_side_by_side_and_alone_excludes_everyone():
    turns = Turns(2)
    inside, peak, lock = [0], [0], threading.Lock()

    def work():
        with turns.turn():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2
    with turns.alone():
        t = threading.Thread(target=work)
        t.start()
        time.sleep(0.1)
        assert inside[0] == 0          # nothing steps while the race is timed
    t.join(10)
    with pytest.raises(ValueError):
        Turns(0)


def test_a_run_counts_its_own_time_and_says_how_long_it_waited():
    """The wall time of a run that shared the model is its own turns' time (tokens/s are the decoding's), and
    its trace says how long it waited."""
    hub = EngineHub(tiny_engine("llama", vocab=8), model_id="tiny")
    turns = Turns(1)
    knobs = Knobs(3, 2, 6, max_new_tokens=8, adaptive=False)
    stream = stream_run(hub, "a prompt", knobs, turns=turns)
    run, _ = next(stream)
    with turns.turn():           # another run holds the model for 1.2 s before this one's first step
        blocker = threading.Thread(target=lambda: [None for _ in stream])
        blocker.start()
        time.sleep(1.2)
    blocker.join(30)
    assert run.stop_reason == "max_new_tokens" and run.wall_s < 1.0
    assert any(n.startswith(SHARED_NOTE) and "waited 1." in n for n in run.notes), run.notes
    alone = list(stream_run(hub, "a prompt", knobs))[-1][0]
    assert not any(n.startswith(SHARED_NOTE) for n in alone.notes)


@pytest.mark.parametrize("queued", [False, True])
def test_the_pages_runs_take_one_cycle_a_turn_resting_ones_too(monkeypatch, queued):
    """A page's run yields each cycle from its own turn, resting ones too: a CPU's stretch of plain steps
    (`Engine.speculate`'s rest_batch) would hold the shared line for 16 of them. On a GPU (`steps.queued`, here a
    CPU's steps and engine marked so) a stretch yields each cycle as it goes, with the next step launched before:
    two forwards in a stretch's first turn, none in its last, one in each other."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.decoding.policy import Ledger
    from eagleviz.models.static import EagerSteps

    monkeypatch.setattr(Ledger, "for_run", classmethod(  # the head rests
        lambda cls, greedy, pays=True, lookups=False, gpu=False: cls(doubt=True, lookups=lookups)))
    engine = tiny_engine("llama", vocab=64)
    hub = EngineHub(engine, model_id="tiny")
    forwards, per_turn = [], []
    init, forward = EagerSteps.__init__, EagerSteps.forward

    def marked(self, *a, **k):
        init(self, *a, **k)
        self.queued = queued

    monkeypatch.setattr(EagerSteps, "__init__", marked)
    monkeypatch.setattr(EagerSteps, "forward", lambda *a, **k: forwards.append(1) or forward(*a, **k))
    monkeypatch.setattr(Engine, "queued", queued)  # what the page reads to choose
    stream = stream_run(hub, "a prompt", Knobs(3, 2, 6, max_new_tokens=40), turns=Turns(1))
    run, _ = next(stream)
    for _, cycle in stream:
        per_turn.append(len(forwards))
        forwards.clear()
    assert len(run.cycles) > 30 and all(c.num_tree_tokens == 1 for c in run.cycles)
    if not queued:
        assert per_turn[1:] == [1] * (len(per_turn) - 1)  # after the first (with the prefill), one forward a turn
    else:  # a stretch's first turn launches its first two steps, its last launches none
        assert max(per_turn) == 2 and per_turn.count(0) >= 2 and sum(per_turn) == len(per_turn) == len(run.cycles)


def test_the_run_time_limit_counts_the_runs_own_time_not_its_wait():
    hub = EngineHub(tiny_engine("llama", vocab=8), model_id="tiny")
    turns = Turns(1)
    knobs = Knobs(3, 2, 6, max_new_tokens=8, adaptive=False)
    stream = stream_run(hub, "a prompt", knobs, Limits(max_run_seconds=1), turns=turns)
    run, _ = next(stream)
    with turns.turn():
        blocker = threading.Thread(target=lambda: [None for _ in stream])
        blocker.start()
        time.sleep(1.5)          # longer than the limit, spent waiting: not counted
    blocker.join(30)
    assert run.stop_reason == "max_new_tokens"


def slow_cycles(engine, seconds: float):
    """The engine with every cycle taking `seconds` more: long enough to see the order of events."""
    speculate = engine.speculate

    def slow(*args, **kwargs):
        for cycle in speculate(*args, **kwargs):
            time.sleep(seconds)
            yield cycle

    engine.speculate = slow
    return engine


@pytest.mark.parametrize("active_runs", [8, 1])
def test_the_pages_runs_show_their_first_cycle_before_any_run_ends(active_runs):
    """Six visitors press Run at once, through the page's own streaming endpoint. Taking turns (8 active
    runs), every first figure arrives before the first run finishes; first come, first served (1 active run),
    the last visitor's first figure waits for the runs before it."""

    from eagleviz.app.ui import build_app
    from servers import client, serving

    hub = EngineHub(slow_cycles(tiny_engine("llama", vocab=8), 0.05), model_id="tiny")
    limits = Limits(active_runs=active_runs, queue_size=16)
    first, done, barrier = {}, {}, threading.Barrier(6)
    with serving(build_app(hub, limits=limits)) as url:
        clients = [client(url) for _ in range(6)]

        def visit(i):
            barrier.wait()
            job = clients[i].submit(None, f"visitor {i}", 3, 2, 6, 0.0, 1.0, 12, 0, "auto", False, "eagle",
                                    api_name="/run")
            status = ""
            for out in job:
                status = str(out[1])
                if i not in first and status.startswith("Running\u2026 cycle"):
                    first[i] = time.monotonic()
            if status.startswith("Done"):
                done[i] = time.monotonic()

        threads = [threading.Thread(target=visit, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(first) == len(done) == 6
    if active_runs > 1:
        assert max(first.values()) < min(done.values())
    else:
        assert max(first.values()) > min(done.values())


def test_a_runs_first_step_goes_ahead_of_other_runs_later_steps():
    turns, order = Turns(1), []

    def step(name, first):
        with turns.turn(first=first):
            order.append(name)

    with turns.turn():             # the model is busy; three later steps, then a newcomer's first step, queue
        threads = []
        for name, first in (("a2", False), ("b2", False), ("c1", True), ("d1", True)):
            threads.append(threading.Thread(target=step, args=(name, first)))
            threads[-1].start()
            wait_for(lambda k=len(threads): turns.waiting == k)
    for t in threads:
        t.join(10)
    assert order == ["c1", "d1", "a2", "b2"]
