"""The cost-aware tree: how deep to draft and how many tokens to verify, decided per cycle.

Every node of the draft tree has a value v, the calibrated chance that it lies on the accepted path
(`eagleviz.decoding.calibration`); a cycle that verifies the set K commits 1 + sum(v for K) tokens on
average (the bonus token always comes). It costs draft_fixed + L * draft_level + verify(|K| + 1) + overhead
plain steps (`eagleviz.decoding.costs`) after L >= 1 draft levels, verify(|K| + 1) + overhead when the head
does not draft; a cycle that verifies the root alone costs `rest` (its acceptance is a plain step's draw).
At T > 0 the overhead and the rest are the sampled ones (rejections rebuild the residual). So, per cycle:

    verify   the m best nodes (by value, closed under ancestors: EAGLE-2's reranking) for the m that
             maximises expected tokens per unit cost; m = 0 verifies the root alone (a resting cycle)
    draft    after each level, predict the next one: a frontier node f of value v_f would get children of
             value v_f * child[k] (the calibrated acceptance of a k-th best child); another level is drafted
             only if, with those children (or theirs, one level further), the best rate rises
    rest     sampled (T > 0): after drafting, compare the best rate with the rate of the same cycle without
             the head (its lookup candidates alone, nothing drafted); greedy: whether any of its nodes was
             verified; a head that did not pay rests 1, 2, 4 ... cycles (`HeadRest`). And at any temperature,
             after the cycle: whether its recent drafted cycles committed more tokens per millisecond than this
             run's resting cycles take for theirs (`Ledger`: the clock, not the forecast); a head losing so
             rests as long as keeps its probes under 1% of the run. The context's lookups are judged the same
             way by a ledger of their own: their cycles (the head not run) against resting ones

SGLang's knobs stay upper bounds: at most `steps` levels, `topk` children per node, `draft_tokens` verified.
Fed a GPU's nearly flat verify(n) the same rule grows big trees; fed this CPU's curve it keeps them small.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from eagleviz.decoding.calibration import Calibration
from eagleviz.decoding.costs import CostModel


@dataclass(frozen=True)
class Budget:
    """A verification decision: `size` draft nodes to verify (the root not counted), the expected tokens the
    cycle commits (bonus included) and the expected rate in tokens per plain step."""

    size: int
    expected_tokens: float
    rate: float


@dataclass(frozen=True)
class TreePolicy:
    costs: CostModel
    calibration: Calibration

    def cycle_cost(self, levels: int, tree_tokens: int) -> float:
        """Plain steps a cycle costs with `levels` draft levels and `tree_tokens` verified (root included): the
        root alone is a resting cycle's price (`CostModel.rest_cost`)."""
        c = self.costs
        if tree_tokens <= 1:
            return c.draft_cost(levels) + c.rest_cost()
        return c.draft_cost(levels) + c.verify_cost(tree_tokens) + c.overhead

    def budget(self, values: list[float], levels: int, max_size: int) -> Budget:
        """The best number of nodes to verify. values: the candidates' values in verification priority
        (descending, ancestors first); at most max_size of them are taken."""
        size, tokens, best = 0, 1.0, 1.0 / self.cycle_cost(levels, 1)
        values = values[:max_size]
        draft, overhead = self.costs.draft_cost(levels), self.costs.overhead
        verify = self.costs.verify_costs(len(values) + 1)
        gained = 0.0
        for m, v in enumerate(values, start=1):  # a few dozen calls a cycle: `cycle_cost` inlined
            gained += v
            rate = (1.0 + gained) / (draft + verify[m + 1] + overhead)
            if rate > best:
                size, tokens, best = m, 1.0 + gained, rate
        return Budget(size, tokens, best)

    def head_pays(self, topk: int, steps: int, max_size: int) -> bool:
        """Whether drafting from the root alone is expected to beat a resting cycle at the calibration's average
        acceptance on this price list: where it is not (a CPU on which verifying a second token costs a third of a
        plain step or more), a greedy run starts with the head resting, as a sampled run does (`Ledger.for_run`)."""
        return self.another_level([], [1.0], 0, max_size, topk, steps)

    def another_level(self, values: list[float], frontier: list[float], levels: int, max_size: int,
                      topk: int, levels_left: int) -> bool:
        """Whether drafting one more level is expected to raise the cycle's rate. values: every candidate's
        value so far, descending; frontier: the values of the nodes the next level would expand."""
        now = self.budget(values, levels, max_size).rate
        added: list[float] = []
        parents = list(frontier)
        for extra in range(1, min(2, levels_left) + 1):  # one level, and two: a level can pay only via the next
            children = [v * self.calibration.child_accept(k) for v in parents for k in range(topk)]
            added = sorted(added + children, reverse=True)
            merged = sorted(values + added, reverse=True)
            if self.budget(merged, levels + extra, max_size).rate > now:
                return True
            parents = sorted(children, reverse=True)[:topk]
        return False


