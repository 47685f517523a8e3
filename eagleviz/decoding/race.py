"""Speculative against plain decoding on the same prompt: the measured speedup, and whether the outputs agree.

At T = 0 speculative decoding is lossless: the tokens must equal plain greedy decoding's, exactly so in
fp32. In bf16 the verification forward (many tree tokens at once) and the plain forward (one token) round
differently, so where the target's two best logits are tied or one rounding step apart the argmax can
flip. The comparison finds the first differing position and measures the target's top-2 logit gap there
with one forward over the common prefix. At T > 0 both runs sample the target distribution but consume
different random numbers, so their texts differ by design.

The speedup divides the run's tokens/s by plain decoding's, timed now: only a run timed on this machine
(`RunTrace.machine` equal to `Engine.machine`) gives one. An imported or recorded trace made elsewhere, or one
that does not say where, is still compared token by token, but its speed is not divided by a plain run timed
here: the race says that it needs a run made here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from eagleviz.config import SamplingConfig
from eagleviz.decoding.engine import Engine
from eagleviz.trace import RunTrace


@dataclass
class Divergence:
    position: int                          # index among the new tokens
    speculative: str                       # token text each run produced there
    plain: str
    top2: list[tuple[int, str, float]]     # the target's two best (token, text, logit) after the common prefix
    dtype: str

    @property
    def gap(self) -> float:
        return self.top2[0][2] - self.top2[1][2]

    @property
    def rounding_steps(self) -> float:
        """The gap in units of one rounding step of the logits' dtype at their magnitude (bf16 keeps 8 bits)."""
        bits = {"bfloat16": 8, "float16": 11}.get(self.dtype, 24)
        magnitude = max(abs(self.top2[0][2]), 1e-30)
        step = 2.0 ** (math.floor(math.log2(magnitude)) + 1 - bits)
        return self.gap / step


@dataclass
class RaceResult:
    speculative: RunTrace
    plain: RunTrace
    greedy: bool
    divergence: Divergence | None
    machine: str = ""        # where plain decoding was timed (`Engine.machine`)

    @property
    def identical(self) -> bool:
        return self.speculative.token_ids == self.plain.token_ids

    @property
    def timed_here(self) -> bool:
        """Whether the speculative run was timed on the machine plain decoding just ran on (a trace that does not
        record its machine was not, as far as anyone can tell)."""
        return bool(self.speculative.machine) and self.speculative.machine == self.machine

    @property
    def speedup(self) -> float | None:
        """Speculative over plain tokens/s; None when the two were timed on different machines (`timed_here`)."""
        if not self.timed_here:
            return None
        s, p = self.speculative.summary()["tokens_per_s"], self.plain.summary()["tokens_per_s"]
        return s / p if p > 0 else 0.0


def race_sampling(run: RunTrace) -> SamplingConfig:
    """The speculative run's sampling settings, for as many tokens as it produced (it may have stopped early)."""
    return replace(SamplingConfig(**run.config["sampling"]), max_new_tokens=max(len(run.output), 1))


def race_chat(run: RunTrace) -> bool:
    """Whether the run's prompt went through the chat template (traces that do not record it: assumed, as the
    app and `generate` do by default)."""
    return True if run.chat is None else run.chat


def plain_run(engine: Engine, run: RunTrace, stop: Callable[[RunTrace], str] | None = None) -> RunTrace:
    """Plain decoding of the speculative run's prompt, rendered as it was, with its sampling settings
    (`race_sampling`). `stop(plain)`, asked after each token, ends the run early when it returns a reason."""
    sampling = race_sampling(run)
    chat = race_chat(run)
    ids = engine.encode_prompt(run.prompt, chat)
    plain = engine.new_run(run.prompt, ids, None, sampling, chat)
    steps = engine.plain(ids, sampling, plain)
    for _ in steps:
        reason = stop(plain) if stop is not None else ""
        if reason:
            plain.stop_reason = reason
            steps.close()
            break
    return plain


@torch.inference_mode()
def logits_after(engine: Engine, ids: list[int]) -> torch.Tensor:
    """The target's logits for the token after `ids` (one causal forward on a fresh cache), widened to fp32 (exactly)
    on the CPU."""
    target = engine.target
    x = torch.tensor(ids, device=target.device)
    cache = target.new_cache(len(ids))
    mask = torch.ones(len(ids), len(ids), dtype=torch.bool, device=target.device).tril()
    out = target.forward(x, torch.arange(len(ids), device=target.device), cache, mask, logit_rows=slice(-1, None),
                         impl=engine.attn_impl)
    return out.logits[0].float().cpu()


