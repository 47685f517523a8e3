"""What the app does between the user's knobs and the engine, with no web framework in sight.

    EngineHub     the model, loaded once and shared read-only; one Engine view per attention implementation
    Knobs         the user's settings, validated into TreeConfig + SamplingConfig (SGLang's adjustments shown)
    stream_run    a speculative run as a stream of (run, cycle) pairs, for live display
    generate      the same run drained, as the API returns it
    read_trace    an uploaded trace, size-limited and validated before any figure touches it
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eagleviz.config import LIMITS, SamplingConfig, TreeConfig
from eagleviz.engine import Engine
from eagleviz.errors import UserFacingError
from eagleviz.flags import launch_flags
from eagleviz.trace import CycleTrace, RunTrace
from eagleviz.visuals import check_displayable
from kernels.tree_attention import IMPLS

MAX_TRACE_BYTES = 20 * 2**20      # imported traces: a 512-token run with 64-token trees is ~4 MB
API_MAX_NEW_TOKENS = 512          # the shared server's budget per API call
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
    try:
        engine = Engine(base.target, base.head, base.head_name, attn_impl)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if engine.attn_impl == "triton" and engine.target.device.type == "cpu" and not interpreted:
        raise UserFacingError("The Triton kernel needs a CUDA GPU. On a CPU, start the app with TRITON_INTERPRET=1 "
                              "to run it in Triton's interpreter (slow, for demonstration), or choose 'torch'.")
    return engine


@dataclass(frozen=True)
class Knobs:
    steps: int = 5
    topk: int = 4
    draft_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    attn_impl: str = "auto"

    def configs(self) -> tuple[TreeConfig, SamplingConfig]:
        try:
            tree = TreeConfig.create(int(self.steps), int(self.topk), int(self.draft_tokens))
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
        cap = 1 + self.topk + (self.steps - 1) * self.topk ** 2
        rule = (f"Rule: draft_tokens \u2264 1 + topk + (steps \u2212 1)\u00b7topk\u00b2 = **{cap}** "
                f"(range {LIMITS['draft_tokens'][0]}..{LIMITS['draft_tokens'][1]}); topk = 1 means a chain with "
                f"draft_tokens = steps + 1.")
        notes = "".join(f"\n\n\u26a0 Adjusted: {a}" for a in tree.adjustments)
        return f"{rule}\n\nVerified per cycle: **{tree.draft_tokens}** tokens (root included).{notes}"

    def flags(self, hub: EngineHub) -> str:
        try:
            tree, sampling = self.configs()
        except UserFacingError as exc:
            return f"# invalid knobs: {exc}"
        head = hub.get().head
        arch = head.config.arch if head is not None else "eagle1"
        return launch_flags(hub.model_id or hub.get().target.name, hub.head_path, tree, sampling, arch)


def stream_run(hub: EngineHub, prompt: str, knobs: Knobs) -> Iterator[tuple[RunTrace, CycleTrace | None]]:
    """Start a speculative run: yields (run, None) once the prompt is encoded, then (run, cycle) per cycle.
    `run` is filled progressively by the engine (output tokens, cycles, timings)."""
    tree, sampling = knobs.configs()
    engine = hub.get(knobs.attn_impl)
    ids = engine.encode_prompt(prompt)
    run = engine.new_run(prompt, ids, tree, sampling)
    yield run, None
    try:
        for cycle in engine.speculate(ids, tree, sampling, run):
            yield run, cycle
    except ValueError as exc:  # a kernel or shape check refused the input: say why
        raise UserFacingError(str(exc)) from exc


def generate(hub: EngineHub, prompt: str, knobs: Knobs, max_new_tokens_cap: int = API_MAX_NEW_TOKENS) -> RunTrace:
    if knobs.max_new_tokens > max_new_tokens_cap:
        raise UserFacingError(f"max_new_tokens is capped at {max_new_tokens_cap} on this server")
    run = None
    for run, _ in stream_run(hub, prompt, knobs):
        pass
    return run


def read_trace(path: str | os.PathLike) -> RunTrace:
    """Load an exported trace: at most MAX_TRACE_BYTES, valid JSON of the current schema, internally consistent."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_TRACE_BYTES:
        raise UserFacingError(f"the file has {size / 2**20:.1f} MB; traces are limited to "
                              f"{MAX_TRACE_BYTES // 2**20} MB")
    try:
        run = RunTrace.from_json(path.read_text(encoding="utf-8"))
        check_displayable(run)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise UserFacingError(f"this is not a valid eagleviz trace: {str(exc)[:300]}") from exc
    return run


def write_trace(run: RunTrace) -> str:
    """The run as a JSON file in the temp directory (for download); returns its path."""
    fd, name = tempfile.mkstemp(prefix="eagleviz-trace-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(run.to_json())
    return name
