"""The target's decode step over one static state, captured once per shape bucket and replayed.

On a GPU a decode step of a small model is launch-bound: today's eager forward of SmolLM2-135M issues ~1,200
kernels from Python, ~28 ms a token on an H100, where a CUDA-graph replay of the same forward took 2.7 ms
(docs/gpu-check.md). A graph replays the kernels it recorded, with the addresses and the Python values of its
capture. So a step that can be captured keeps everything that changes from one call to the next in device
memory, allocated once and written in place:

    cache      one `KVCache` of a bucketed capacity (`capacity_bucket`) plus BUCKETS[-1] slots a padded step
               may write beyond the committed ones
    inputs     one int64 buffer: [P, ids (B), positions (B), tree mask (B x B)] for a step of bucket B;
               written from pinned host memory with one copy per step
    outputs    the step's logits (B, V) fp32, features (B, F) and argmax (B,), from the capture's memory pool

P, the committed length, is read by the kernels from the input buffer, never by the host inside the step
(`kernels.tree_attention.attention_static`). A step of n tokens runs the graph of the smallest bucket
B >= n: the n tokens, then B - n padding tokens that see only themselves; their keys land past the committed
slots and no real token sees them. The host advances `cache.length` by n after a step, as the eager forward
does; commits and rewinds (`KVCache.commit_path`) act on the same tensors between steps.

The capture: `CudaGraphs` records on a side stream, each graph in a memory pool of its own; `Uncaptured`
calls the same step function each time (the fallback where capture fails or cannot last, and what a CPU runs
to test the buffers). `EagerSteps` is the same interface over `TargetModel.forward` and a run's own cache: a CPU's path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagleviz.models.host import Landing, to_device

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # padded step sizes, one captured graph each (a plain step is bucket 1)
MIN_CAPACITY = 512  # the smallest cache capacity bucket: runs of short prompts share one state
FED_BACK = ("fed back",)  # the key of the plain step that feeds its token back (`StaticSteps.fed_back`)


def bucket(n: int) -> int:
    """The smallest step size of BUCKETS holding n tokens; a ValueError beyond the largest."""
    for b in BUCKETS:
        if n <= b:
            return b
    raise ValueError(f"a static step holds at most {BUCKETS[-1]} tokens, got {n}")


def capacity_bucket(slots: int, limit: int) -> int:
    """The committed slots a static state holds for a run needing `slots`: the next power of two from
    MIN_CAPACITY on, at most the model's context `limit` (states are shared by runs of one bucket)."""
    cap = MIN_CAPACITY
    while cap < slots:
        cap *= 2
    return max(slots, min(cap, limit))


@dataclass
class StepOutput:
    """What one step leaves on the device, for its n real tokens: logits (n, V) fp32 (None when the step
    asked for none), features (n, F), argmax (n,) int64 (None with the logits)."""

    logits: torch.Tensor | None
    features: torch.Tensor
    argmax: torch.Tensor | None


