"""What the app does between the user's knobs and the engine, with no web framework in sight.

    EngineHub     the model, loaded once and shared read-only; one Engine view per attention implementation
    Knobs         the user's settings, validated into TreeConfig + SamplingConfig (SGLang's adjustments shown)
    stream_run    a speculative run as a stream of (run, cycle) pairs, for live display, within the server's
                  limits (eagleviz.app.limits): prompt, tokens, draft budget, KV budget, run time; each step
                  taken in a fair turn at the model (eagleviz.app.scheduler), so runs share it cycle by cycle
    generate      the same run drained, as the API returns it
    race_run      plain decoding against a recorded (maybe imported) run, within the same limits, and EAGLE
                  with this machine's fastest tree, each timed alone
    knobs_of      the knobs a recorded run was made with, to set the page to it
    read_trace    an uploaded trace, size-limited and validated before any figure touches it
    write_trace   a run as a JSON file for download, in a temp folder that forgets files after an hour
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from eagleviz.config import LIMITS, SamplingConfig, TreeConfig, tree_token_cap
from eagleviz.decoding.costs import CostModel
from eagleviz.decoding.engine import Engine
from eagleviz.errors import UserFacingError
from eagleviz.paths import ASSETS
from eagleviz.app.flags import hub_id, launch_flags
from eagleviz.app.limits import Limits
from eagleviz.app.scheduler import Turns
from eagleviz.measured import latest_verify_cost, tuned_config, tuned_tree
from eagleviz.trace import CycleTrace, RunTrace
from eagleviz.visuals import check_displayable
from kernels.tree_attention import IMPLS

DEFAULT_LIMITS = Limits()
TRACE_TTL_S = 3600                # exported trace files older than this are deleted (Gradio has its own copy)
SHARED_NOTE = "Shared the model with other runs"   # the start of the note a run that waited for its turns carries
SHARED_NOTE_AFTER_S = 1.0          # shorter waits are not worth a note
RANDOM_HEAD_NOTE = ("The draft head is **untrained (random)**: the target rejects almost every draft token, so "
                    "expect tau close to 1 and no speedup. Every figure is still real, and the output is still "
                    "exactly the target's.")


class EngineHub:
    """The shared model. `source` is an Engine or a zero-argument factory called once, on first use."""

    def __init__(self, source: Engine | Callable[[], Engine], model_id: str = "", head_path: str | None = None):
        self._source, self.model_id, self.head_path = source, model_id, head_path
        self._lock = threading.Lock()
        self._views: dict[str, Engine] = {}

    def get(self, attn_impl: str = "auto") -> Engine:
        """The engine for an attention implementation; all views share the same weights."""
        if attn_impl not in IMPLS:
            raise UserFacingError(f"attention implementation must be one of {IMPLS}, got {attn_impl!r}")
        with self._lock:
            if "base" not in self._views:
                self._views["base"] = self._source if isinstance(self._source, Engine) else self._source()
            base = self._views["base"]
            if attn_impl not in self._views:
                self._views[attn_impl] = _view(base, attn_impl)
            return self._views[attn_impl]

    @property
    def head_is_random(self) -> bool:
        return self.get().head_name.startswith("random")


def _view(base: Engine, attn_impl: str) -> Engine:
    if attn_impl == "triton" and base.target.device.type != "cuda":
        raise UserFacingError("the Triton attention kernel needs a GPU, and this server runs on a CPU: choose "
                              "attention 'auto' or 'torch'")
    try:
        return base.with_attention(attn_impl)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc


def attention_choices() -> tuple[str, ...]:
    """The attention implementations the page offers: Triton's kernel only where PyTorch sees a CUDA GPU (on
    a CPU it runs only in Triton's interpreter, a tool for tests, not for a class)."""
    import torch

    return IMPLS if torch.cuda.is_available() else tuple(impl for impl in IMPLS if impl != "triton")


