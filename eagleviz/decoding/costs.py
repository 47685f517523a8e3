"""What a cycle's parts cost on this machine, in plain decoding steps: the price list of the cost-aware tree.

    verify(n)     one target forward over n tree tokens, divided by one step of our plain loop
    draft_fixed   what a cycle in which the head drafts pays once: encoding the positions accepted since,
                  the first level's bookkeeping (its weights read cold after the target's forward)
    draft_level   one draft forward over a frontier, with its LM head and top-k
    overhead      the rest of a cycle: acceptance, the KV rewind, the host's bookkeeping
    rest          a whole cycle that drafts nothing and verifies the root alone (what a cost-aware tree
                  compares every tree with: the plain loop's step, plus a cycle's bookkeeping)

Sampling (T > 0) prices acceptance apart: rejecting a drafted token rebuilds the residual distribution, a
pass over the vocabulary (`tune --costs` here: a 4/2/8 cycle's overhead 0.16-0.18 steps at T = 0, 0.27-0.29
at T = 1), so `overhead` and `rest` are measured at both (`CostModel.at`).

On a GPU verify(n) is nearly flat up to dozens of tokens (the weights are read once whatever n is), so a
cost-aware tree grows big; on a small CPU every token has a price (here, from weight blocks, 16 tokens cost
3.3-4.1 steps), so it stays small and often is a chain. `measure` times these on the engine it is given (1-3 s
for the embedded model on this idle 2-core CPU, as `tune --costs` prints: one prefill, a few forwards per size,
short plain, speculative and resting runs); `load_or_measure` keeps the result per model, dtype, device and
thread count under the cache directory. An engine loaded for use (`eagleviz.decoding.load.load_engine`) holds
its list as `Prices`: read or measured when a cost-aware tree first needs it, so plain decoding and SGLang's
fixed trees measure nothing (`tune --costs` measures it afresh: seconds from weight blocks, tens of seconds
without them).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.once import Once
from eagleviz.decoding.steps import release, target_steps
from eagleviz.paths import cache_dir
from kernels import capability

SIZES = (1, 2, 4, 8, 16, 32, 64)
# the price list's sizes: every small one, where a cost-aware tree's sizes fall and the curve bends (from weight
# blocks here 3, 4, 6 and 8 tokens cost 1.19, 1.31, 1.69 and 2.31 steps: docs/performance.md entry 26)
PRICE_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64)
VERSION = 11  # 2: a plain step leaves the prefill out; 3: PRICE_SIZES; 4: draft_fixed; 5: the products' column groups
# (kernels/quant_ops.c) changed every price; 6: rest and the sampled prices; 7: an EAGLE-3 head's layer in one C
# call (kernels/stack_ops.c) made drafting cheaper; 8: every price in plain steps of the probe's own context; 9: the
# C attention's scores in registers on AVX2 (kernels/cpu_ops.c) made verifying cheaper there; 10: its loops compiled
# for the head's size and its keys and values in tiles that stay in L1; 11: the AVX2 products ask for the next weights
# ahead (kernels/quant_ops.c), a plain step cheaper there (older lists are measured again)
ROUNDS = 3  # plain and resting runs, paired round by round (one pass of each priced a resting cycle 0.86-1.18)
PROBE_PROMPT = "List the planets of the solar system in order, one per line, with one fact about each."


@dataclass(frozen=True)
class CostModel:
    """Costs in plain steps. verify: (n, cost) points, ascending n, interpolated linearly between them and
    extended beyond the last along the last segment's slope."""

    verify: tuple[tuple[int, float], ...]
    draft_level: float
    overhead: float
    step_ms: float = 0.0      # what one plain step took when measured (0: not measured)
    draft_fixed: float = 0.0  # paid once by a cycle whose head drafts (its first level costs this + draft_level)
    source: str = "default: a flat curve (as on a GPU), not measured"
    rest: float | None = None               # a cycle of the root alone, no drafting (None: verify(1) + overhead)
    sampled_overhead: float | None = None   # `overhead` at T > 0 (None: the same)
    sampled_rest: float | None = None       # `rest` at T > 0 (None: the same)
    at_once: int = 0  # levels the head drafts in one call whatever a tree keeps (`drafting_at_once`); 0: level by level

    def __post_init__(self):
        if not self.verify or any(n2 <= n1 for (n1, _), (n2, _) in zip(self.verify, self.verify[1:])):
            raise ValueError("verify costs need ascending sizes")
        optional = [c for c in (self.rest, self.sampled_overhead, self.sampled_rest) if c is not None]
        if min(c for _, c in self.verify) <= 0 or min(self.draft_level, self.draft_fixed, self.overhead, *optional) < 0:
            raise ValueError("costs must be positive")

    @classmethod
    def flat(cls) -> CostModel:
        """A GPU-like price list for engines nobody measured (tests, tiny models): verification nearly free
        up to 64 tokens, a draft level 5% of a step."""
        return cls(verify=((1, 1.0), (64, 1.3)), draft_level=0.05, overhead=0.05)

    def at(self, temperature: float) -> CostModel:
        """The prices a run at `temperature` pays: at T > 0, the sampled overhead and rest where measured."""
        if temperature == 0 or (self.sampled_overhead is None and self.sampled_rest is None):
            return self
        return replace(self, overhead=self.overhead if self.sampled_overhead is None else self.sampled_overhead,
                       rest=self.rest if self.sampled_rest is None else self.sampled_rest,
                       sampled_overhead=None, sampled_rest=None)

    def rest_cost(self) -> float:
        """Plain steps a cycle costs that drafts nothing and verifies the root alone."""
        return self.verify_cost(1) + self.overhead if self.rest is None else self.rest

    def draft_cost(self, levels: int) -> float:
        """Plain steps that a cycle keeping `levels` draft levels pays for its drafting (0 when the head does not
        draft): each level drafted, all `at_once` of them where one call drafts them whatever the tree keeps."""
        return self.draft_fixed + max(levels, self.at_once) * self.draft_level if levels > 0 else 0.0

    def drafting_at_once(self, levels: int) -> CostModel:
        """The prices of a head that drafts `levels` levels in one call (a GPU's captured drafting:
        `eagleviz.decoding.device_draft`) of which a cost-aware tree keeps the first L: those L cost all `levels`,
        so keeping fewer saves verification, never drafting, and a run's clock, which times the whole drafting,
        compares it with its whole price."""
        return replace(self, at_once=levels)

    def verify_cost(self, n: int) -> float:
        table = self._table
        return table[n] if 0 <= n < len(table) else self._interpolate(n)

    def verify_costs(self, upto: int) -> tuple[float, ...]:
        """verify_cost(n) for n = 0 .. upto, as one tuple (a cost-aware tree prices every size up to its budget a
        few dozen times a cycle)."""
        table = self._table
        if upto < len(table):
            return table
        return table + tuple(self._interpolate(n) for n in range(len(table), upto + 1))

    @cached_property
    def _table(self) -> tuple[float, ...]:
        """verify_cost(n) for n up to the last measured size: a cost-aware tree asks for it a few dozen times
        a cycle."""
        return tuple(self._interpolate(n) for n in range(self.verify[-1][0] + 1))

    @cached_property
    def _points(self) -> tuple[list[int], list[float]]:
        """The measured sizes and their costs, split once (`_table` interpolates between them 65 times, and a run
        whose clock corrects the list builds a new one after each cycle that drafted or looked up)."""
        return [s for s, _ in self.verify], [c for _, c in self.verify]

    def _interpolate(self, n: int) -> float:
        sizes, costs = self._points
        if len(sizes) == 1:
            return costs[0]
        i = min(max(bisect.bisect_left(sizes, n), 1), len(sizes) - 1)
        (n0, c0), (n1, c1) = self.verify[i - 1], self.verify[i]
        return max(c0 + (c1 - c0) * (n - n0) / (n1 - n0), 1e-6)

    def scaled(self, verify: float, draft: float) -> CostModel:
        """The same list with what each size costs beyond a one-token forward times `verify`, and drafting's
        prices times `draft` (`RunCosts`: a run's clock correcting a list measured at a busier or idler time)."""
        if verify == 1.0 and draft == 1.0:
            return self
        one = self.verify_cost(1)
        return replace(self, verify=tuple((n, max(one + verify * (c - one), 1e-6)) for n, c in self.verify),
                       draft_level=self.draft_level * draft, draft_fixed=self.draft_fixed * draft)

    def to_dict(self) -> dict:
        return asdict(self) | {"version": VERSION}

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        if d.get("version") != VERSION:
            raise ValueError("not a cost model this build reads")
        optional = {k: None if d.get(k) is None else float(d[k]) for k in ("rest", "sampled_overhead", "sampled_rest")}
        return cls(verify=tuple((int(n), float(c)) for n, c in d["verify"]), draft_level=float(d["draft_level"]),
                   overhead=float(d["overhead"]), step_ms=float(d.get("step_ms", 0.0)), source=str(d["source"]),
                   draft_fixed=float(d.get("draft_fixed", 0.0)), at_once=int(d.get("at_once", 0)), **optional)