class Uncaptured:
    """Replays by calling the step function again: the eager path over the same static buffers."""

    captured = False

    def capture(self, fn: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
        return fn


class Replay:
    """A captured step's replay: `run` replays it; `step`, the function that was captured, is held for as long as
    the replay is. A CUDA graph holds the addresses of the tensors its recorded call read, not the tensors: one
    made before the capture and held by the step's closure alone would go back to the allocator with the step,
    and every replay would then read, or write, whatever a later allocation put there (docs/performance.md
    entry 73). What the step reads through an object it holds (a state's buffers, its tables) lives as long as
    that object keeps it."""

    __slots__ = ("run", "step")

    def __init__(self, run: Callable[[], object], step: Callable[[], object] | None):
        self.run, self.step = run, step

    def __call__(self):
        return self.run()


class CudaGraphs:
    """CUDA-graph capture: `capture(fn)` warms fn up on a side stream (Triton compiles, cuBLAS picks its
    kernels), records one call into a graph with a memory pool of its own, and returns a replay that gives the
    outputs of the recorded call (the same tensors each time, rewritten in place) and holds fn, and with it what
    fn's closure holds (`Replay`). Graphs replayed in any order must not share a pool: one graph's temporaries could
    land on another's outputs."""

    captured = True

    def __init__(self, device: torch.device, warmup: int = 2):
        self.device, self.warmup = device, warmup

    def capture(self, fn: Callable[[], StepOutput]) -> Callable[[], StepOutput]:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()

        def replay() -> StepOutput:
            graph.replay()
            return out

        return Replay(replay, fn)


def capture_or_fall_back(state, fn: Callable, what: str, then: str) -> Callable:
    """`state.graphs.capture(fn)`; where a CUDA-graph capture fails (any error), `fn` itself from then on: the
    state's graphs become `Uncaptured`, its captures so far are dropped, and `state.fallback` says why (for the
    run's notes): "CUDA-graph capture{what} failed (...), so {then}"."""
    try:
        return state.graphs.capture(fn)
    except Exception as exc:
        if not state.graphs.captured:
            raise
        state.fallback = f"CUDA-graph capture{what} failed ({exc.__class__.__name__}: {str(exc)[:160]}), so {then}"
        state.graphs, state._replays = Uncaptured(), {}
        if hasattr(state, "_cycles"):
            state._cycles = {}
        return fn


class StepInputs:
    """The int64 input buffer of every bucket's step, on the device, and its pinned host staging.

    Bucket B reads [P, ids (B), positions (B), mask (B * B)] from the buffer's start. `write` fills the
    staging and sends the used part in one copy; it first waits until the previous copy has left the staging
    (a CUDA event; on a CPU the copy is synchronous)."""

    def __init__(self, device: torch.device, largest: int = BUCKETS[-1]):
        size = 1 + 2 * largest + largest * largest
        self.device = device
        self.buffer = torch.zeros(size, dtype=torch.int64, device=device)
        cuda = device.type == "cuda"
        self.staging = torch.zeros(size, dtype=torch.int64, pin_memory=cuda) if cuda else self.buffer
        self._sent = torch.cuda.Event() if cuda else None

    def views(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Bucket b's prefix (1,), ids (b,), positions (b,) and mask (b, b) (1 = visible): views of the buffer,
        which the step reads each time it runs."""
        buf = self.buffer
        return buf[:1], buf[1:1 + b], buf[1 + b:1 + 2 * b], buf[1 + 2 * b:1 + 2 * b + b * b].view(b, b)

    def write(self, prefix: int, tokens: list[int], positions: list[int], mask: torch.Tensor | None, b: int) -> None:
        """Stage a step of n = len(tokens) <= b tokens padded to b: padding tokens are id 0 at the last real
        position and see only themselves; mask (n, n) bool (None: a single token, which sees itself)."""
        n = len(tokens)
        if self._sent is not None:
            self._sent.synchronize()
        s, pad = self.staging, b - n
        head = [prefix, *tokens, *[0] * pad, *positions, *[positions[-1]] * pad]
        if b == 1:  # a plain step (the hot path): its 1 x 1 mask goes in the same single write
            s[:4] = torch.tensor(head + [1])
        else:
            s[:1 + 2 * b] = torch.tensor(head)
            block = s[1 + 2 * b:1 + 2 * b + b * b].view(b, b)
            block.zero_()
            block.diagonal().fill_(1)
            if mask is not None:
                block[:n, :n] = mask
        if s is not self.buffer:
            used = 1 + 2 * b + b * b
            self.buffer[:used].copy_(s[:used], non_blocking=True)
            self._sent.record()


class StaticSteps:
    """The target's steps over one static state (cache, inputs, one replay per bucket captured on first use).

    forward(tokens, positions, mask) runs the step of the smallest bucket that holds the tokens and advances
    `cache.length` by their number. A step of more than BUCKETS[-1] tokens (a tree of up to 256) runs the
    same step function uncaptured at its own size."""

    reuses_outputs = True  # a bucket's outputs are rewritten by its next step: keep a copy of what must last

    def __init__(self, target, capacity: int, impl: str, feature_layers: tuple[int, ...] | None,
                 graphs: CudaGraphs | Uncaptured):
        self.target, self.impl, self.feature_layers, self.graphs = target, impl, feature_layers, graphs
        self.capacity = capacity
        self.queued = target.device.type == "cuda"  # a step returns before its kernels finish
        self.cache = target.new_cache(capacity + BUCKETS[-1])
        self.inputs = StepInputs(target.device)
        # RoPE's tables, which the five-kernel layer reads, made before any capture and held here: a larger state
        # that grows the target's tables leaves these, which this state's graphs read, alive (entry 73)
        self.rope = target.rope_tables(self.cache.capacity, target.dtype) if target.layer_products else None
        # a sampled step fed back on the device: its uniform (written before each launch) and what it read
        self.uniform = torch.zeros(1, dtype=torch.float64, device=target.device)
        self.drawn = torch.zeros(3, dtype=torch.float64, device=target.device)
        self._replays: dict[int, Callable[[], StepOutput]] = {}
        self._cycles: dict[tuple, Callable] = {}
        self.fallback = ""  # why a capture failed, for the run's notes ("" when none did)

    def cycle_replay(self, key: tuple, make: Callable[[], Callable], what: str = " of a drafted cycle") -> Callable:
        """A larger function of this state's buffers (a drafted cycle's verification, `device_cycle`), made by
        `make` and captured at its first use under `key`; called directly once a capture has failed."""
        if key not in self._cycles:
            fn = make()
            if not self.graphs.captured:
                return fn
            self._cycles[key] = capture_or_fall_back(self, fn, what, "this run's steps run uncaptured")
        return self._cycles[key]

    def step_fn(self, b: int) -> Callable[[], StepOutput]:
        """Bucket b's step as a function of the state's buffers (what its graph captures)."""
        prefix, ids, positions, mask = self.inputs.views(b)
        target, cache, dev = self.target, self.cache, self.target.device
        # a step of one token sees itself, whatever was written: the five-kernel layer takes that as constants
        sees_itself = b == 1 and target.layer_products
        one = torch.ones(1, 1, dtype=torch.bool, device=dev) if sees_itself else None
        word = torch.ones(1, 1, dtype=torch.int32, device=dev) if sees_itself else None

        def step() -> StepOutput:
            out = target.step(ids, positions, prefix, one if sees_itself else mask != 0, cache,
                              feature_layers=self.feature_layers, impl=self.impl, words=word)
            return StepOutput(out.logits, out.features, out.logits.argmax(dim=-1))

        return step

    def fed_back(self, draw: Callable | None = None) -> Callable[[], StepOutput]:
        """A plain step that feeds its token back on the device: bucket 1's step, then its token written as the
        next step's, and the prefix and position advanced, in the input buffer itself. Greedy (`draw` None) the
        token is the step's argmax; sampled, `draw(logits, argmax, uniform)` (`eagleviz.decoding.verify.FedDraw`,
        whose `key` the capture freezes: a graph per temperature and nucleus) chooses it with the uniform the host
        wrote into `uniform` before the launch, and what the host reads of the step lands in `drawn` (token,
        argmax, its probability). Replayed back to back, it decodes with nothing but uniforms written by the host
        between steps, so the host can launch several steps ahead and read each token after the fact
        (`FedAhead`). Captured at first use (`prepare` makes the greedy one ready where steps are queued), its
        warm-up and recording pointed at the scratch slots past `capacity`: call it before writing the inputs it
        starts from."""
        key = FED_BACK if draw is None else FED_BACK + draw.key
        if key not in self._cycles:
            self.inputs.write(self.capacity, [0], [0], None, 1)
        prefix, ids, positions, _ = self.inputs.views(1)
        uniform, drawn = self.uniform, self.drawn

        def make() -> Callable[[], StepOutput]:
            step = self.step_fn(1)

            def fed() -> StepOutput:
                out = step()
                if draw is None:
                    ids.copy_(out.argmax)
                else:
                    token, read = draw(out.logits[0], out.argmax, uniform)
                    ids.copy_(token)
                    drawn.copy_(read)
                positions.add_(1)
                prefix.add_(1)
                return out

            return fed

        return self.cycle_replay(key, make, " of a plain step fed back on the device")

    def _replay(self, b: int) -> Callable[[], StepOutput]:
        if b not in self._replays:
            # a capture runs the step (warm-up and recording): point it at the scratch slots past `capacity`,
            # which no run commits, so it never overwrites a committed key
            self.inputs.write(self.capacity, [0] * b, [0] * b, None, b)
            self._replays[b] = capture_or_fall_back(self, self.step_fn(b), "", "this run's steps run uncaptured")
        return self._replays[b]

    def forward(self, tokens: list[int], positions: list[int], mask: torch.Tensor | None) -> StepOutput:
        """One step of n tokens at positions `positions` after the committed slots; mask (n, n) bool over them
        (ancestor-or-self), None for a single token. Returns the outputs of the n real tokens (views of the
        bucket's static outputs: read them before the next step of the same bucket)."""
        n = len(tokens)
        if self.cache.length + n > self.capacity:
            raise ValueError(f"a static step of {n} tokens after {self.cache.length} slots overflows the "
                             f"state's {self.capacity}")
        if n > BUCKETS[-1]:
            return self._oversized(tokens, positions, mask)
        b = bucket(n)
        replay = self._replay(b)
        self.inputs.write(self.cache.length, tokens, positions, mask, b)
        out = replay()
        self.cache.advance(n)
        return StepOutput(out.logits[:n], out.features[:n], out.argmax[:n])

    def _oversized(self, tokens: list[int], positions: list[int], mask: torch.Tensor) -> StepOutput:
        """A step larger than every bucket: `TargetModel.step` at its own size, uncaptured (its keys land at
        [P, P + n), within the capacity checked by `forward`)."""
        dev, n = self.target.device, len(tokens)
        out = self.target.step(to_device(tokens, dev), to_device(positions, dev),
                               torch.tensor([self.cache.length], device=dev), to_device(mask, dev), self.cache,
                               feature_layers=self.feature_layers, impl=self.impl)
        self.cache.advance(n)
        return StepOutput(out.logits, out.features, out.logits.argmax(dim=-1))

    def reset(self) -> None:
        """Ready for another run: nothing committed (the slots are overwritten as the run writes them)."""
        self.cache.length = 0

    def prepare(self, draw: Callable | None = None) -> None:
        """Every bucket's step captured now (before any timed run), not at its first use; where steps are queued
        (a GPU), the step fed back on the device too (plain decoding's and resting stretches'): the greedy one,
        and given `draw` (`fed_back`'s), the one sampled at its temperature and nucleus."""
        for b in BUCKETS:
            self._replay(b)
        if self.queued:
            self.fed_back()
            if draw is not None:
                self.fed_back(draw)

    @property
    def prepared(self) -> int:
        """The step sizes (and drafted cycles' verifications) made ready so far (a CUDA graph is captured at its
        first use, in that step's time)."""
        return len(self._replays) + len(self._cycles)


class FedAhead:
    """Steps fed back on the device (`StaticSteps.fed_back`) from `token` at the committed slots, launched up to
    `ahead` beyond the host's last read: each launch queues what the host reads of it to pinned memory behind it
    (`Landing`: greedy, its token; sampled, `drawn`), and `take()` reads the oldest one not read yet. Sampled
    (`draw`, `fed_back`'s), each launch first writes its uniform, `uniforms(steps.uniform)` (in place): one draw of
    the run's generator a step, in the order a step at a time draws them. `close()` sets the cache's length to the
    slots the tokens read committed: steps launched past them (an end of sequence read after they were launched) are
    dropped, their keys past the committed slots."""

    def __init__(self, steps: StaticSteps, token: int, ahead: int, draw: Callable | None = None,
                 uniforms: Callable[[torch.Tensor], object] | None = None):
        if (draw is None) != (uniforms is None):
            raise ValueError("a sampled step fed back needs both its draw and its uniforms")
        self.fed = steps.fed_back(draw)  # (its first use captures it, over the scratch slots: before the inputs
        # are written)
        self.steps, self.committed, self.ahead, self.uniforms = steps, steps.cache.length, ahead, uniforms
        steps.inputs.write(self.committed, [token], [self.committed], None, 1)
        dev = steps.target.device
        self.sent = steps.inputs.views(1)[1] if draw is None else steps.drawn
        self.landing = (Landing(ahead, dev) if draw is None else Landing(ahead, dev, 3, torch.float64))
        self.launched = self.read = 0

    def room(self, limit: int) -> bool:
        """Whether another step may be launched: fewer than `ahead` unread, fewer than `limit` launched in all."""
        return self.launched - self.read < self.ahead and self.launched < limit

    def launch(self) -> StepOutput:
        """One step launched, what the host reads of it queued behind it; its outputs (rewritten by the next
        step)."""
        if self.uniforms is not None:
            self.uniforms(self.steps.uniform)
        out = self.fed()
        self.landing.send(self.launched, self.sent)
        self.launched += 1
        return out

    def take(self) -> tuple[int, int, float | None]:
        """The oldest launched step's token, the target's argmax and its probability at the temperature (greedy:
        the token twice and None), once its copy has landed (the step's one read)."""
        self.read += 1
        got = self.landing.read(self.read - 1)
        if len(got) == 1:
            return got[0], got[0], None
        return int(got[0]), int(got[1]), got[2]

    def close(self) -> None:
        self.steps.cache.length = self.committed + self.read


class StatePool:
    """Static states kept between runs, by key (what they were made for: attention, features, capacity, tree
    shape): a run leases one (a new one when all of its key are in use, so runs never share a state) and gives
    it back when it ends; each keeps the captures it made."""

    def __init__(self):
        self._free: dict[tuple, list] = {}
        self._keys: dict[int, tuple] = {}  # id of a state made here -> its key

    def lease(self, key: tuple, make: Callable[[], StaticSteps]):
        free = self._free.setdefault(key, [])
        if free:
            state = free.pop()
            state.reset()
            return state
        state = make()
        self._keys[id(state)] = key
        return state

    def give_back(self, state) -> None:
        self._free[self._keys[id(state)]].append(state)

    def free(self) -> int:
        """How many states wait for a run."""
        return sum(len(states) for states in self._free.values())


class EagerSteps:
    """The target's steps as a CPU runs them: `TargetModel.forward` over a run's own cache of exactly the
    run's capacity (dynamic shapes: on a CPU the C layer and its batch-invariant sums need no capture)."""

    reuses_outputs = False  # each step's outputs are new tensors
    prepared = 0  # nothing is captured: no step pays for a capture

    def __init__(self, target, capacity: int, impl: str, feature_layers: tuple[int, ...] | None):
        self.target, self.impl, self.feature_layers = target, impl, feature_layers
        self.capacity = capacity
        self.queued = target.device.type == "cuda"  # a step returns before its kernels finish
        self.cache = target.new_cache(capacity)

    def forward(self, tokens: list[int], positions: list[int], mask: torch.Tensor | None) -> StepOutput:
        dev = self.target.device
        out = self.target.forward(to_device(tokens, dev), to_device(positions, dev), self.cache,
                                  None if mask is None else to_device(mask, dev),
                                  feature_layers=self.feature_layers, impl=self.impl)
        return StepOutput(out.logits, out.features, None)