@dataclass(frozen=True)
class Knobs:
    """The page's knobs. `adaptive`: the cost-aware tree (the three tree knobs become upper bounds), else
    SGLang's fixed tree; `source`: where candidates come from (`config.SOURCES`: the EAGLE head, prompt lookup,
    or both)."""

    steps: int = 5
    topk: int = 4
    draft_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    attn_impl: str = "auto"
    adaptive: bool = True
    source: str = TreeConfig.source  # candidates from the head and prompt lookup, as the command line

    def configs(self) -> tuple[TreeConfig, SamplingConfig]:
        try:
            if not isinstance(self.adaptive, bool):
                raise ValueError(f"adaptive must be True or False, got {self.adaptive!r}")
            tree = TreeConfig.create(int(self.steps), int(self.topk), int(self.draft_tokens), adaptive=self.adaptive,
                                     source=str(self.source))
            sampling = SamplingConfig(float(self.temperature), float(self.top_p), int(self.max_new_tokens),
                                      int(self.seed))
        except (ValueError, TypeError) as exc:
            raise UserFacingError(str(exc)) from exc
        return tree, sampling

    def validity(self) -> str:
        """The validity rule with these numbers, and any adjustment SGLang would make."""
        try:
            tree, _ = self.configs()
        except UserFacingError as exc:
            return f"**Invalid:** {exc}"
        cap = tree_token_cap(int(self.steps), int(self.topk))
        rule = (f"Rule: draft_tokens \u2264 1 + topk + (steps \u2212 1)\u00b7topk\u00b2 = **{cap}** "
                f"(range {LIMITS['draft_tokens'][0]}..{LIMITS['draft_tokens'][1]}); topk = 1 means a chain with "
                f"draft_tokens = steps + 1.")
        notes = "".join(f"\n\n\u26a0 Adjusted: {a}" for a in tree.adjustments)
        verified = (f"Verified per cycle: **at most {tree.draft_tokens}** tokens (root included), as many levels and "
                    "tokens as pay on this machine." if tree.adaptive else
                    f"Verified per cycle: **{tree.draft_tokens}** tokens (root included).")
        return f"{rule}\n\n{verified}{notes}"

    def flags(self, hub: EngineHub) -> str:
        try:
            tree, sampling = self.configs()
        except UserFacingError as exc:
            return f"# invalid knobs: {exc}"
        engine = hub.get()
        arch = engine.head.config.arch if engine.head is not None else "eagle1"
        head = hub_id(hub.head_path, exists=lambda p: Path(p).exists() or (ASSETS.parent / p).exists())
        local = engine.head_name if hub.head_path and head is None else ""
        return launch_flags(hub.model_id or engine.target.name, head, tree, sampling, arch, local)


@dataclass(frozen=True)
class FastestTree:
    """The fastest tree `python -m eagleviz tune` measured (on this machine, else the shipped result for the
    shipped head), a fixed tree as tune ran it: what the race times, one click away on the page."""

    tree: TreeConfig
    origin: str
    shipped: bool = False   # the shipped benchmark's result, not this machine's

    @property
    def label(self) -> str:
        return f"{self.tree.steps} / {self.tree.topk} / {self.tree.draft_tokens}"


def fastest_tree(temperature: float = 0.0) -> FastestTree | None:
    """This machine's fastest tree at this temperature (`measured.tuned_tree`), else None (never measured)."""
    found = tuned_tree(temperature)
    return FastestTree(tuned_config(found), found.origin, found.shipped) if found is not None else None


def why_small_trees(n: int = 16, costs: CostModel | None = None) -> str:
    """One line: why a CPU's fastest tree is small, with the verification cost measured where the page is served
    (`costs`, the server's price list, when measured), else the curve the page's *Measured speed* section draws
    (this machine's `tune`, else the shipped benchmark's, named with its CPU)."""
    if costs is not None and costs.step_ms > 0:
        cost, where = costs.verify_cost(n) / costs.verify_cost(1), "on this server (its price list)"
    else:
        found = latest_verify_cost()
        curve = {int(k): float(v) for k, v in found.data["verify_cost"]["relative"].items()} if found else {}
        if n not in curve:
            return ("A CPU prefers small trees: every verified token and every draft level costs time here "
                    "(`python -m eagleviz tune --curve-only` measures how much).")
        cpu = found.data.get("machine", {}).get("cpu", "another CPU")
        cost, where = curve[n], ("on this machine" if not found.shipped else f"on the shipped benchmark's {cpu}") + (
            " (the verification cost curve under *Measured speed*)")
    return (f"A CPU prefers small trees: verifying {n} tokens in one forward costs {cost:.1f}x verifying one {where}, "
            "and every draft level is another forward of "
            "the head, while deeper guesses are accepted less often; on a GPU verifying 64 tokens costs less than "
            "two plain steps (1.65 ms against ~1.0 ms on an H200: docs/performance.md entry 46), so wide trees can "
            "pay there once the head drafts cheaply.")


