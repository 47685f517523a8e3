"""Limits that protect a shared server (a public Space, a workshop of thirty), read once from the environment.

    EAGLEVIZ_MAX_NEW_TOKENS     512    new tokens per request
    EAGLEVIZ_MAX_DRAFT_TOKENS   64     verification budget (speculative_num_draft_tokens)
    EAGLEVIZ_MAX_PROMPT_CHARS   8000   prompt length in characters
    EAGLEVIZ_MAX_UPLOAD_MB      20     size of an imported trace
    EAGLEVIZ_MAX_RUN_SECONDS    120    wall time of one request; the run stops (its partial trace is kept)
    EAGLEVIZ_KV_BUDGET_MB       1024   target + draft KV cache of one request
    EAGLEVIZ_CONCURRENCY        1      steps (a run's prefill or one cycle) computed at once (CPU: 1, see
                                       docs/performance.md section 1)
    EAGLEVIZ_ACTIVE_RUNS        32     runs in progress at once, taking turns at the model cycle by cycle
                                       (eagleviz/app/scheduler.py); 1 serves runs first come, first served
    EAGLEVIZ_QUEUE_SIZE         64     requests waiting; beyond it Gradio refuses a request ("Queue is full")
    EAGLEVIZ_PROMPTS_KEPT       16     prompts kept whole after their prefill, in at most 256 MB (a prompt run again
                                       skips it, with the same tokens); 0 keeps none
    EAGLEVIZ_SHARE_RUNS         1      a run asked with the pair, prompt and knobs of a run going now joins it,
                                       decoded once for all who asked (eagleviz/app/shared.py); 0: each decodes its own
    EAGLEVIZ_THREADS            ""     torch threads per process (unset: torch's default, one per core); on a
                                       shared machine give each concurrent run its own core (docs/operations.md)

Which models and heads a server offers is the operator's choice (EAGLEVIZ_PAIRS, EAGLEVIZ_MODEL,
EAGLEVIZ_HEAD: eagleviz/app/pairs.py); the browser names a pair, never a path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.errors import UserFacingError


def _env_int(name: str, default: int, lo: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise UserFacingError(f"{name}={raw!r} is not an integer") from exc
    if value < lo:
        raise UserFacingError(f"{name} must be >= {lo}, got {value}")
    return value


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 512
    max_draft_tokens: int = 64
    max_prompt_chars: int = 8000
    max_upload_mb: int = 20
    max_run_seconds: int = 120
    kv_budget_mb: int = 1024
    concurrency: int = 1
    active_runs: int = 32
    queue_size: int = 64
    threads: int | None = None
    prompts_kept: int = 16
    share_runs: bool = True

    @classmethod
    def from_env(cls) -> Limits:
        d = cls()
        return cls(max_new_tokens=_env_int("EAGLEVIZ_MAX_NEW_TOKENS", d.max_new_tokens),
                   max_draft_tokens=_env_int("EAGLEVIZ_MAX_DRAFT_TOKENS", d.max_draft_tokens, lo=2),
                   max_prompt_chars=_env_int("EAGLEVIZ_MAX_PROMPT_CHARS", d.max_prompt_chars),
                   max_upload_mb=_env_int("EAGLEVIZ_MAX_UPLOAD_MB", d.max_upload_mb),
                   max_run_seconds=_env_int("EAGLEVIZ_MAX_RUN_SECONDS", d.max_run_seconds),
                   kv_budget_mb=_env_int("EAGLEVIZ_KV_BUDGET_MB", d.kv_budget_mb),
                   concurrency=_env_int("EAGLEVIZ_CONCURRENCY", d.concurrency),
                   active_runs=_env_int("EAGLEVIZ_ACTIVE_RUNS", d.active_runs),
                   queue_size=_env_int("EAGLEVIZ_QUEUE_SIZE", d.queue_size),
                   threads=_env_int("EAGLEVIZ_THREADS", 0) or None,
                   prompts_kept=_env_int("EAGLEVIZ_PROMPTS_KEPT", d.prompts_kept, lo=0),
                   share_runs=bool(_env_int("EAGLEVIZ_SHARE_RUNS", int(d.share_runs), lo=0)))

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 2**20

    def describe(self) -> str:
        """One line for the UI: the limits in force on this server."""
        return (f"Limits on this server: prompt <= {self.max_prompt_chars} characters, max new tokens <= "
                f"{self.max_new_tokens}, draft tokens <= {self.max_draft_tokens}, {self.max_run_seconds} s per run "
                f"(a longer run stops and keeps its partial trace), trace uploads <= {self.max_upload_mb} MB, "
                f"{self.active_runs} runs in progress at once, taking turns at the model cycle by cycle "
                f"({self.concurrency} step(s) at a time), and {self.queue_size} waiting.")

    def prompt_note(self, prompt: str | None) -> str:
        """A line under the prompt once it is longer than this server takes, said as it is typed or pasted
        (the page never cuts it short silently), else empty."""
        n = len(prompt or "")
        if n <= self.max_prompt_chars:
            return ""
        return (f"\u26a0 The prompt has {n:,} characters; this server takes at most {self.max_prompt_chars:,}. "
                f"Shorten it by {n - self.max_prompt_chars:,} before pressing Run.")

    def check_request(self, prompt: str, tree: TreeConfig | None, sampling: SamplingConfig) -> None:
        """Refuse what a shared server should not run, with the limit's value in plain words (the variable that
        sets it is the operator's business: docs/operations.md)."""
        if not prompt or not prompt.strip():
            raise UserFacingError("the prompt is empty")
        if len(prompt) > self.max_prompt_chars:
            raise UserFacingError(f"the prompt has {len(prompt):,} characters; this server takes at most "
                                  f"{self.max_prompt_chars:,} characters: shorten it")
        if sampling.max_new_tokens > self.max_new_tokens:
            raise UserFacingError(f"max new tokens {sampling.max_new_tokens} is above this server's limit of "
                                  f"{self.max_new_tokens}")
        if tree is not None and tree.draft_tokens > self.max_draft_tokens:
            raise UserFacingError(f"draft tokens {tree.draft_tokens} is above this server's limit of "
                                  f"{self.max_draft_tokens}")

    def check_kv(self, engine, n_prompt: int, tree: TreeConfig | None, sampling: SamplingConfig) -> int:
        """Bytes the request's KV caches would take; refuse a request over the budget (out-of-memory guard)."""
        need = engine.kv_bytes(n_prompt, tree, sampling)
        if need > self.kv_budget_mb * 2**20:
            raise UserFacingError(f"this request needs {need / 2**20:.0f} MB of KV cache (the model's memory of "
                                  f"the text so far), above this server's budget of {self.kv_budget_mb} MB: "
                                  "shorten the prompt or lower max new tokens")
        return need
