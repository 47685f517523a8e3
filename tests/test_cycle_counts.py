"""eagleviz/perf/cycle_counts.py: what a decode asks of the device, counted after the prefill, over a tiny model's
static steps (`Recording` standing in for the graphs' capture, tests/tiny.py). On a CPU the runtime calls and the
sync debug mode see nothing: what is proved here is what the counts are counted over and the A/B they time."""

from __future__ import annotations

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.models.draft import random_head
from eagleviz.models.target import TargetModel
from eagleviz.perf.cycle_counts import after_first, counts, sync_warnings
from tiny import Recording, tiny_target

PROMPT = "12345 1234 123"


def engine() -> Engine:
    t = tiny_target()
    target = TargetModel(t.hf, t.tokenizer, t.name, fused=False)
    e = Engine(target, random_head(target, "eagle1", seed=1, std=0.5), "random", decode="static",
               compiled_sampling=False, ledger=False)
    e.make_graphs = Recording
    return e


def test_a_fixed_trees_drafted_cycles_are_counted_after_the_first_and_both_arms_decode_the_same():
    e = engine()
    tree = TreeConfig.create(3, 2, 6, adaptive=False, source="eagle")
    out, table = counts(e, PROMPT, tree, 20, repeats=2)
    full = e.generate(PROMPT, tree, SamplingConfig(max_new_tokens=20))
    assert out["per"] == "drafted cycle" and out["decode"] == "static"
    assert out["cycles"] == len(full.cycles) and out["units"] == sum(len(c.tokens) > 1 for c in full.cycles[1:])
    assert out["units"] > 1
    assert set(out["ms"]) == {"device", "host"} and all(v > 0 for v in out["ms"].values())
    assert out["tau"]["device"] == out["tau"]["host"]  # the device's choices are the host's
    assert not any(out["each"].values()) and out["sync_messages"] == []  # a CPU: no runtime call, no CUDA sync
    assert "aten::" in table


def test_the_cost_aware_trees_drafted_cycles_are_counted_with_its_head_drafting_each():
    e = engine().with_ledger(True)  # (the count turns the books off itself)
    tree = TreeConfig.create(3, 2, 4, source="eagle")
    out, _ = counts(e, PROMPT, tree, 10, repeats=1)
    full = e.with_ledger(False).generate(PROMPT, tree, SamplingConfig(max_new_tokens=10))
    assert out["cycles"] == len(full.cycles) and out["units"] == len(full.cycles) - 1 > 1  # every cycle drafted
    assert out["tau"]["device"] == out["tau"]["host"]


def test_a_plain_run_is_counted_per_token_after_its_first():
    e = engine()
    run, units, seconds, box = after_first(e, PROMPT, None, SamplingConfig(max_new_tokens=9),
                                           lambda: sync_warnings(False))
    assert units == len(run.output) - 1 == 8 and seconds > 0 and box == {"count": 0, "messages": []}


def test_with_device_cycle_is_a_view_that_leaves_the_engine_as_it_was():
    e = engine()
    host = e.with_device_cycle(False)
    assert e.device_cycle and not host.device_cycle
    assert host.target is e.target and host.head is e.head and host.pool is e.pool
