"""What the engine did, cycle by cycle: the contract between the engine and every picture.

Glossary (shared by code, trace and UI):
    target        the large model whose output distribution must be preserved
    draft         the EAGLE head: predicts the target's next feature and token from the target's features
    cycle         one round of draft -> verify -> accept -> rewind
    tree          the draft tokens of one cycle; its root is the last committed token not yet in the target KV
    node          one draft token in the tree (candidate); `depth` 1 is a child of the root
    expanded      a node the draft ran a forward on, to propose its children
    kept          a node that survived reranking and was sent to the target for verification
    slot          a node's index in verification order (0 = root); tree attention lets slot i see only its
                  ancestors and itself (plus the whole committed prefix)
    path          the accepted chain of slots, root first
    accept length number of draft tokens accepted in a cycle (path length - 1)
    bonus token   the token the target itself supplies after the accepted path (argmax, or a sample from the
                  target or the residual distribution at T > 0); it becomes the next root
    commit        adding the accepted path's tokens to the sequence
    rewind        compacting the accepted path's KV slots after the prefix and dropping the rest
    tau           mean tokens committed per cycle, bonus included (= mean accept length + 1)
    n-alpha       acceptance rate at depth n + 1 given that depth n was accepted

Stdlib and numpy only; `RunTrace.to_json()` / `RunTrace.from_json()` round-trip with a schema version.
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass

import numpy as np

SCHEMA_VERSION = 1
ROOT_TOP = 64
MAX_JSON_DEPTH = 16       # a trace nests 5 levels; anything deeper is refused before parsing


@dataclass
class TreeNode:
    """A draft candidate. `parent` is a node id or -1 for the root; `slot` is its verification slot or -1."""

    id: int
    parent: int
    depth: int
    token: int
    text: str
    prob: float          # draft probability given its parent (local); for a lookup node, its estimated acceptance
    score: float         # cumulative draft log-probability from the root; for a lookup node, the log of its value
    expanded: bool
    kept: bool
    slot: int = -1
    source: str = "eagle"        # who proposed it: "eagle" (the head), "lookup" (the context) or "both"
    value: float | None = None   # the chance of acceptance reranking sorted by (None in older traces)


@dataclass
class NodeCheck:
    """The target's verdict on one tried draft token. At T = 0, `accept_prob` is 1 or 0 (token == argmax).
    At T > 0 (multi-round speculative sampling with top-k drafts, proposal probability 1):
    accept_prob = p(x) under the current residual distribution, accepted iff uniform < accept_prob."""

    slot: int
    depth: int
    token: int
    text: str
    p: float             # target probability of the token (residual after earlier rejections at this depth)
    q: float             # draft probability of the token (shown for teaching; the proposal was deterministic);
                         # for a lookup node (TreeNode.source), its calibrated acceptance, as TreeNode.prob
    accept_prob: float
    uniform: float | None
    accepted: bool
    target_token: int    # the target's argmax at the parent
    target_text: str
    residual_top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(slots=True)
class KVMap:
    """One cache around a cycle. Slots are absolute cache indices."""

    before: int                         # committed length when the cycle started
    appended: list[int]                 # slots written during the cycle (tree slots / draft expansion slots)
    moves: list[tuple[int, int]]        # (source, destination) copies made by the commit
    after: int                          # committed length after the rewind


@dataclass(slots=True)
class CycleTrace:
    index: int
    nodes: list[TreeNode]
    verify_nodes: list[int]             # node id per verification slot (root = -1)
    tokens: list[int]                   # token per slot, root first
    texts: list[str]
    parents: list[int]                  # parent slot per slot (-1 for the root)
    positions: list[int]                # target position per slot = prefix length + depth
    mask: list[list[int]]               # (T, T) 1 where slot i may attend to slot j (ancestor-or-self)
    target_tokens: list[int]            # target argmax at each slot
    target_texts: list[str]
    target_probs: list[float | None]    # target probability of that argmax (softmax at the temperature, before
    # top-p); None where the cycle did not compute it (a greedy cycle of the root alone reads the argmax only)
    checks: list[NodeCheck]
    path: list[int]                     # accepted slots, root first
    bonus_token: int
    bonus_text: str
    bonus_source: str                   # "target" (argmax or sample at the last accepted slot) or "residual"
    accept_length: int
    committed: list[int]                # tokens committed by this cycle: accepted drafts then the bonus
    kv_target: KVMap
    kv_draft: KVMap
    timings_ms: dict[str, float]        # draft, verify, accept, rewind
    # The target's sampling distribution at the root (slot 0), its ROOT_TOP most likely tokens; filled at T > 0
    # only (greedy acceptance needs no distribution). Lets the acceptance step be replayed without the model.
    root_top: list[tuple[int, str, float]] = field(default_factory=list)
    # The tree's own forecast: draft tokens it expected to be accepted (the sum of the verified nodes' values),
    # the draft levels run, and why a cost-aware tree stopped or shrank ("" when it did not; None / 0 in older
    # traces and in lookup-only runs' levels)
    expected_accept: float | None = None
    draft_levels: int = 0
    decision: str = ""
    lookup_ngram: int = 0               # the suffix match behind the cycle's lookup nodes (0: none)

    @property
    def num_tree_tokens(self) -> int:
        return len(self.tokens)


@dataclass(slots=True)
class OutputToken:
    token: int
    text: str
    cycle: int          # -1 for the token produced by the prefill
    source: str         # "prefill", "draft" (accepted draft token) or "bonus"
    # What the token adds to the output's text where its own text is not whole: a byte-level tokenizer spells an
    # emoji over several tokens, each alone "\ufffd"; the unfinished ones add "" and the one that finishes it the
    # character. None: its own `text` (every other token, and traces that predate the field).
    piece: str | None = None

    @property
    def written(self) -> str:
        """The token's part of the output's text."""
        return self.text if self.piece is None else self.piece


def numerics(weights: str, dtype: str) -> str:
    """How a target computed: "weight blocks" (the model file's Q4_1/Q8_0 blocks, int8 activations; the
    trace's dtype, float32, is then only the activations' and the cache's) or the dtype of its dense weights."""
    return "weight blocks" if weights == "blocks" else dtype


@dataclass
class RunTrace:
    prompt: str
    prompt_tokens: int
    config: dict
    seed: int
    device: str
    dtype: str
    attn_impl: str
    model: str
    head: str
    cycles: list[CycleTrace] = field(default_factory=list)
    output: list[OutputToken] = field(default_factory=list)
    prefill_ms: float = 0.0
    prefill_reused: int = 0  # prompt tokens whose keys and values came from the engine's chat-prefix cache
    wall_s: float = 0.0
    stop_reason: str = ""
    kv_dtype: str = ""   # the KV caches' and attention's dtype ("" in traces written before it was recorded)
    cpu_layer: str = ""  # "compiled" (kernels/cpu_ops) or "torch": how each layer's small operations ran
    weights: str = ""  # "blocks" (the model file's Q4_1/Q8_0 blocks, kernels/quant_ops) or "dense": the products
    chat: bool | None = None  # whether the prompt went through the chat template (None: not recorded)
    # where the timings were taken: the GPU's name, or the CPU's description and torch's thread count
    # (`Engine.machine`); "" in traces written before it was recorded
    machine: str = ""
    # what the run's reader should know about how it ran, one sentence each: e.g. that the Triton kernel failed
    # its self-check on this GPU and verification fell back to PyTorch attention (empty in older traces)
    notes: list[str] = field(default_factory=list)
    # the path its steps took (`eagleviz.decoding.steps`): "eager", "graphs" (CUDA graphs), or "static" (a static
    # state uncaptured, asked or after a capture failed, which `notes` says); "" in older traces
    decode: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def token_ids(self) -> list[int]:
        return [t.token for t in self.output]

    @property
    def text(self) -> str:
        return "".join(t.written for t in self.output)

    def summary(self) -> dict:
        return summarize(self)

    @property
    def numerics(self) -> str:
        """How the target computed, in a few words: "weight blocks" or its dtype (`numerics`)."""
        return numerics(self.weights, self.dtype)

    def to_dict(self) -> dict:
        return plain(self) | {"summary": self.summary()}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> RunTrace:
        if not isinstance(data, dict):
            raise ValueError("a trace must be a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"unsupported trace schema version {version!r} (this build reads {SCHEMA_VERSION})")
        return _build(cls, data)

    @classmethod
    def from_json(cls, text: str) -> RunTrace:
        """Parse a trace as data. The nesting depth is checked first, without recursion, so that a hostile
        document cannot exhaust the parser's stack; then every field must have its declared type."""
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"the JSON nests {depth} levels deep; a trace nests at most {MAX_JSON_DEPTH}")
        return cls.from_dict(json.loads(text))


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str, chunk: int = 1 << 20) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped). No recursion and no parse:
    one regex pass keeps the brackets, then a running sum over them, a chunk at a time, so memory stays a
    small multiple of the text whatever the document."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode("ascii")
    level = deepest = 0
    for start in range(0, len(brackets), chunk):
        codes = np.frombuffer(brackets, np.uint8, count=min(chunk, len(brackets) - start), offset=start)
        levels = level + np.cumsum(np.where((codes == ord("[")) | (codes == ord("{")), 1, -1), dtype=np.int64)
        deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def plain(value):
    """A dataclass tree as plain data: `dataclasses.asdict` without its deep copy of every leaf (a trace's leaves
    are numbers and strings), three times faster on a trace of a few thousand nodes."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _build(cls, data):
    """Rebuild a dataclass tree from plain JSON data, checking each value against the field's declared type
    and rejecting unknown or missing fields."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    convert = _field_converters(cls)
    unknown = set(data) - set(convert) - {"summary"}
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)[:5]}")
    kwargs = {name: convert[name](data[name]) for name in convert if name in data}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{cls.__name__}: {exc}") from exc