@dataclass
class RunCosts:
    """One run's clock on the price list, as `RunAcceptance` is on the calibration. The list was measured once,
    at some moment of the machine's load: on a shared CPU a plain step's time moves by half from one hour to the
    next, and the price of a tree's extra tokens beside it moves too (here a list said 4 tokens cost 1.20 steps
    where the run's forwards took 1.5). The run times its own phases: a resting cycle's forward is its unit, a
    forward over n tokens costs so many of them beyond the first, drafting so many in all. `costs()` is the base
    list with its verification beyond one token and its drafting each scaled by what was seen over what the list
    said for the same cycles, shrunk towards the list by `weight` (in one-token forwards: a few cycles move it, a
    long run follows its own clock) and held within a factor of 4. Only which nodes are verified changes."""

    base: CostModel
    weight: float = 1.0
    forwards: list[float] = field(default_factory=list)  # resting cycles' one-token forwards (ms), the last RECENT
    verify_listed: float = 0.0  # the list's price of the observed forwards beyond one token, in one-token forwards
    verify_seen: float = 0.0    # what they took beyond one token, in the run's one-token forwards
    draft_listed: float = 0.0   # the same for drafting
    draft_seen: float = 0.0

    RECENT = 8
    LIMIT = 4.0

    def rest(self, forward_ms: float) -> None:
        """A resting cycle's forward of the root alone: the unit the others are counted in."""
        self.forwards.append(forward_ms)
        if len(self.forwards) > self.RECENT:
            del self.forwards[0]

    def observe(self, tokens: int, levels: int, forward_ms: float, draft_ms: float) -> bool:
        """A cycle that verified `tokens` (the root included) after `levels` draft levels: its forward's and its
        drafting's ms. Returns whether it was counted (not before a resting cycle gave the unit)."""
        if not self.forwards or (tokens <= 1 and levels == 0):
            return False
        one, listed_one = statistics.median(self.forwards), self.base.verify_cost(1)
        if tokens > 1:
            self.verify_listed += self.base.verify_cost(tokens) / listed_one - 1.0
            self.verify_seen += forward_ms / one - 1.0
        if levels > 0:
            self.draft_listed += self.base.draft_cost(levels) / listed_one
            self.draft_seen += draft_ms / one
        return True

    def scales(self) -> tuple[float, float]:
        """(verification's, drafting's) factor on the list: seen over listed, each shrunk towards 1."""
        w, lo, hi = self.weight, 1.0 / self.LIMIT, self.LIMIT

        def factor(seen: float, listed: float) -> float:
            return min(hi, max(lo, (max(seen, 0.0) + w) / (listed + w)))

        return factor(self.verify_seen, self.verify_listed), factor(self.draft_seen, self.draft_listed)

    def costs(self) -> CostModel:
        return self.base.scaled(*self.scales())