@dataclass
class HeadRest:
    """One run's back-off: after a cycle in which the head did not pay (the engine decides: sampled, its cycle's
    best rate no higher than without it; greedy, none of its nodes worth verifying), the head rests for 1 cycle,
    then 2, 4 ... (at most `most`) while that repeats; a cycle in which it pays ends it. The engine encodes the
    positions a resting head skipped when it runs again."""

    most: int = 16
    left: int = 0      # cycles still to run without the head
    streak: int = 0    # cycles in a row in which none of its nodes was kept

    def head_runs(self) -> bool:
        """Whether the head drafts this cycle (a resting cycle counts down)."""
        if self.left:
            self.left -= 1
            return False
        return True

    def record(self, paid: bool, losing: bool = False) -> None:
        """After a cycle the head drafted: whether it paid. `losing`: its recent cycles together did not pay
        either (`Ledger.losing`), so it rests the longest at once rather than 1, 2, 4 ... cycles."""
        self.streak = 0 if paid else self.streak + 1
        self.left = (0 if paid else self.most if losing else min(2 ** (self.streak - 1), self.most))

    def note(self) -> str:
        """One sentence for a resting cycle's trace."""
        span = "this cycle" if not self.left else f"this cycle and {self.left} more"
        if not self.streak:  # a run's start in doubt (`Ledger.doubt`)
            return (f"The head rests (a run starts without it at T > 0, or where this machine's prices say its "
                    f"average guess does not pay, and drafts on once a probe pays): {span} without it.")
        times = f"{self.streak} time{'s' if self.streak > 1 else ''}"
        return f"The head rests (its guesses did not pay for themselves {times} in a row): {span} without it."