def top2_after(engine: Engine, ids: list[int]) -> list[tuple[int, str, float]]:
    """The target's two largest logits for the token after `ids` (`logits_after`)."""
    values, tokens = torch.topk(logits_after(engine, ids), 2)
    tok = engine.target.tokenizer
    return [(int(t), tok.decode([int(t)]), float(v)) for v, t in zip(values, tokens)]


def race(engine: Engine, run: RunTrace, stop: Callable[[RunTrace], str] | None = None) -> RaceResult:
    """Plain decoding against the recorded speculative `run` (see `plain_run` for `stop`)."""
    plain = plain_run(engine, run, stop)
    greedy = SamplingConfig(**run.config["sampling"]).greedy
    spec_ids, plain_ids = run.token_ids, plain.token_ids
    divergence = None
    first = next((i for i, (a, b) in enumerate(zip(spec_ids, plain_ids)) if a != b), None)
    if greedy and first is not None:
        prefix = engine.encode_prompt(run.prompt, race_chat(run)) + spec_ids[:first]
        divergence = Divergence(position=first, speculative=run.output[first].text, plain=plain.output[first].text,
                                top2=top2_after(engine, prefix), dtype=run.dtype)
    return RaceResult(speculative=run, plain=plain, greedy=greedy, divergence=divergence, machine=engine.machine())


def describe(result: RaceResult) -> str:
    """The race as Markdown: speeds side by side, then agreement and, where they differ, why."""
    s, p = result.speculative.summary(), result.plain.summary()
    where = "" if result.timed_here else " (timed elsewhere)"
    lines = ["| | tokens | time (s) | tokens/s |", "|---|---:|---:|---:|",
             f"| speculative (EAGLE){where} | {s['new_tokens']} | {s['wall_s']:.2f} | {s['tokens_per_s']:.1f} |",
             f"| plain decoding | {p['new_tokens']} | {p['wall_s']:.2f} | {p['tokens_per_s']:.1f} |", "",
             f"**Measured speedup: {result.speedup:.2f}x** (\u03c4 = {s['tau']:.2f} tokens per target forward)."
             if result.timed_here else f"**No speedup measured**: {elsewhere(result)}", ""]
    if not result.greedy:
        lines.append("At T > 0 both runs sample the target's distribution with different random draws, so their "
                     "texts differ by design; the replay panel shows why the speculative one is distributed exactly "
                     "like plain sampling.")
    elif result.identical:
        lines.append("**Identical outputs**: speculative decoding committed exactly the tokens plain greedy decoding "
                     "produces.")
    elif result.divergence is None:
        stopped = f" (plain decoding stopped: {result.plain.stop_reason})" if result.plain.stop_reason not in (
            "", "eos", "max_new_tokens") else ""
        lines.append(f"One output is a prefix of the other (a run stopped earlier{stopped}); the common part is "
                     "identical.")
    else:
        lines.append(_divergence_text(result.divergence))
    return "\n".join(lines)


def elsewhere(result: RaceResult) -> str:
    """Why a recorded run's speed is not divided by plain decoding's, in one sentence."""
    recorded = result.speculative.machine
    return (f"this run was timed on {recorded if recorded else 'a machine its trace does not record'} and plain "
            f"decoding here ({result.machine}), now; times from two machines do not divide: a speedup needs a "
            "run made on this machine.")


def _divergence_text(d: Divergence) -> str:
    (_, t1, l1), (_, t2, l2) = d.top2
    tie = "tied" if d.gap == 0 else f"{d.rounding_steps:.1f} {d.dtype} rounding step(s) apart"
    return (f"**The outputs differ from new token {d.position}**: speculative {d.speculative!r}, plain {d.plain!r}. "
            f"There the target's two best logits are {t1!r} {l1:.4f} and {t2!r} {l2:.4f}: a gap of {d.gap:.4f}, "
            f"{tie}. Verification runs many tree tokens in one forward while plain decoding runs one, and "
            f"{d.dtype} arithmetic rounds those differently: at such a near-tie the argmax can flip. The algorithm "
            "is lossless; the arithmetic is not bit-exact.")
