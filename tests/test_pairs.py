"""eagleviz/app/pairs.py: the operator's model/head pairs, chosen by name only, one held in memory at a time."""

from __future__ import annotations

import json
import threading
import time

import pytest

from eagleviz.errors import UserFacingError
from eagleviz.app.pairs import EMBEDDED_PAIR, Pair, PairHub, pairs_from_env, read_pairs


class Memory:
    """A fake device: what is loaded, the most ever resident at once, and loads that fail."""

    def __init__(self, fail: dict[str, Exception] | None = None):
        self.live: set[str] = set()
        self.most = 0
        self.loads: list[str] = []
        self.fail = fail or {}

    def load(self, pair: Pair):
        self.loads.append(pair.name)
        if pair.name in self.fail:
            raise self.fail[pair.name]
        self.live.add(pair.name)
        self.most = max(self.most, len(self.live))
        return Held(self, pair.name)

    def release(self):
        pass


class Held:
    def __init__(self, memory: Memory, name: str):
        self.memory, self.name = memory, name

    def __del__(self):  # dropped by the hub: its memory is free
        self.memory.live.discard(self.name)


A, B, C = Pair("a", "model-a"), Pair("b", "model-b"), Pair("c", "model-c")


def test_the_default_is_the_embedded_pair():
    assert pairs_from_env({}) == (EMBEDDED_PAIR,)
    assert EMBEDDED_PAIR.model == "embedded" and EMBEDDED_PAIR.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_one_pair_from_model_and_head():
    (pair,) = pairs_from_env({"EAGLEVIZ_MODEL": "meta-llama/Llama-3.1-8B-Instruct",
                              "EAGLEVIZ_HEAD": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"})
    assert (pair.model, pair.head) == ("meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert pair.name == "Llama-3.1-8B-Instruct + EAGLE3-LLaMA3.1-Instruct-8B"
    (pair,) = pairs_from_env({"EAGLEVIZ_HEAD": "/srv/heads/mine"})
    assert (pair.model, pair.head) == ("embedded", "/srv/heads/mine")


def test_a_pairs_file_lists_the_selector(tmp_path):
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps([{"name": "small", "model": "embedded"},
                                {"name": "llama", "model": "meta-llama/Llama-3.1-8B-Instruct",
                                 "head": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "dtype": "bfloat16"}]))
    pairs = pairs_from_env({"EAGLEVIZ_PAIRS": str(path)})
    assert [p.name for p in pairs] == ["small", "llama"] and pairs[1].dtype == "bfloat16"
    with pytest.raises(UserFacingError, match="not both"):
        pairs_from_env({"EAGLEVIZ_PAIRS": str(path), "EAGLEVIZ_MODEL": "x"})


@pytest.mark.parametrize("content,match", [
    ("not json", "JSONDecodeError"),
    ("[]", "non-empty JSON list"),
    ('[{"name": "x"}]', "name and model"),
    ('[{"name": "x", "model": "m", "path": "/etc"}]', "only the fields"),
    ('[{"name": "x", "model": "m", "dtype": "int4"}]', "dtype"),
    ('[{"name": "x", "model": "m", "draft_vocab": -1}]', "draft_vocab"),
    ('[{"name": "", "model": "m"}]', "name"),
    ('[{"name": "x", "model": "m"}, {"name": "x", "model": "n"}]', "share a name"),
])
def test_a_bad_pairs_file_is_one_line(tmp_path, content, match):
    path = tmp_path / "pairs.json"
    path.write_text(content)
    with pytest.raises(UserFacingError, match=match):
        read_pairs(path)
    with pytest.raises(UserFacingError, match="EAGLEVIZ_PAIRS"):
        read_pairs(tmp_path / "missing.json")


def test_a_browser_names_pairs_never_paths():
    hub = PairHub((A, B), Memory().load)
    assert hub.pair(None) is A and hub.pair("b") is B
    for hostile in ("/etc/passwd", "model-a", "../assets", "a" * 500, "b\x00"):
        with pytest.raises(UserFacingError, match="not a model offered"):
            hub.pair(hostile)


def test_pairs_load_on_first_use_and_one_at_a_time():
    memory = Memory()
    released = []
    hub = PairHub((A, B, C), memory.load, release=lambda: released.append(1))
    assert hub.resident() is None and hub.peek("a") is None and memory.loads == []  # nothing loaded yet
    with hub.use("a") as held:
        assert held.name == "a" and hub.peek("a") is held and hub.peek("b") is None
    with hub.use("a"):
        pass
    assert memory.loads == ["a"]  # held: not loaded again
    del held

    def run_on(name):  # a run holds the pair only while it runs
        with hub.use(name) as held:
            assert held.name == name == hub.resident()

    for name in ("b", "c", "a"):
        run_on(name)
    assert memory.loads == ["a", "b", "c", "a"] and memory.most == 1 and len(released) == 3


def test_a_switch_waits_for_the_runs_on_the_current_pair():
    memory = Memory()
    hub = PairHub((A, B), memory.load)
    order = []
    entered = threading.Event()

    def long_run():
        with hub.use("a"):
            entered.set()
            time.sleep(0.3)
            order.append("a done")

    t = threading.Thread(target=long_run)
    t.start()
    entered.wait()
    with hub.use("b"):
        order.append("b started")
    t.join()
    assert order == ["a done", "b started"] and memory.most == 1


@pytest.mark.parametrize("error,match", [
    (MemoryError(), "out of memory"),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of memory"),
    (UserFacingError("draft head x does not fit the target y"), "does not fit"),
])
def test_a_failed_load_says_why_and_the_previous_pair_still_works(error, match):
    memory = Memory(fail={"b": error})
    hub = PairHub((A, B), memory.load)
    with hub.use("a"):
        pass
    with pytest.raises(UserFacingError, match=f"could not load 'b': .*{match}.*'a' is loaded again"):
        with hub.use("b"):
            pass
    assert hub.resident() == "a" and memory.most == 1
    with hub.use("a") as held:
        assert held.name == "a"
    assert memory.loads == ["a", "b", "a"]


def test_what_a_load_leaves_is_frozen_out_of_collections_until_the_next_release():
    """settle_memory freezes the loaded model (a full collection then skips it); release_memory thaws it first,
    so a dropped model's reference cycles are collected."""
    import gc
    import weakref

    from eagleviz.app.pairs import release_memory, settle_memory

    class Model:
        pass

    model = Model()
    model.me = model          # a reference cycle: only the cyclic collector frees it
    gone = weakref.ref(model)
    try:
        settle_memory()
        assert gc.get_freeze_count() > 0
        del model
        gc.collect()
        assert gone() is not None   # frozen: not collected
        release_memory()
        assert gc.get_freeze_count() == 0 and gone() is None
    finally:
        gc.unfreeze()