@torch.inference_mode()  # the static states a run leases (and gives back) hold inference tensors
def forward_ms(engine, prefix: int = 200, sizes=SIZES, repeats: int = 5) -> dict[int, float]:
    """Median wall time (ms) of one target forward of n chain tokens after a `prefix`-token context, run the way
    the engine's runs run it (its attention; on a GPU the captured steps, `eagleviz.decoding.steps`): one
    prefill, one untimed forward of each size (its shapes warmed up, its graph captured), then `repeats` rounds
    of one forward of every size, its keys dropped again (the cache's length restored). Round by round, a slow
    moment of the machine lands on every size alike; size by size, it inflated the one measured then (here a
    list priced 2 to 8 tokens all at 1.55 steps)."""
    target, dev = engine.target, engine.target.device
    steps = target_steps(engine, prefix + max(sizes) + 1, None)
    cache = steps.cache
    try:
        ids = torch.arange(prefix, device=dev) % target.vocab_size
        target.forward(ids, torch.arange(prefix, device=dev), cache,
                       torch.ones(prefix, prefix, dtype=torch.bool, device=dev).tril(), logit_rows=None,
                       impl=engine.attn_impl)
        inputs = {n: ([i % target.vocab_size for i in range(n)], list(range(prefix, prefix + n)),
                      torch.ones(n, n, dtype=torch.bool).tril() if n > 1 else None) for n in sizes}
        runs: dict[int, list[float]] = {n: [] for n in sizes}
        for round_ in range(repeats + 1):  # round 0 warms every size up
            for n in sizes:
                cache.length = prefix
                _sync(dev)
                t = time.perf_counter()
                steps.forward(*inputs[n])
                _sync(dev)
                if round_:
                    runs[n].append(time.perf_counter() - t)
        return {n: statistics.median(runs[n]) * 1e3 for n in sizes}
    finally:
        release(engine, None, steps)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@torch.inference_mode()
