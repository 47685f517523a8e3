"""The target/draft-head pairs a server offers, and the one it holds in memory.

The operator chooses; a visitor only picks among the operator's pairs, by name:

    EAGLEVIZ_PAIRS=pairs.json              a JSON list of {"name", "model", "head", "dtype", "draft_vocab"}
    EAGLEVIZ_MODEL=... EAGLEVIZ_HEAD=...   one pair (model: "embedded", a directory or a Hub id; head: a
                                           directory, a Hub id or "random"; unset head: the shipped head for
                                           the embedded model, else a random one)
    neither                                the embedded SmolLM2-135M-Instruct with the shipped head

`PairHub` loads a pair on first use and holds one at a time: on a GPU two 8B pairs do not fit, so choosing
another pair waits for the runs on the current one to finish, releases it, then loads the new one. When the
new one fails to load (out of memory, a head that does not fit), the previous one is loaded back and the
error is reported: the server keeps working.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from eagleviz.errors import UserFacingError
from eagleviz.models.loading import DTYPES, EMBEDDED, EMBEDDED_HUB_ID

NAME_CHARS = 80


@dataclass(frozen=True)
class Pair:
    """One target model with one draft head. `head` None: the default head for the model."""

    name: str
    model: str = EMBEDDED
    head: str | None = None
    dtype: str = "auto"
    draft_vocab: int | None = None

    def __post_init__(self):
        if not self.name or len(self.name) > NAME_CHARS or not self.name.isprintable():
            raise ValueError(f"a pair's name must be 1 to {NAME_CHARS} printable characters, got {self.name!r}")
        if not self.model:
            raise ValueError(f"pair {self.name!r}: model is empty")
        if self.dtype not in DTYPES:
            raise ValueError(f"pair {self.name!r}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.draft_vocab is not None and (type(self.draft_vocab) is not int or self.draft_vocab < 0):
            raise ValueError(f"pair {self.name!r}: draft_vocab must be a non-negative integer")

    @property
    def model_id(self) -> str:
        """The target's name as SGLang or vLLM would be given it."""
        return EMBEDDED_HUB_ID if self.model == EMBEDDED else self.model


EMBEDDED_PAIR = Pair("SmolLM2-135M-Instruct + shipped EAGLE-3 head")


def read_pairs(path: str | os.PathLike) -> tuple[Pair, ...]:
    """A pairs file: a JSON list of objects with the fields of `Pair` (name and model required)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserFacingError(f"EAGLEVIZ_PAIRS={path}: {exc.__class__.__name__}: {exc}") from exc
    if not isinstance(data, list) or not data:
        raise UserFacingError(f"EAGLEVIZ_PAIRS={path}: expected a non-empty JSON list of pairs")
    known = {f.name for f in fields(Pair)}
    pairs = []
    for k, item in enumerate(data):
        if not isinstance(item, dict) or not {"name", "model"} <= set(item) or set(item) - known:
            raise UserFacingError(f"EAGLEVIZ_PAIRS={path}: pair {k} must be an object with name and model, and "
                                  f"only the fields {sorted(known)}")
        try:
            pairs.append(Pair(**item))
        except (TypeError, ValueError) as exc:
            raise UserFacingError(f"EAGLEVIZ_PAIRS={path}: {exc}") from exc
    names = [p.name for p in pairs]
    if len(set(names)) != len(names):
        raise UserFacingError(f"EAGLEVIZ_PAIRS={path}: two pairs share a name")
    return tuple(pairs)


def pairs_from_env(env: Mapping[str, str] | None = None) -> tuple[Pair, ...]:
    """The pairs this server offers (see the module docstring); the first is loaded at start."""
    env = os.environ if env is None else env
    path, model, head = (env.get(k, "").strip() for k in ("EAGLEVIZ_PAIRS", "EAGLEVIZ_MODEL", "EAGLEVIZ_HEAD"))
    if path:
        if model or head:
            raise UserFacingError("set EAGLEVIZ_PAIRS or EAGLEVIZ_MODEL / EAGLEVIZ_HEAD, not both")
        return read_pairs(path)
    if not model and not head:
        return (EMBEDDED_PAIR,)
    model = model or EMBEDDED
    name = Path(model.rstrip("/")).name if model != EMBEDDED else "SmolLM2-135M-Instruct"
    return (Pair(f"{name} + {Path(head.rstrip('/')).name if head else 'default head'}", model, head or None),)


def settle_memory() -> None:
    """Once a model is loaded: collect, then move everything alive into the collector's permanent generation
    (`gc.freeze`). The model, its tokenizer, the libraries and the page stay for the server's life; without
    this every full collection walks all their objects while no other Python thread runs: with thirty runs on
    the page, one came as the runs started and stalled the first of them."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)   # once: at exit the interpreter's last collection sees everything again, so
    atexit.register(gc.unfreeze)     # libraries' objects are destroyed as usual (nanobind reports them otherwise)