@functools.cache
def _field_converters(cls) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: _converter(hints[f.name], f"{cls.__name__}.{f.name}") for f in fields(cls)}


def _converter(hint, where: str):
    """A function that returns a JSON value as the type `hint` (a dataclass, int, float, str, bool, dict,
    list[...], tuple[...] or X | None) or raises ValueError naming the field. Built once per field."""
    def refuse(value):
        raise ValueError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        return lambda value: _build(hint, value)
    if origin in (types.UnionType, typing.Union):
        inner = _converter(next(a for a in args if a is not type(None)), where)
        return lambda value: None if value is None else inner(value)
    if hint is float:
        return lambda value: float(value) if type(value) in (int, float) else refuse(value)
    if hint in (int, str, bool, dict):
        return lambda value: value if type(value) is hint else refuse(value)
    if origin is list and args[0] in (int, str, bool):   # the long lists (masks, token ids): one pass, no copy
        item = args[0]
        return lambda value: value if type(value) is list and all(type(v) is item for v in value) else refuse(value)
    if origin is list:
        each = _converter(args[0], where)
        return lambda value: [each(v) for v in value] if type(value) is list else refuse(value)
    if origin is tuple:
        parts = [_converter(a, where) for a in args]
        return lambda value: (tuple(c(v) for c, v in zip(parts, value))
                              if type(value) in (list, tuple) and len(value) == len(parts) else refuse(value))
    if origin is dict:
        key, val = _converter(args[0], where), _converter(args[1], where)
        return lambda value: {key(k): val(v) for k, v in value.items()} if type(value) is dict else refuse(value)
    raise TypeError(f"{where}: no JSON conversion for {hint}")


