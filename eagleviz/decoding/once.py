"""A value an engine gets once, when it is first asked for: its price list (`costs.Prices`), its attention choice.

Either is given when the engine is built, or got by a call the first time a run asks for it and kept. On a
ZeroGPU Space the GPU exists only inside `spaces.GPU` calls, so what has to run on it (measuring prices, the
Triton kernel's self-check) waits for the first run's call rather than running at start-up. One holder is shared
by an engine's copies (`Engine.with_policy`, `with_decode`, ...); runs that ask at once wait for one call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Once(Generic[T]):
    """`given`, or what `obtain()` returns the first time `get` is called (one call, whoever asks)."""

    def __init__(self, given: T | None = None, obtain: Callable[[], T] | None = None):
        if (given is None) == (obtain is None):
            raise ValueError("a value is given or obtained, not both and not neither")
        self._value, self._obtain = given, obtain
        self._lock = threading.Lock()

    @property
    def known(self) -> bool:
        """Whether the value is at hand (given, or obtained already): asking for it then costs nothing."""
        return self._value is not None

    def get(self) -> T:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._obtain()
        return self._value
