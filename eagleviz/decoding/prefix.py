"""The chat template's opening, encoded once: every chat prompt starts with the same tokens (SmolLM2's system
prompt and the user turn's header, 24 of a typical prompt's ~40), so their keys, values and features are
computed once per engine and copied into each run's cache; a prefill then computes only the rest of the prompt.
SGLang's radix cache does this for any prefix that requests share; here it is the one every request shares.

    chat_prefix(encode)      the token ids every prompt encoded through the chat template starts with
    PrefixCache              that prefix's encoded form, per attention implementation, computed on first use
    Prefix                   one encoded prefix: keys, values (the target cache's layout) and features
    PromptCache              whole prompts, as a prefill left them (`Prompt`: the prefix's fields and the last
                             position's logits), the most recently used few kept: a class that presses Run on the
                             same preset prefills it once (the app keeps 16; an engine keeps none unless asked,
                             so a benchmark's repeated prompts are prefilled every time)

The prefill always splits where the prefix ends, the first time too, so a run's numbers do not depend on
whether the prefix was encoded before it: the same prompt gives the same tokens, bit for bit, cold or warm. A
prompt taken whole from the `PromptCache` is what its first prefill computed, so the same holds for it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagleviz.models.kv_cache import KVCache

PROMPT_BYTES = 256 * 2**20  # what kept prompts may hold in all (2,000 tokens of SmolLM2's fp32 cache: ~0.1 GB)

# Two user messages that differ from their first character: their token ids agree exactly on the opening
PROBES = ("x", "0")


def chat_prefix(encode: Callable[[str], list[int]]) -> tuple[int, ...]:
    """The longest run of token ids that prompts encoded by `encode` (the engine's `encode_prompt`, through the
    chat template) share. The ids are compared, not the text, so a prompt whose first characters merge with the
    opening into other tokens simply does not start with it (`PrefixCache.covers`)."""
    ids = [encode(probe) for probe in PROBES]
    shared = 0
    for a, b in zip(*ids):
        if a != b:
            break
        shared += 1
    return tuple(ids[0][:shared])


@dataclass(frozen=True)
class Prefix:
    """An encoded prefix: k, v (layers, Hkv, P, D) as the target's cache holds them; features (P, F): what the
    draft head reads for those positions (the engine's feature layers)."""

    k: torch.Tensor
    v: torch.Tensor
    features: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def copy_into(self, cache: KVCache) -> None:
        """The prefix's slots of an empty cache, filled."""
        if cache.length:
            raise ValueError(f"a prefix goes into an empty cache, this one holds {cache.length} slots")
        n = self.length
        cache.k[:, :, :n] = self.k
        cache.v[:, :, :n] = self.v
        cache.length = n


class PrefixCache:
    """The chat prefix's encoded form, shared by every run of an engine (and its views with other attention
    implementations: each implementation has its own entry, since their numbers may differ in the last bit).
    Thread-safe: runs that start together encode it once."""

    def __init__(self, ids: tuple[int, ...]):
        self.ids = ids
        self._lock = threading.Lock()
        self._entries: dict[str, Prefix] = {}

    def covers(self, prompt_ids: list[int]) -> int:
        """How many leading ids of this prompt come from the cache: the prefix's length when the prompt starts
        with it and goes on past it (the last position's logits are computed fresh), else 0."""
        n = len(self.ids)
        return n if n and len(prompt_ids) > n and tuple(prompt_ids[:n]) == self.ids else 0

    def get(self, impl: str, encode: Callable[[list[int]], Prefix]) -> Prefix:
        """The prefix encoded with attention `impl`; `encode(ids)` computes it the first time."""
        with self._lock:
            entry = self._entries.get(impl)
            if entry is None:
                entry = self._entries[impl] = encode(list(self.ids))
            return entry


@dataclass(frozen=True)
class Prompt(Prefix):
    """A whole prompt as its prefill left it: keys, values and features (None where the run read none: plain
    decoding) of every position, and the logits (V,) at the last, from which the first token is chosen."""

    logits: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.k, self.v, self.features, self.logits) if t is not None)

    @classmethod
    def of(cls, cache: KVCache, features: torch.Tensor | None, logits: torch.Tensor) -> Prompt:
        """The prompt in `cache`'s filled slots, copied (the run goes on writing into its cache)."""
        n = cache.length
        return cls(cache.k[:, :, :n].clone(), cache.v[:, :, :n].clone(),
                   None if features is None else features.clone(), logits.clone())


class PromptCache:
    """The `entries` most recently prefilled prompts, per attention implementation, in at most `max_bytes` (0
    entries: none kept; a prompt larger than `max_bytes` is not kept). Thread-safe."""

    def __init__(self, entries: int = 0, max_bytes: int = PROMPT_BYTES):
        self.entries, self.max_bytes = entries, max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple, Prompt] = OrderedDict()
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """The bytes the kept prompts hold."""
        return self._bytes

    def get(self, impl: str, ids: list[int], features: bool) -> Prompt | None:
        """The prompt `ids` prefilled before with attention `impl` (with its features, where `features` asks for
        them), now the most recently used; None where it is not kept."""
        with self._lock:
            key = (impl, tuple(ids))
            found = self._kept.get(key)
            if found is None or (features and found.features is None):
                return None
            self._kept.move_to_end(key)
            return found

    def put(self, impl: str, ids: list[int], prompt: Prompt) -> None:
        """Keep `prompt` (unless one with features is kept for it already and this one has none), dropping the
        least recently used past `entries` or `max_bytes`."""
        if not self.entries or prompt.nbytes > self.max_bytes:
            return
        with self._lock:
            key = (impl, tuple(ids))
            kept = self._kept.get(key)
            if kept is not None and kept.features is not None and prompt.features is None:
                return
            if kept is not None:
                self._bytes -= kept.nbytes
            self._kept[key] = prompt
            self._kept.move_to_end(key)
            self._bytes += prompt.nbytes
            while len(self._kept) > self.entries or self._bytes > self.max_bytes:
                self._bytes -= self._kept.popitem(last=False)[1].nbytes

    def __len__(self) -> int:
        return len(self._kept)