def release_memory() -> None:
    """Return freed tensors' memory: Python's cycles first (what `settle_memory` froze included), then the
    CUDA allocator's cache."""
    gc.unfreeze()
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class PairHub:
    """The offered pairs, one held at a time. `load(pair)` builds what a run needs (an EngineHub); `release`
    frees memory once the previous one is dropped. `use(name)` is where runs take the pair."""

    def __init__(self, pairs: tuple[Pair, ...], load: Callable[[Pair], object],
                 release: Callable[[], None] = release_memory):
        if not pairs:
            raise ValueError("a server offers at least one pair")
        self.pairs = {p.name: p for p in pairs}
        self._load, self._release = load, release
        self._cond = threading.Condition()
        self._name: str | None = None
        self._held = None
        self._users = 0

    @property
    def names(self) -> list[str]:
        return list(self.pairs)

    @property
    def default(self) -> str:
        return next(iter(self.pairs))

    def pair(self, name: str | None) -> Pair:
        """The pair called `name` (None or "": the default); anything else is refused: a browser picks only
        among the operator's pairs, never a path."""
        name = name or self.default
        if name not in self.pairs:
            raise UserFacingError(f"{str(name)[:NAME_CHARS]!r} is not a model offered on this server "
                                  f"(offered: {', '.join(self.pairs)})")
        return self.pairs[name]

    def resident(self) -> str | None:
        """The name of the pair in memory, if any."""
        return self._name

    def peek(self, name: str | None = None):
        """What `load` made for the pair when it is the one in memory, else None (nothing is loaded)."""
        with self._cond:
            return self._held if self._name == self.pair(name).name else None

    @contextmanager
    def use(self, name: str | None = None) -> Iterator:
        """Hold pair `name` for the duration of a run, loading it first if another is in memory (after the
        runs on that one finish). Raises UserFacingError when it cannot be loaded; the previous pair is then
        back in memory."""
        pair = self.pair(name)
        with self._cond:
            while self._name != pair.name and self._users:
                self._cond.wait()
            if self._name != pair.name:
                self._swap(pair)
            self._users += 1
            held = self._held
        try:
            yield held
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    def _swap(self, pair: Pair) -> None:
        previous = self.pairs.get(self._name) if self._name else None
        self._held, self._name = None, None
        if previous is not None:
            self._release()
        try:
            self._held, self._name = self._load(pair), pair.name
        except (UserFacingError, MemoryError, RuntimeError) as exc:
            self._release()
            why = _load_failure(exc)
            if previous is not None:
                self._held, self._name = self._load(previous), previous.name
                why += f"; {previous.name!r} is loaded again"
            raise UserFacingError(f"could not load {pair.name!r}: {why}") from exc


def _load_failure(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    if isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return "out of memory (the pair does not fit this machine: use a smaller dtype, a smaller model or a " \
               "larger GPU)"
    return text[:300]
