"""eagleviz/app/limits.py: server limits from the environment, refused requests name the limit, KV budget."""

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.errors import UserFacingError
from eagleviz.app.limits import Limits
from eagleviz.decoding.engine import Engine
from eagleviz.models.target import TargetModel
from tiny import tiny_engine


def test_defaults_and_environment(monkeypatch):
    assert Limits.from_env() == Limits()
    monkeypatch.setenv("EAGLEVIZ_MAX_NEW_TOKENS", "32")
    lim = Limits.from_env()
    assert lim.max_new_tokens == 32
    monkeypatch.setenv("EAGLEVIZ_PROMPTS_KEPT", "0")   # none kept: allowed
    assert Limits.from_env().prompts_kept == 0 and Limits().prompts_kept == 16
    monkeypatch.setenv("EAGLEVIZ_SHARE_RUNS", "0")   # each run its own
    assert Limits.from_env().share_runs is False and Limits().share_runs is True
    monkeypatch.setenv("EAGLEVIZ_MAX_RUN_SECONDS", "soon")
    with pytest.raises(UserFacingError, match="EAGLEVIZ_MAX_RUN_SECONDS"):
        Limits.from_env()


@pytest.mark.parametrize("prompt,tree,sampling,message", [
    ("", None, SamplingConfig(), "empty"),
    (" \n\t", None, SamplingConfig(), "empty"),
    ("x" * 100_000, None, SamplingConfig(), "100,000 characters; this server takes at most 8,000"),
    ("hi", None, SamplingConfig(max_new_tokens=4096), "max new tokens 4096 is above this server's limit of 512"),
    ("hi", TreeConfig.create(8, 8, 200), SamplingConfig(), "draft tokens 200 is above this server's limit of 64"),
])
def test_requests_over_the_limits_are_refused_in_plain_words(prompt, tree, sampling, message):
    with pytest.raises(UserFacingError, match=message) as refused:
        Limits().check_request(prompt, tree, sampling)
    assert "EAGLEVIZ" not in str(refused.value)     # the limit's value, not the variable that sets it


def test_unicode_prompts_within_limits_pass():
    for prompt in ("héllo 👋🏽", "مرحبا بالعالم", "a\u202eb\x00c\x1b[31m"):
        Limits().check_request(prompt, TreeConfig(), SamplingConfig())


def test_kv_budget_refuses_oversized_requests():
    engine = tiny_engine()
    need = Limits().check_kv(engine, 100, TreeConfig(), SamplingConfig(max_new_tokens=100))
    assert need > 0
    with pytest.raises(UserFacingError, match="above this server's budget of 1 MB"):
        Limits(kv_budget_mb=1).check_kv(engine, 100_000, TreeConfig(), SamplingConfig(max_new_tokens=8000))


def test_kv_budget_counts_the_caches_dtype():
    """A bf16 model keeping its caches in fp32 needs twice the bytes of one keeping them in bf16."""
    base = tiny_engine(dtype=torch.bfloat16)
    t = base.target
    need = {kv: Limits().check_kv(Engine(TargetModel(t.hf, t.tokenizer, t.name, kv_dtype=kv), base.head),
                                  50, TreeConfig(), SamplingConfig(max_new_tokens=50))
            for kv in (torch.bfloat16, torch.float32)}
    assert need[torch.float32] == 2 * need[torch.bfloat16]