def stream_run(hub: EngineHub, prompt: str, knobs: Knobs, limits: Limits = DEFAULT_LIMITS,
               clock: Callable[[], float] = time.perf_counter,
               turns: Turns | None = None) -> Iterator[tuple[RunTrace, CycleTrace | None]]:
    """Start a speculative run: yields (run, None) once the prompt is encoded, then (run, cycle) per cycle.
    `run` is filled progressively by the engine (output tokens, cycles, timings). A request over the server's
    limits is refused before any computation.

    Each step (the prefill with the first cycle, then one cycle) is taken in a turn of `turns`, the server's
    one line to the model (a private one when None): runs share the model cycle by cycle. The run's wall time
    counts its own turns only, so its tokens/s are the decoding's, not the queue's; a run that waited for
    other runs carries a note saying how long. A run whose own time outlives `limits.max_run_seconds` stops
    after the cycle that crosses it, with its partial trace and the reason in `run.stop_reason`."""
    tree, sampling = knobs.configs()
    limits.check_request(prompt, tree, sampling)
    engine = hub.get(knobs.attn_impl)
    ids = engine.encode_prompt(prompt)
    limits.check_kv(engine, len(ids), tree, sampling)
    run = engine.new_run(prompt, ids, tree, sampling)
    yield run, None
    # one cycle a turn, resting ones too: a CPU's stretch of plain steps would hold the line for 16 of them; a
    # GPU's yields each cycle as it goes, its next step launched before (`Engine._rest_steps`)
    rest_batch = None if engine.queued else 1
    cycles = (turns or Turns(clock=clock)).steps(engine.speculate(ids, tree, sampling, run, rest_batch=rest_batch))
    try:
        for cycle in cycles:
            run.wall_s = cycles.busy_s
            if cycles.busy_s > limits.max_run_seconds and not run.stop_reason:
                run.stop_reason = (f"time limit of {limits.max_run_seconds} s per run on this server; the run so "
                                   "far is kept")
                yield run, cycle
                return
            yield run, cycle
    except ValueError as exc:  # a kernel or shape check refused the input: say why
        raise UserFacingError(str(exc)) from exc
    finally:
        cycles.close()
        run.wall_s = cycles.busy_s
        if cycles.waited_s >= SHARED_NOTE_AFTER_S:
            run.notes.append(f"{SHARED_NOTE}: this run waited {cycles.waited_s:.1f} s for its turns, time left "
                             "out of its wall time and tokens/s.")


def generate(hub: EngineHub, prompt: str, knobs: Knobs, limits: Limits = DEFAULT_LIMITS,
             turns: Turns | None = None) -> RunTrace:
    run = None
    for run, _ in stream_run(hub, prompt, knobs, limits, turns=turns):
        pass
    return run


def race_run(hub: EngineHub, run: RunTrace, attn_impl: str = "auto", limits: Limits = DEFAULT_LIMITS,
             clock: Callable[[], float] = time.monotonic):
    """Race plain decoding against a recorded run (`eagleviz.decoding.race`) within the server's limits, as for a new
    run: the run may be an imported trace, so its prompt, length and KV cache are checked before any
    computation, and plain decoding stops at `limits.max_run_seconds` (the comparison covers what it made)."""
    from eagleviz.decoding import race as race_mod

    try:
        sampling = race_mod.race_sampling(run)
    except ValueError as exc:
        raise UserFacingError(f"this run cannot be raced: {exc}") from exc
    limits.check_request(run.prompt, None, sampling)
    engine = hub.get(attn_impl)
    limits.check_kv(engine, len(engine.encode_prompt(run.prompt, race_mod.race_chat(run))), None, sampling)
    deadline = clock() + limits.max_run_seconds

    def stop(_plain: RunTrace) -> str:
        return (f"time limit of {limits.max_run_seconds} s per run on this server"
                if clock() > deadline else "")

    try:
        return race_mod.race(engine, run, stop)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc


