"""eagleviz/decoding/costs.py: the price list is in plain decoding steps, and a plain step is what a decoded
token takes after the prompt's prefill."""

from __future__ import annotations

from types import SimpleNamespace

from eagleviz.decoding import costs


class _Engine:
    """Runs that took `prefill_ms` for the prompt, then `step_ms` per token (a tree: 3 tokens a cycle, each cycle
    0.5 ms of drafting once, 1 ms per draft level, a verification of 10 ms and 15 ms in all with 4 levels)."""

    head = object()

    def __init__(self, prefill_ms: float, step_ms: float):
        self.prefill_ms, self.step_ms, self.target = prefill_ms, step_ms, None

    def generate(self, prompt, tree, sampling):
        n = sampling.max_new_tokens
        if tree is None:
            return SimpleNamespace(wall_s=(self.prefill_ms + n * self.step_ms) / 1e3, prefill_ms=self.prefill_ms,
                                   output=[0] * n, cycles=[])
        cycles = [SimpleNamespace(timings_ms={"draft": 0.5 + tree.steps, "verify": 10.0}) for _ in range(n // 3)]
        return SimpleNamespace(wall_s=(self.prefill_ms + 15.0 * len(cycles)) / 1e3, prefill_ms=self.prefill_ms,
                               output=[0] * n, cycles=cycles)


def test_a_plain_step_leaves_the_prefill_out(monkeypatch):
    monkeypatch.setattr(costs, "forward_ms", lambda target, sizes: {n: 4.0 + n for n in sizes})
    slow_prompt, quick_prompt = (costs.measure(_Engine(prefill, 6.0)) for prefill in (300.0, 1.0))
    for measured in (slow_prompt, quick_prompt):
        assert abs(measured.step_ms - 6.0) < 1e-9
        assert abs(measured.verify_cost(1) - 5.0 / 6.0) < 1e-9 and abs(measured.verify_cost(8) - 12.0 / 6.0) < 1e-9
        assert abs(measured.draft_level - 1.0 / 6.0) < 1e-9 and abs(measured.draft_fixed - 0.5 / 6.0) < 1e-9
        assert abs(measured.overhead - 0.5 / 6.0) < 1e-9
        assert measured.draft_cost(0) == 0.0 and abs(measured.draft_cost(2) - 2.5 / 6.0) < 1e-9
        assert costs.CostModel.from_dict(measured.to_dict()) == measured


def test_a_price_list_is_kept_per_cpu_vector_unit(monkeypatch):
    """An emulated AVX2 run (or a second machine sharing the cache) measures its own prices."""
    import dataclasses

    from kernels import capability
    from tiny import tiny_engine

    engine = tiny_engine("llama", vocab=8)
    native = costs.key(engine)
    emulated = dataclasses.replace(capability.detect(), emulating="avx2", vector_isa="AVX2")
    monkeypatch.setattr(capability, "detect", lambda: emulated)
    assert costs.key(engine) != native