def acceptance_by_depth(cycles: list[CycleTrace]) -> list[dict]:
    """Per depth d >= 1: how often a draft token at depth d was tried (the path reached depth d - 1 and the
    tree had a node there) and how often one was accepted. rate[d - 1] is the paper's (d - 1)-alpha."""
    rows: dict[int, list[int]] = {}
    for c in cycles:
        has_children = set(c.parents)
        reached = len(c.path) - 1
        for d in range(1, reached + 2):
            if c.path[d - 1] not in has_children:
                break
            row = rows.setdefault(d, [0, 0])
            row[0] += 1
            row[1] += int(d <= reached)
    return [{"depth": d, "tried": t, "accepted": a, "rate": a / t if t else 0.0} for d, (t, a) in sorted(rows.items())]


def summarize(run: RunTrace) -> dict:
    n = len(run.cycles)
    lengths = [c.accept_length for c in run.cycles]
    phases = {k: sum(c.timings_ms.get(k, 0.0) for c in run.cycles) / max(n, 1)
              for k in ("draft", "verify", "accept", "rewind")}
    return {
        "new_tokens": len(run.output),
        "num_cycles": n,
        "accept_lengths": lengths,
        "tau": (sum(lengths) + n) / n if n else 0.0,
        "acceptance_by_depth": acceptance_by_depth(run.cycles),
        "tokens_per_s": len(run.output) / run.wall_s if run.wall_s > 0 else 0.0,
        "wall_s": run.wall_s,
        "prefill_ms": run.prefill_ms,
        "prefill_reused": run.prefill_reused,
        "mean_phase_ms": phases,
        "stop_reason": run.stop_reason,
    }