def rerun_with(hub: EngineHub, run: RunTrace, tree: TreeConfig, attn_impl: str = "auto",
               limits: Limits = DEFAULT_LIMITS) -> RunTrace | None:
    """EAGLE on the run's prompt with another tree, the same sampling and as many new tokens (the race's fastest
    tree); None when the run already used that tree. Checked against the server's limits like any run."""
    from eagleviz.decoding import race as race_mod

    if tree_of(run) == tree:
        return None
    sampling = race_mod.race_sampling(run)
    limits.check_request(run.prompt, tree, sampling)
    engine = hub.get(attn_impl)
    chat = race_mod.race_chat(run)
    limits.check_kv(engine, len(engine.encode_prompt(run.prompt, chat)), tree, sampling)
    try:
        return engine.generate(run.prompt, tree, sampling, chat)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc


def tree_of(run: RunTrace) -> TreeConfig | None:
    """The tree a run was made with (a trace from before cost-aware trees recorded a fixed one)."""
    tree = run.config.get("tree")
    if not isinstance(tree, dict):
        return None
    try:
        return TreeConfig.create(tree["steps"], tree["topk"], tree["draft_tokens"],
                                 adaptive=tree.get("adaptive", False) is True, source=tree.get("source", "eagle"))
    except (KeyError, TypeError, ValueError):
        return None


def knobs_of(run: RunTrace, base: Knobs, limits: Limits = DEFAULT_LIMITS) -> Knobs:
    """The knobs a recorded run was made with (its tree and its sampling, within this server's limits), the
    others from `base`; a run of plain decoding keeps base's tree."""
    s = run.config["sampling"]
    knobs = replace(base, temperature=float(s["temperature"]), top_p=float(s["top_p"]), seed=int(s["seed"]),
                    max_new_tokens=min(int(s["max_new_tokens"]), limits.max_new_tokens))
    tree = tree_of(run)
    if tree is None:
        return knobs
    return replace(knobs, steps=tree.steps, topk=tree.topk, adaptive=tree.adaptive, source=tree.source,
                   draft_tokens=min(tree.draft_tokens, limits.max_draft_tokens))


def read_trace(path: str | os.PathLike, limits: Limits = DEFAULT_LIMITS) -> RunTrace:
    """Load an exported trace as data: at most `limits.max_upload_mb`, UTF-8 JSON of the current schema with
    every field of its declared type, a usable configuration, internally consistent."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > limits.max_upload_bytes:
            raise UserFacingError(f"the file has {size / 2**20:.1f} MB; traces are limited to {limits.max_upload_mb} MB "
                                  "on this server")
        data = path.read_bytes()
    except OSError as exc:
        raise UserFacingError("the file could not be read on the server") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFacingError(f"this is not a valid eagleviz trace: not UTF-8 text (byte {exc.start})") from exc
    try:
        run = RunTrace.from_json(text)
        _check_config(run.config)
        check_displayable(run)
    except json.JSONDecodeError as exc:   # the parser's own words ("Expecting value: ...") mean little here
        raise UserFacingError(f"this is not an eagleviz trace: the file is not JSON text (it goes wrong at line "
                              f"{exc.lineno}, column {exc.colno}). Export a run with \"Export trace (JSON)\" "
                              "and import that file") from exc
    except (ValueError, TypeError, KeyError) as exc:
        raise UserFacingError(f"this is not a valid eagleviz trace: {str(exc)[:300]}") from exc
    return run


def _check_config(config: dict) -> None:
    """The recorded settings must rebuild (the race and the replay read them)."""
    if not isinstance(config.get("sampling"), dict):
        raise ValueError("config.sampling is missing")
    SamplingConfig(**config["sampling"])
    if not isinstance(config.get("speculative"), bool):
        raise ValueError("config.speculative must be true or false")
    tree = config.get("tree")
    if tree is not None:
        if not isinstance(tree, dict):
            raise ValueError("config.tree must be an object")
        TreeConfig(**{k: tree[k] for k in ("steps", "topk", "draft_tokens")})


def write_trace(run: RunTrace, folder: str | os.PathLike | None = None) -> str:
    """The run as a JSON file for download; returns its path. Files live in one temp folder and are deleted
    after TRACE_TTL_S (Gradio copies what it serves into its own cache)."""
    folder = Path(folder or Path(tempfile.gettempdir()) / "eagleviz-traces")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _forget_old(folder, TRACE_TTL_S)
    fd, name = tempfile.mkstemp(prefix="eagleviz-trace-", suffix=".json", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(run.to_json())
    return name


def _forget_old(folder: Path, ttl_s: float) -> None:
    cutoff = time.time() - ttl_s
    for old in folder.glob("eagleviz-trace-*.json"):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:  # another worker removed it first
            pass