def measure(engine, max_size: int = 64, tokens: int = 24) -> CostModel:
    """This engine's price list: the forward curve; short plain runs (the unit: ms per plain token after the
    prefill) each beside runs that verify the root alone at T = 0 and T = 1 (the rest), ROUNDS rounds; short runs
    of fixed trees of 1 and 4 levels (their draft times give the fixed part and the price of a level; the
    4-level cycle's remainder is the overhead), the overhead again at T = 1. The curve (measured after a
    200-token context) is scaled so that one token costs what a one-token forward at the probe's context costs
    of its plain step: every price is then in plain steps of one and the same context."""
    sizes = tuple(n for n in PRICE_SIZES if n <= max_size)
    fwd = forward_ms(engine, sizes=sizes)
    sampling = SamplingConfig(max_new_tokens=tokens)
    sampled = SamplingConfig(max_new_tokens=tokens, temperature=1.0)
    # untimed first: a process's first runs pay one-time costs (the head's weights and the sampling and tracing
    # code touched for the first time), which made a plain step measured at first load 1.2-1.3x its price and
    # the drafting cycle's fixed part 0.43 of a step where it is 0.09-0.11 (`tune --costs` run again)
    warm = SamplingConfig(max_new_tokens=8)
    engine.generate(PROBE_PROMPT, None, warm)
    if engine.head is not None:
        engine.generate(PROBE_PROMPT, TreeConfig.create(4, 2, 8, adaptive=False), warm)
    # plain runs and runs of the root alone (lookup candidates priced out of every tree: nothing to draft,
    # nothing worth verifying), at T = 0 and T = 1, in ROUNDS rounds: a resting cycle is priced by the plain run
    # of its own round (paired, medians), so that a slow moment of the machine moves both alike
    resting = engine.with_policy(costs=CostModel(verify=((1, 1.0), (2, 1e6)), draft_level=1e6, overhead=0.0))
    alone = TreeConfig.create(1, 1, 2, source="lookup")
    steps_ms, rests, sampled_rests = [], [], []
    for _ in range(ROUNDS):
        plain = engine.generate(PROBE_PROMPT, None, sampling)
        # the prompt's prefill is not a step (from weight blocks the probe's costs about five steps here), and
        # it wrote the first token: the steps are the tokens after it
        steps_ms.append((plain.wall_s * 1e3 - plain.prefill_ms) / max(len(plain.output) - 1, 1))
        rests.append(_cycle_ms(resting.generate(PROBE_PROMPT, alone, sampling)) / steps_ms[-1])
        sampled_rests.append(_cycle_ms(resting.generate(PROBE_PROMPT, alone, sampled)) / steps_ms[-1])
    step_ms, rest, sampled_rest = (statistics.median(x) for x in (steps_ms, rests, sampled_rests))
    # the curve's shape comes from a long context; its unit, a one-token forward's share of a plain step, from
    # a forward at the probe's own context (the curve's one-token forward over the plain step measured at a
    # shorter one priced every step-relative cost 1.3x too low held to AVX2: a resting cycle at 0.56 steps)
    context = plain.prompt_tokens + len(plain.output) // 2
    share = min(forward_ms(engine, prefix=context, sizes=(1,))[1] / step_ms, 1.0)
    draft_fixed, draft_level, overhead, sampled_overhead = 0.0, 0.05, 0.05, None
    if engine.head is not None:
        draft_ms = {}
        for steps in (1, 4):
            tree = TreeConfig.create(steps, 2, 2 * steps, adaptive=False)
            run = engine.generate(PROBE_PROMPT, tree, sampling)
            if not run.cycles:
                break
            draft_ms[steps] = _phase_ms(run, "draft")
            overhead = _remainder(run) / step_ms
            if steps == 4:
                sampled_overhead = _remainder(engine.generate(PROBE_PROMPT, tree, sampled)) / step_ms
        if len(draft_ms) == 2:
            level_ms = max(draft_ms[4] - draft_ms[1], 0.0) / 3
            draft_level = level_ms / step_ms
            draft_fixed = max(draft_ms[1] - level_ms, 0.0) / step_ms
    verify, most = [], 0.0
    for n, ms in fwd.items():  # a bigger forward never costs less: noise in one size must not invert the curve
        most = max(most, share * ms / fwd[1])
        verify.append((n, most))
    return CostModel(verify=tuple(verify), draft_level=draft_level, draft_fixed=draft_fixed,
                     overhead=overhead, step_ms=step_ms, rest=rest, sampled_overhead=sampled_overhead,
                     sampled_rest=sampled_rest,
                     source=f"measured on this machine ({torch.get_num_threads()} thread(s), plain step "
                            f"{step_ms:.1f} ms)")


