"""eagleviz/decoding/prefix.py: the chat template's opening is found by its token ids, encoded once per
attention implementation, copied into each run's cache; the split prefill computes what the whole one does,
speculation stays lossless on it, and a run gives the same tokens whether the prefix was encoded before it."""

import dataclasses
import itertools
import threading

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.drafting import causal
from eagleviz.decoding.prefix import Prefix, PrefixCache, Prompt, PromptCache, chat_prefix
from eagleviz.trace import RunTrace
from eagleviz.visuals.explain import summary_text
from tiny import CPU_COSTS, ChatTinyTokenizer, tiny_engine

TREES = [TreeConfig.create(5, 4, 16, adaptive=False), TreeConfig.create(4, 2, 9, source="eagle+lookup"),
         TreeConfig.create(3, 1, 4, adaptive=False)]


def run(engine, prompt, tree, sampling, chat=True):
    ids = engine.encode_prompt(prompt, chat)
    trace = engine.new_run(prompt, ids, tree, sampling, chat)
    list(engine.plain(ids, sampling, trace) if tree is None else engine.speculate(ids, tree, sampling, trace))
    return trace


def test_the_chat_prefix_is_the_opening_every_prompt_shares():
    engine = tiny_engine(chat=True)
    prefix = chat_prefix(engine.encode_prompt)
    opening = ChatTinyTokenizer()("system: be brief / user: ")["input_ids"]
    assert prefix == engine.prefix.ids == tuple(opening)
    for prompt in ("abc", "0", "zzz"):
        assert tuple(engine.encode_prompt(prompt)[:len(prefix)]) == prefix
    assert tiny_engine().prefix.ids == ()   # no chat template: no prefix


def test_covers_only_prompts_that_start_with_the_prefix_and_go_past_it():
    cache = PrefixCache((5, 6, 7))
    assert cache.covers([5, 6, 7, 1]) == 3
    assert cache.covers([5, 6, 7]) == 0        # the last position's logits are needed: nothing left to compute
    assert cache.covers([5, 6, 1, 2]) == 0
    assert cache.covers([1, 5, 6, 7, 2]) == 0
    assert PrefixCache(()).covers([1, 2, 3]) == 0