@dataclass
class Ledger:
    """One run's clock on its own cycles: what a resting cycle (the root alone, the head not run: a plain step)
    takes here and now, and whether the head's drafted cycles pay for themselves, judged by what they took, not
    by the price list's forecast. The price list was measured once, maybe on a busier or idler machine, and the
    calibration forecasts acceptance on average; the ledger sees this run on this CPU.

    A drafted cycle pays when it commits at least as many tokens per millisecond as a resting cycle does its
    one: tokens * rest_ms >= its ms (rest_ms: the median of the last RECENT resting cycles). The engine times a
    cycle by the wall clock, from its start to its trace (what tokens per second pay for; on a GPU the phases'
    events would leave out the host's work between them), and leaves out a cycle that captured a CUDA graph. One cycle is no
    verdict (a head accepted twice on average has many cycles that keep nothing): the head is `losing` when its
    last RECENT drafted cycles (at least EVIDENCE) together committed fewer tokens per millisecond than resting
    cycles do. A losing head rests `span` cycles, then drafts one probe; a probe that pays starts the count
    afresh (the text may have turned predictable), one that does not rests it again. `span`: what an unpaid
    cycle cost beyond its tokens, in resting cycles, over PROBE_SHARE, so that probing costs under PROBE_SHARE
    of the run. Without a resting cycle observed there is no reference and no verdict: `wants_reference` asks
    for one resting cycle (the run's second, then whenever REFERENCE_EVERY cycles passed without one), which
    costs a plain step, what plain decoding pays for its token.

    The engine keeps a second ledger for the context's lookups: its drafted cycles are those that verified
    lookup candidates without the head, its probes the first such cycle after a rest it imposed (`observe`'s
    `probe`: lookup cycles come between resting cycles no rest imposed, which are not probes).

    The lookups' ledger (`lookups`) gives its verdict after LOOKUP_EVIDENCE drafted cycles rather than EVIDENCE: a
    run meets a few lookup matches (on MT-bench at T = 0, 4-11 in 128 tokens), so waiting for four left most of a
    losing run's lookup cycles judged too late (docs/performance.md entry 43).

    `doubt` (a sampled run off a GPU, or a run whose head is not expected to pay on this machine's prices:
    `Ledger.for_run`): the head starts the run judged losing. At T > 0 a head is
    accepted far less often and most of a run's cycles rest anyway, so the drafted cycles a fresh verdict needs
    (the first of them encoding the whole prompt) were most of what speculation lost there: the head rests
    `span` cycles first (FIRST_LOSS over PROBE_SHARE: 150, so that a run shorter than that never pays for a
    probe it cannot earn back), probes, and drafts on only once a probe has paid."""

    RECENT = 8
    EVIDENCE = 4  # drafted cycles before they are judged together
    LOOKUP_EVIDENCE = 2  # ... where the ledger judges the context's lookups
    REFERENCE_EVERY = 64
    PROBE_SHARE = 0.01
    SPAN = (16, 256)  # the shortest and longest rest `span` gives
    FIRST_LOSS = 1.5  # resting cycles a sampled run's first probe is taken to lose: at T = 1 here drafted cycles
    # took 2.05 resting cycles for 1.62 tokens (docs/performance.md entry 37), and the first also encodes the prompt

    rests: list[float] = field(default_factory=list)   # resting cycles' ms, the last RECENT
    drafted: list[tuple[float, int]] = field(default_factory=list)  # drafted cycles' (ms, tokens), since a probe paid
    losses: list[float] = field(default_factory=list)  # unpaid cycles' cost beyond their tokens, in resting cycles
    since_rest: int = 0   # cycles since the last resting cycle (or the run's start)
    cycles: int = 0
    rested: bool = False  # whether the last cycle ran without the head
    doubt: bool = False   # judged losing until a probe pays
    lookups: bool = False  # the ledger of the context's lookups (its verdict after LOOKUP_EVIDENCE drafted cycles)

    @classmethod
    def for_run(cls, greedy: bool, pays: bool = True, lookups: bool = False, gpu: bool = False) -> Ledger:
        """A run's ledger of its head, or of its lookups (`lookups`): greedy, the source drafts from the start where
        it is expected to pay on average (`pays`: `TreePolicy.head_pays`); sampled, or where it is not, it is in
        doubt. On a GPU (`gpu`) a sampled run's head is judged as a greedy one's, by the price list at its
        temperature: there a drafting costs a fraction of a step, and a head in doubt for its first 150 cycles never
        drafted in a 128-token run (docs/performance.md entry 46)."""
        return cls(doubt=not ((greedy or gpu) and pays), lookups=lookups)

    def wants_reference(self) -> bool:
        """Whether this cycle should rest to time a plain step (the run's second cycle, then every
        REFERENCE_EVERY cycles without a resting one)."""
        return self.cycles >= 1 and (not self.rests or self.since_rest >= self.REFERENCE_EVERY)

    def rest_ms(self) -> float | None:
        return statistics.median(self.rests) if self.rests else None

    def observe(self, ms: float, tokens: int, drafted: bool, alone: bool, probe: bool | None = None) -> bool:
        """After a cycle: `ms` it took, `tokens` it committed, whether the judged source drafted (the head) and
        whether it verified the root alone. `probe`: whether a drafted cycle is the first after a rest the ledger
        imposed (None: whether the cycle before it did not draft, as for the head, which drafts or rests).
        Returns False when the source is losing (after a drafted cycle), else True."""
        self.cycles += 1
        if not drafted:
            if alone:
                self.rests.append(ms)
                if len(self.rests) > self.RECENT:
                    del self.rests[0]
                self.since_rest = 0
            else:  # lookup candidates alone: neither a plain step nor the head's
                self.since_rest += 1
            self.rested = True
            return True
        probe, self.rested = (self.rested if probe is None else probe), False
        self.since_rest += 1
        reference = self.rest_ms()
        if reference is None or reference <= 0:
            return True
        paid = tokens * reference >= ms
        if not paid:
            self.losses = (self.losses + [ms / reference - tokens])[-self.RECENT:]
        if probe and paid:
            self.drafted, self.doubt = [], False
        self.drafted = (self.drafted + [(ms, tokens)])[-self.RECENT:]
        return not self.losing()

    def losing(self) -> bool:
        """Whether the last RECENT drafted cycles (at least EVIDENCE of them, LOOKUP_EVIDENCE for lookups),
        together, committed fewer tokens per millisecond than resting cycles do; in doubt, until a probe pays."""
        if self.doubt:
            return True
        reference = self.rest_ms()
        if reference is None or len(self.drafted) < (self.LOOKUP_EVIDENCE if self.lookups else self.EVIDENCE):
            return False
        return sum(t for _, t in self.drafted) * reference < sum(ms for ms, _ in self.drafted)

    def span(self) -> int:
        """The longest rest that keeps probing under PROBE_SHARE: one unpaid probe costs their mean loss; in
        doubt before any probe, FIRST_LOSS (a sampled run's first probe also encodes its whole prompt)."""
        if not self.losses and not self.doubt:
            return self.SPAN[0]
        lo, hi = self.SPAN
        loss = statistics.mean(self.losses) if self.losses else self.FIRST_LOSS
        return max(lo, min(hi, math.ceil(loss / self.PROBE_SHARE)))