def _cycle_ms(run) -> float:
    """A run's mean cycle in ms, its prefill left out."""
    return (run.wall_s * 1e3 - run.prefill_ms) / max(len(run.cycles), 1)


def _phase_ms(run, phase: str) -> float:
    return sum(c.timings_ms.get(phase, 0.0) for c in run.cycles) / max(len(run.cycles), 1)


def _remainder(run) -> float:
    """A run's mean cycle less its draft and verify phases, in ms (0 at least)."""
    return max(_cycle_ms(run) - _phase_ms(run, "draft") - _phase_ms(run, "verify"), 0.0) if run.cycles else 0.0


def key(engine) -> str:
    """What a price list depends on: model, head, dtypes, how the products compute, device, thread count, and
    the CPU's vector unit (a cache shared by two machines, or an emulated AVX2 run, must not borrow the other's
    prices: from blocks, AVX2 verified 16 tokens for 6-7 single steps where AVX-512 takes 4, 3.5-4.9 once AVX2's
    attention scored in registers, docs/performance.md entry 56)."""
    t = engine.target
    parts = [t.name, engine.head_name, str(t.dtype), str(t.kv_dtype), str(t.device), str(torch.get_num_threads()),
             "compiled" if t.ops is not None else "torch", engine.attn_impl]
    if engine.decode != "eager":  # steps replayed from CUDA graphs cost what eager ones do not
        parts.append(engine.decode)
    if t.weights != "dense":
        parts += [t.weights, t.activations, "head-q8_0"]  # the head's products from Q8_0 blocks too
    if t.device.type == "cuda":
        parts.append(torch.cuda.get_device_name(t.device))
    else:
        cpu = capability.detect()
        parts += [cpu.cpu_name, cpu.vector_isa, cpu.emulating or "native"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def path_for(engine):
    """Where the price list of this engine's key is kept."""
    return cache_dir() / "costs" / f"{key(engine)}.json"


def load_or_measure(engine, progress=None, fresh: bool = False) -> CostModel:
    """The price list kept for this engine's key, else (or with `fresh`) measured now and kept; a damaged file
    is measured again. `progress` gets one line when it measures. `python -m eagleviz tune --costs` measures
    afresh, on an idle machine."""
    path = path_for(engine)
    if not fresh:
        try:
            return CostModel.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if progress:
        progress("measuring what verification and drafting cost on this machine (once for this model, dtype and "
                 "thread count: seconds from weight blocks, up to a minute without them)")
    costs = measure(engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{id(costs)}")
    tmp.write_text(json.dumps(costs.to_dict(), indent=1))
    tmp.replace(path)
    return costs


class Prices(Once[CostModel]):
    """An engine's price list: given, or got by calling `given` (`load_or_measure`) the first time it is asked
    for, and kept (`once.Once`). One holder is shared by an engine's copies (`Engine.with_attention`, ...), as the
    list itself was; runs that ask for it at once wait for one measurement."""

    def __init__(self, given: CostModel | Callable[[], CostModel]):
        if isinstance(given, CostModel):
            super().__init__(given)
        else:
            super().__init__(obtain=given)