def test_each_implementation_encodes_once_even_when_runs_start_together():
    cache, calls = PrefixCache((1, 2)), []
    barrier = threading.Barrier(8)

    def encode(ids):
        calls.append(ids)
        return Prefix(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1), torch.zeros(2, 1))

    def start(impl):
        barrier.wait()
        cache.get(impl, encode)

    threads = [threading.Thread(target=start, args=("torch" if i % 2 else "triton",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [[1, 2], [1, 2]]
    assert cache.get("torch", encode) is cache.get("torch", encode) and len(calls) == 2


def test_a_prefix_goes_into_an_empty_cache_only():
    engine = tiny_engine(chat=True)
    ids = engine.encode_prompt("abc")
    prefix = engine.prefix.get(engine.attn_impl, engine._encode_prefix)
    cache = engine.target.new_cache(64)
    prefix.copy_into(cache)
    assert cache.length == len(engine.prefix.ids) < len(ids)
    with pytest.raises(ValueError, match="empty cache"):
        prefix.copy_into(cache)


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_the_split_prefill_computes_what_the_whole_prefill_does(arch):
    """Keys, values, features and the last position's logits: the prefix encoded alone, then the rest after it,
    against the prompt in one forward (fp32; they differ only by the order of floating-point sums)."""
    engine = tiny_engine("llama", arch, vocab=64, chat=True)
    target, layers = engine.target, engine.feature_layers
    ids = engine.encode_prompt("abcdef")
    n, p = len(ids), engine.prefix.covers(ids)
    assert 0 < p < n
    whole_cache = target.new_cache(n)
    x = torch.tensor(ids)
    whole = target.forward(x, torch.arange(n), whole_cache, causal(n, x.device), logit_rows=slice(-1, None),
                           feature_layers=layers)
    split_cache = target.new_cache(n)
    prefix = engine._encode_prefix(ids[:p])
    prefix.copy_into(split_cache)
    rest = target.forward(x[p:], torch.arange(p, n), split_cache, causal(n - p, x.device),
                          logit_rows=slice(-1, None), feature_layers=layers)
    torch.testing.assert_close(rest.logits, whole.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([prefix.features, rest.features]), whole.features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split_cache.k, whole_cache.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split_cache.v, whole_cache.v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type,arch", [("llama", "eagle1"), ("qwen3", "eagle3")])
def test_greedy_speculation_on_the_split_prefill_equals_greedy_decoding(model_type, arch):
    for vocab, seed in itertools.product((8, 64), (0, 1)):
        engine = tiny_engine(model_type, arch, seed=seed, vocab=vocab, chat=True)
        sampling = SamplingConfig(max_new_tokens=30)
        plain = run(engine, "abc"[: 2 + seed], None, sampling)
        assert plain.prefill_reused == len(engine.prefix.ids) > 0
        for costs, tree in itertools.product((None, CPU_COSTS), TREES):
            spec = run(engine.with_policy(costs=costs), "abc"[: 2 + seed], tree, sampling)
            assert spec.token_ids == plain.token_ids, (vocab, seed, tree, costs)
            assert spec.prefill_reused == plain.prefill_reused


def test_a_run_gives_the_same_tokens_cold_or_warm_and_sampled():
    """The first run encodes the prefix, the second copies it: the same cycles and tokens, bit for bit."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24, seed=3)
    cold_engine = tiny_engine("llama", vocab=64, chat=True)
    cold = run(cold_engine, "abcd", TREES[0], sampling)
    warm = run(cold_engine, "abcd", TREES[0], sampling)
    assert cold.token_ids == warm.token_ids
    assert [c.accept_length for c in cold.cycles] == [c.accept_length for c in warm.cycles]
    fresh = run(tiny_engine("llama", vocab=64, chat=True), "abcd", TREES[0], sampling)
    assert fresh.token_ids == cold.token_ids


def test_prompts_without_the_opening_and_engines_without_the_cache_prefill_whole():
    engine = tiny_engine(chat=True)
    raw = run(engine, "abc", TREES[0], SamplingConfig(max_new_tokens=8), chat=False)
    assert raw.prefill_reused == 0
    off = tiny_engine(chat=True, prefix_cache=False)
    assert off.prefix.ids == () and run(off, "abc", None, SamplingConfig(max_new_tokens=8)).prefill_reused == 0


def test_the_trace_records_and_the_summary_says_what_the_prefix_cache_gave():
    engine = tiny_engine(chat=True)
    trace = run(engine, "abc", TREES[0], SamplingConfig(max_new_tokens=8))
    back = RunTrace.from_json(trace.to_json())
    assert back.prefill_reused == trace.prefill_reused == len(engine.prefix.ids)
    assert f"{trace.prefill_reused} of {trace.prompt_tokens} prompt tokens from the prefix cache" in summary_text(back)
    older = trace.to_dict()
    del older["prefill_reused"]
    assert RunTrace.from_dict(older).prefill_reused == 0


def _fields(trace) -> list:
    """Every cycle's tree, checks, probabilities and tokens as the trace holds them (not its timings)."""
    return [{k: v for k, v in dataclasses.asdict(c).items() if k != "timings_ms"} for c in trace.cycles]


@pytest.mark.parametrize("model_type,arch", [("llama", "eagle1"), ("qwen3", "eagle3")])
def test_a_kept_prompt_skips_its_prefill_and_gives_the_same_run_bit_for_bit(model_type, arch, monkeypatch):
    """`Engine.with_prompt_cache`: the second run of a prompt runs no forward of the target for its prefill (its
    keys, values, features and first logits are the first run's), and every cycle is the first run's, greedy and
    sampled, plain and speculative; another prompt, or the same one with another attention, is prefilled."""
    def alike(e):   # no run moves the next one's choices (its clock, what it learned)
        e = e.with_ledger(False)
        e.learn = False
        return e

    engine = alike(tiny_engine(model_type, arch, vocab=64, chat=True)).with_prompt_cache(4)
    forwards = []
    forward = type(engine.target).forward
    monkeypatch.setattr(type(engine.target), "forward", lambda self, x, pos, *a, **k: forwards.append(int(pos[0])) or
                        forward(self, x, pos, *a, **k))   # where each forward starts: a prefill's, after the opening
    for sampling in (SamplingConfig(max_new_tokens=16), SamplingConfig(temperature=1.0, max_new_tokens=16, seed=5)):
        for tree in (None, TREES[0], TREES[1]):
            ids = engine.encode_prompt("abcd")
            cold_engine = alike(tiny_engine(model_type, arch, vocab=64, chat=True))   # keeps no prompt
            cold = run(cold_engine, "abcd", tree, sampling)
            first = run(engine, "abcd", tree, sampling)
            forwards.clear()
            warm = run(engine, "abcd", tree, sampling)
            assert len(engine.prefix.ids) not in forwards and warm.prefill_reused == len(ids)
            assert warm.token_ids == first.token_ids == cold.token_ids, (sampling, tree)
            assert _fields(warm) == _fields(first) == _fields(cold), (sampling, tree)
    forwards.clear()
    other = run(engine, "abce", TREES[0], SamplingConfig(max_new_tokens=4))
    assert other.prefill_reused == len(engine.prefix.ids) and forwards   # a prompt not kept: prefilled
    assert len(engine.prompts) == 2


def test_the_prompt_cache_keeps_the_most_recent_and_prefers_features():
    cache = PromptCache(2)
    t = torch.zeros(1, 1, 3, 2)

    def prompt(features: bool) -> Prompt:
        return Prompt(t, t, torch.ones(3, 4) if features else None, torch.zeros(8))

    cache.put("torch", [1], prompt(False))
    assert cache.get("torch", [1], features=False) is not None and cache.get("torch", [1], features=True) is None
    cache.put("torch", [1], prompt(True))
    cache.put("torch", [1], prompt(False))   # a plain run's prompt does not replace one with features
    assert cache.get("torch", [1], features=True) is not None and cache.get("triton", [1], features=False) is None
    cache.put("torch", [2], prompt(True))
    cache.get("torch", [1], features=False)   # used: [2] is now the least recent
    cache.put("torch", [3], prompt(True))
    assert len(cache) == 2 and cache.get("torch", [2], features=False) is None
    assert cache.get("torch", [1], features=False) is not None
    small = PromptCache(8, max_bytes=2 * prompt(True).nbytes)   # bytes bound too: two of these, not three
    for i in range(3):
        small.put("torch", [i], prompt(True))
    assert len(small) == 2 and small.nbytes == 2 * prompt(True).nbytes and small.get("torch", [0], False) is None
    small.put("torch", [9], Prompt(t, t, torch.ones(300, 4), torch.zeros(8)))   # larger than all: not kept
    assert len(small) == 2 and small.get("torch", [9], False) is None
    none = PromptCache()
    none.put("torch", [1], prompt(True))
    assert len(none) == 0 and tiny_engine(chat=True).prompts.entries == 0   # an engine keeps none unless asked
