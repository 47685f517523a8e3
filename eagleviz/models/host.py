"""What crosses between the device and the host during a cycle, and when; and how a cycle's phases are timed.

On a GPU every read of a device value (`.tolist()`, `int(t)`) waits for all queued kernels, and so does a
blocking copy to the device. The engine therefore reads values only where the host must decide something
(the tree's next level, the accepted path) and reads them together (`to_host`: one copy for several tensors,
counted by `counting_reads`),
sends its small index tensors without blocking (`to_device`), and times phases with CUDA events read once at
the end of the cycle (`PhaseClock`) instead of synchronising after each phase. On a CPU the same calls are
the plain operations they replace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

# The reads counted by the innermost `counting_reads` block of this context (None: nobody counts)
_READS: ContextVar[list[int] | None] = ContextVar("eagleviz_host_reads", default=None)


@contextmanager
def counting_reads() -> Iterator[list[int]]:
    """Counts the reads of device values made through `to_host` inside the block: yields a one-item list
    whose item is the count so far. Every read the engine makes goes through `to_host`, so this is how
    tests and `gpu-check` know a plain step reads once (a generator counts where it is iterated)."""
    box = [0]
    token = _READS.set(box)
    try:
        yield box
    finally:
        _READS.reset(token)


def to_host(*tensors: torch.Tensor) -> list[list]:
    """Each tensor as (nested) Python lists. CPU tensors are converted as they are; device tensors travel in
    one float64 copy (exact for int64 below 2**53 and for every float32), so the host waits once."""
    count_read()
    if all(t.device.type == "cpu" for t in tensors):
        return [t.tolist() for t in tensors]
    return batched_to_host(*tensors)


def count_read() -> None:
    """Counts one read made without `to_host`: a C pass over a CPU row that returns Python values where a
    device would read its result, so the counts stay what a device run reads."""
    box = _READS.get()
    if box is not None:
        box[0] += 1


def batched_to_host(*tensors: torch.Tensor) -> list[list]:
    """`to_host` through one concatenated float64 copy, whatever the device (what a GPU run does)."""
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors]).cpu()
    out, start = [], 0
    for t in tensors:
        part = flat[start:start + t.numel()].view(t.shape)
        out.append(part.tolist() if t.is_floating_point() else part.long().tolist())
        start += t.numel()
    return out


def to_device(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of `values` (lists or a CPU tensor) on `device`, copied without making the host wait."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    return host.to(device, non_blocking=True)


class Landing:
    """Small values copied to the host as the device makes them, read after the fact: `send(j, value)` queues a
    copy of a (width,) device tensor (of `dtype`) into slot j % size of pinned memory, and an event after it, on
    the current stream, without waiting; `read(j)` waits for that copy alone (its event, not the whole queue) and
    returns its values as Python numbers. On a CPU the copy is made at once. A slot is written again `size`
    sends later: read it before. Each read counts as one (`count_read`)."""

    __slots__ = ("size", "_slots", "_host", "_events")

    def __init__(self, size: int, device: torch.device, width: int = 1, dtype: torch.dtype = torch.int64):
        cuda = device.type == "cuda"
        self.size = size
        self._slots = torch.zeros(size, width, dtype=dtype, pin_memory=cuda)
        self._host = self._slots.numpy()  # the same memory, read without a tensor operation
        self._events = [torch.cuda.Event() for _ in range(size)] if cuda else None

    def send(self, j: int, value: torch.Tensor) -> None:
        i = j % self.size
        self._slots[i].copy_(value, non_blocking=self._events is not None)
        if self._events is not None:
            self._events[i].record()

    def read(self, j: int) -> list:
        i = j % self.size
        if self._events is not None:
            self._events[i].synchronize()
        count_read()
        return self._host[i].tolist()


class PhaseClock:
    """Durations of consecutive phases in milliseconds. `lap()` closes a phase, `read(names)` returns them.

    On a CPU the marks are wall-clock times. On CUDA they are events recorded on the current stream, and
    `read` waits once, for the last event: the phases are timed on the GPU's own clock without a
    synchronisation between them. `event` makes the CUDA event (tests pass a stand-in)."""

    __slots__ = ("cuda", "_event", "_marks")

    def __init__(self, device: torch.device, event: Callable[[], object] | None = None):
        self.cuda = device.type == "cuda"
        self._event = event
        self._marks = [self._mark() if self.cuda else time.perf_counter()]

    def _mark(self):
        event = self._event() if self._event is not None else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self) -> None:  # a CPU cycle laps right after its forward: nothing but the time read here
        self._marks.append(self._mark() if self.cuda else time.perf_counter())

    def read(self, names: Sequence[str]) -> dict[str, float]:
        """One duration per lap, under `names` (as many as laps)."""
        if len(names) != len(self._marks) - 1:
            raise ValueError(f"{len(names)} names for {len(self._marks) - 1} phases")
        pairs = zip(self._marks, self._marks[1:])
        if not self.cuda:
            return {name: (b - a) * 1e3 for name, (a, b) in zip(names, pairs)}
        self._marks[-1].synchronize()
        return {name: a.elapsed_time(b) for name, (a, b) in zip(names, pairs)}
