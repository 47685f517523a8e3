"""The product's promise on the real embedded model: in fp32, EAGLE's greedy output equals plain greedy decoding
on MT-bench first turns (4 in the default run, the next 16 under `-m slow`) for a chain, SGLang's default tree, a
large budget, the cost-aware tree drafted by the head alone (priced like this CPU, valued by the shipped head's
calibration, so it prunes, stops early and rests the head) and the cost-aware tree with prompt-lookup candidates.
A divergence is accepted only where the target's top-2 logits are within 1e-4 (a rounding-level tie), and the
test checks that it is one."""

import os

import pytest

from eagleviz.perf.bench import top2_gap
from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding import calibration
from eagleviz.decoding.load import default_head
from eagleviz.prompts import mtbench_first_turns
from tiny import CPU_COSTS

CONFIGS = {"chain": TreeConfig.create(5, 1, 6, adaptive=False), "tree": TreeConfig.create(5, 4, 16, adaptive=False),
           "large": TreeConfig.create(7, 8, 64, adaptive=False),
           "cost-aware": TreeConfig.create(5, 4, 16, source="eagle"),
           "cost-aware+lookup": TreeConfig.create(5, 4, 16, source="eagle+lookup")}
NEW_TOKENS = int(os.environ.get("EAGLEVIZ_LOSSLESS_TOKENS", "32"))
PROMPTS, MORE = 4, 16  # the default run's MT-bench prompts (test_lossless_blocks checks 8), then the slow test's
TIE = 1e-4


def check_equal_or_tie(engine, prompt_ids, plain, spec):
    if spec == plain:
        return
    i = next((k for k, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    gap = top2_gap(engine, prompt_ids + plain[:i])
    assert gap < TIE, f"outputs diverge at new token {i} where the target's top-2 gap is {gap:.3g} (not a tie)"


def test_the_cost_aware_tree_is_checked_with_the_head_alone_and_with_lookup():
    """No two configs are the same, and the cost-aware ones differ in their draft source (the default source is
    eagle+lookup: a config that names none is not the head alone)."""
    assert len(set(CONFIGS.values())) == len(CONFIGS)
    sources = {name: tree.source for name, tree in CONFIGS.items() if tree.adaptive}
    assert sources == {"cost-aware": "eagle", "cost-aware+lookup": "eagle+lookup"}


def plain_runs(engine, prompts: list[str]) -> list[tuple[list[int], list[int]]]:
    """Plain greedy decoding of `prompts`: (prompt ids, new token ids)."""
    sampling, out = SamplingConfig(max_new_tokens=NEW_TOKENS), []
    for prompt in prompts:
        ids = engine.encode_prompt(prompt)
        run = engine.new_run(prompt, ids, None, sampling)
        list(engine.plain(ids, sampling, run))
        out.append((ids, run.token_ids))
    return out


@pytest.fixture(scope="module")
def plain_outputs(smol_engine_fp32):
    return plain_runs(smol_engine_fp32, mtbench_first_turns(PROMPTS))


def check_config(engine, plain_outputs, name: str) -> None:
    tree = CONFIGS[name]
    if tree.adaptive:
        head = default_head("embedded")
        engine = engine.with_policy(CPU_COSTS, calibration.read(head if os.path.isdir(head) else None))
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    for ids, plain in plain_outputs:
        spec = engine.new_run("", ids, tree, sampling)
        list(engine.speculate(ids, tree, sampling, spec))
        check_equal_or_tie(engine, ids, plain, spec.token_ids)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_eagle_equals_greedy_decoding_on_mtbench(smol_engine_fp32, plain_outputs, name):
    check_config(smol_engine_fp32, plain_outputs, name)


@pytest.mark.slow
def test_greedy_eagle_equals_greedy_decoding_on_more_mtbench_prompts(smol_engine_fp32):
    more = plain_runs(smol_engine_fp32, mtbench_first_turns(PROMPTS + MORE)[PROMPTS:])
    for name in CONFIGS:
        check_config(smol_engine_fp32, more, name)
