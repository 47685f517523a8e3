"""The promise of the weight-blocks path (`--weights blocks`, the default on a CPU without native bf16): every
product, norm and attention sums in an order that does not depend on the batch, so greedy EAGLE equals plain
greedy decoding bit for bit, with no tie to excuse: a chain, SGLang's default tree, a large budget, and the
cost-aware tree drafted by the head alone and with prompt-lookup candidates, on MT-bench first turns
(EAGLEVIZ_LOSSLESS_PROMPTS of them, 8 by default, the next 12 under `-m slow`; EAGLEVIZ_LOSSLESS_TOKENS new
tokens, 32). And the converse:
a chain of the tokens plain decoding chose (`Foresight`) is accepted whole, every cycle, so no token's logits
move when it is verified among others. The trees and chains are eagleviz/perf/lossless.py's, whose command runs
them on all 80 prompts into the committed assets/bench/lossless.json (tests/test_numerics.py)."""

import os

import pytest

from eagleviz.config import SamplingConfig
from eagleviz.decoding import calibration
from eagleviz.decoding.engine import Engine
from eagleviz.decoding.load import RANDOM_HEAD, default_head
from eagleviz.models.draft import load_head, random_head
from eagleviz.perf.lossless import CHAINS, CONFIGS, short_cycles
from eagleviz.prompts import mtbench_first_turns
from eagleviz.paths import cache_dir
from kernels import quant_ops
from tiny import CPU_COSTS, unbuilt

PROMPTS = int(os.environ.get("EAGLEVIZ_LOSSLESS_PROMPTS", "8"))
MORE = 12  # the slow test's prompts, after the default run's
NEW_TOKENS = int(os.environ.get("EAGLEVIZ_LOSSLESS_TOKENS", "32"))


@pytest.fixture(scope="module")
def engine():
    from eagleviz.models.loading import load_target

    target = load_target("embedded", weights="blocks")
    if target.weights != "blocks":
        unbuilt("kernels/quant_ops.c", quant_ops.last_error(cache_dir() / "kernels"))
    path = default_head("embedded")
    head = random_head(target, seed=0) if path == RANDOM_HEAD else load_head(path, target)
    return Engine(target, head, path)


def plain_runs(engine, prompts: list[str]) -> list[tuple[str, list[int]]]:
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    return [(prompt, engine.generate(prompt, None, sampling).token_ids) for prompt in prompts]


@pytest.fixture(scope="module")
def plain_outputs(engine):
    return plain_runs(engine, mtbench_first_turns(PROMPTS))


def differing(engine, plain_outputs, name: str) -> list[int]:
    """The prompts on which the tree `name` (`eagleviz.perf.lossless.CONFIGS`) writes other tokens than plain."""
    tree = CONFIGS[name]
    if tree.adaptive:
        head = default_head("embedded")
        engine = engine.with_policy(CPU_COSTS, calibration.read(head if os.path.isdir(head) else None))
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    return [i for i, (prompt, plain) in enumerate(plain_outputs)
            if engine.generate(prompt, tree, sampling).token_ids != plain]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_eagle_is_plain_greedy_decoding_bit_for_bit(engine, plain_outputs, name):
    differ = differing(engine, plain_outputs, name)
    assert differ == [], f"{name}: prompts {differ} differ from plain decoding"


@pytest.mark.slow
def test_greedy_eagle_is_plain_greedy_decoding_bit_for_bit_on_more_prompts(engine):
    """Every tree on the next 12 prompts (the committed `lossless` run covers all 80, tests/test_numerics.py)."""
    more = plain_runs(engine, mtbench_first_turns(PROMPTS + MORE)[PROMPTS:])
    differ = {name: differing(engine, more, name) for name in CONFIGS}
    assert all(d == [] for d in differ.values()), differ


@pytest.mark.parametrize("k", CHAINS)
def test_a_chain_of_plain_decodings_own_tokens_is_accepted_whole(engine, plain_outputs, k):
    for prompt, plain in plain_outputs[:5]:
        assert short_cycles(engine, prompt, plain, k) == [], "a cycle rejected a token plain decoding chose"
