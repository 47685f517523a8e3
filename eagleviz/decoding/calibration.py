"""From what the head believes to what the target accepts: a calibration stored with the head.

EAGLE-2 ranks draft nodes by their cumulative draft probability, the product of the draft's probabilities
along the root-to-node path, as a stand-in for the chance that the target accepts the whole path. The ranking
is right; the values are not: a small head is over- or under-confident, and the cost-aware tree
(`eagleviz.decoding.policy`) needs values it can weigh against the price of verifying a token. So:

    accept(score)        P(the node lies on the accepted path), as a function of its cumulative draft
                         log-probability `score`: a non-decreasing step function fitted on the verified
                         nodes of many cycles (pool-adjacent-violators over log-probability bins)
    child[k]             P(the k-th best child of a node is accepted | the node was), for the value of one
                         more draft level before it is drafted
    lookup[n]            P(a lookup token is accepted | its parent was), by the length n of the suffix match
                         (`eagleviz.decoding.lookup`)

One table per regime: greedy verification (T = 0) and speculative sampling (fitted at T = 1, used for any
T > 0). `python -m eagleviz calibrate` fits them on training prompts (never on the evaluation prompts) and
writes `calibration.json` beside the head's weights. A head without one gets `Calibration.identity()`,
EAGLE-2's own assumption (the draft probability is the acceptance probability).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

FILE = "calibration.json"
VERSION = 1
EDGES = tuple(float(x) for x in (-12, -8, -6, -5, -4, -3.5, -3, -2.5, -2, -1.6, -1.2, -0.9, -0.6, -0.4, -0.2,
                                 -0.1, -0.03))   # bin edges in natural-log units of the cumulative draft probability


@dataclass(frozen=True)
class Calibration:
    """One regime's table. `accept[i]` is the acceptance of bin i: scores below edges[0] fall in bin 0, scores
    in [edges[i - 1], edges[i]) in bin i, scores >= edges[-1] in the last bin."""

    edges: tuple[float, ...]
    accept: tuple[float, ...]
    child: tuple[float, ...] = (0.5, 0.1, 0.05, 0.02)
    lookup: tuple[float, ...] = (0.2, 0.4, 0.6)     # by match length 1, 2, 3 (longer matches use the last)
    samples: int = 0
    source: str = "identity: the draft probability as the acceptance probability (EAGLE-2's assumption)"
    identity: bool = field(default=False, compare=False)

    def __post_init__(self):
        if len(self.accept) != len(self.edges) + 1:
            raise ValueError(f"a calibration needs {len(self.edges) + 1} bin values, got {len(self.accept)}")
        if any(b < a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError("calibration edges must ascend")
        if not all(0.0 <= v <= 1.0 for v in (*self.accept, *self.child, *self.lookup)):
            raise ValueError("calibration values are probabilities")

    @classmethod
    def identity_table(cls) -> Calibration:
        """EAGLE-2's assumption: P(accepted) = the cumulative draft probability (at each bin's geometric centre)."""
        centres = [EDGES[0] - 1.0] + [(a + b) / 2 for a, b in zip(EDGES, EDGES[1:])] + [EDGES[-1] / 2]
        return cls(edges=EDGES, accept=tuple(math.exp(c) for c in centres), identity=True)

    def path_accept(self, score: float) -> float:
        """P(a node with cumulative draft log-probability `score` is on the accepted path)."""
        if self.identity:
            return math.exp(min(score, 0.0))
        return self.accept[bisect.bisect_right(self.edges, score)]

    def child_accept(self, rank: int) -> float:
        """P(the rank-th best child (0-based) is accepted | its parent was)."""
        return self.child[rank] if rank < len(self.child) else 0.0

    def lookup_accept(self, ngram: int) -> float:
        """P(a lookup token is accepted | its parent was), for a suffix match of `ngram` tokens."""
        return self.lookup[min(max(ngram, 1), len(self.lookup)) - 1]


IDENTITY = Calibration.identity_table()   # frozen: one shared instance


def isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []   # [value, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            w = w1 + w2
            blocks.append([(v1 * w1 + v2 * w2) / w if w else (v1 + v2) / 2, w, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out.extend([v] * n)
    return out


def fit(scored: Iterable[tuple[float, bool]], child: list[tuple[int, bool]], lookup: list[tuple[int, bool]],
        source: str, prior: float = 2.0) -> Calibration:
    """A table from observations. scored: (cumulative draft log-probability, on the accepted path) per verified
    head node; child: (rank among its verified siblings, accepted) per verified child of an accepted node;
    lookup: (match length, accepted) per lookup token whose parent was accepted. Each bin's rate is shrunk
    towards EAGLE-2's value by `prior` pseudo-observations (empty bins keep it), then made non-decreasing."""
    ident = IDENTITY
    hits = [0.0] * (len(EDGES) + 1)
    counts = [0.0] * (len(EDGES) + 1)
    n = 0
    for score, ok in scored:
        i = bisect.bisect_right(EDGES, score)
        hits[i] += ok
        counts[i] += 1
        n += 1
    rates = [(h + prior * p) / (c + prior) for h, c, p in zip(hits, counts, ident.accept)]
    accept = [min(1.0, max(0.0, v)) for v in isotonic(rates, [c + prior for c in counts])]
    return Calibration(edges=EDGES, accept=tuple(accept), child=_rates(child, Calibration.child, decreasing=True),
                       lookup=_rates(lookup, Calibration.lookup), samples=n, source=source)


def _rates(obs: list[tuple[int, bool]], default: tuple[float, ...], decreasing: bool = False) -> tuple[float, ...]:
    """Per key 1..len(default) (rank + 1 or match length, longer ones pooled into the last): the observed
    rate shrunk towards the default by 2 pseudo-observations; monotone in the key."""
    hits, counts = [0.0] * len(default), [0.0] * len(default)
    for key, ok in obs:
        i = min(max(key, 1), len(default)) - 1
        hits[i] += ok
        counts[i] += 1
    rates = [(h + 2 * d) / (c + 2) for h, c, d in zip(hits, counts, default)]
    weights = [c + 2 for c in counts]
    if decreasing:
        return tuple(x for x in reversed(isotonic(rates[::-1], weights[::-1])))
    return tuple(isotonic(rates, weights))


@dataclass
class RunAcceptance:
    """One run's own acceptance, folded into the head's table as the run goes (the cost-aware tree's values).

    The table was fitted on other prompts; a run's text can repeat itself far less than theirs did (on
    MT-bench a lookup token at depth 1 was accepted 0.19 of the time where the table said 0.44:
    docs/performance.md entry 29) or its head guess better or worse. After each cycle the verified nodes whose parent was accepted are counted: a
    lookup token, by its match length; a head node, against the chance the table gave it given its parent.
    `table()` is the base table with each lookup rate and the head's scale taken from what was counted, each
    shrunk towards the base by pseudo-observations (a few cycles move it; a long run follows its own text): the
    head's scale by `weight`, the lookup rates by `lookup_weight`, as few as the fit itself shrinks a sparse bin
    by, since the lookups' rates are what moves most from one kind of text to another and a run meets a few
    lookup matches (4-11 in 128 tokens on MT-bench: docs/performance.md entry 43). Only which nodes are verified
    changes: the output is the target's either way."""

    base: Calibration
    weight: float = 8.0
    lookup_weight: float = 2.0
    lookup_hits: list[float] = field(default_factory=list)
    lookup_seen: list[float] = field(default_factory=list)
    head_hits: float = 0.0        # head nodes accepted (their parent was)
    head_expected: float = 0.0    # the sum of their chances by the base table, given the parent

    def __post_init__(self):
        self.lookup_hits = self.lookup_hits or [0.0] * len(self.base.lookup)
        self.lookup_seen = self.lookup_seen or [0.0] * len(self.base.lookup)

    def observe(self, verified: Iterable[int], accepted: set[int], parents: list[int], sources: list[str],
                scores: list[float], ngram: int) -> bool:
        """One cycle: `verified` node ids (the root not among them), `accepted` the ids on the accepted path;
        the candidates' `parents` (-1: the root), `sources` and cumulative draft log-probabilities `scores`;
        `ngram` the lookup match's length (0: none). A node "both" proposed is not counted (valued at the
        better of two estimates, it measures neither). Returns whether anything was counted."""
        counted = False
        for n in verified:
            p = parents[n]
            if p >= 0 and p not in accepted:
                continue
            ok = n in accepted
            if sources[n] == "lookup" and ngram:
                i = min(ngram, len(self.lookup_seen)) - 1
                self.lookup_seen[i] += 1
                self.lookup_hits[i] += ok
                counted = True
            elif sources[n] == "eagle" and not self.base.identity:
                above = self.base.path_accept(scores[p]) if p >= 0 else 1.0
                self.head_expected += min(1.0, self.base.path_accept(scores[n]) / above) if above > 0 else 0.0
                self.head_hits += ok
                counted = True
        return counted

    def head_scale(self) -> float:
        """The head's observed acceptance over the table's, shrunk towards 1."""
        return (self.head_hits + self.weight) / (self.head_expected + self.weight)

    def table(self) -> Calibration:
        """The base table with this run's lookup rates and head scale (non-decreasing in match length)."""
        w, base = self.lookup_weight, self.base
        rates = [(h + w * r) / (c + w) for h, c, r in zip(self.lookup_hits, self.lookup_seen, base.lookup)]
        lookup = tuple(isotonic(rates, [c + w for c in self.lookup_seen]))
        f = self.head_scale()
        if base.identity or f == 1.0:
            return replace(base, lookup=lookup)
        return replace(base, accept=tuple(min(1.0, a * f) for a in base.accept),
                       child=tuple(min(1.0, c * f) for c in base.child), lookup=lookup)


@dataclass(frozen=True)
class HeadCalibration:
    """The tables of one head: greedy (T = 0) and sampling (T > 0)."""

    greedy: Calibration
    sampling: Calibration

    def at(self, temperature: float) -> Calibration:
        return self.greedy if temperature == 0 else self.sampling

    @classmethod
    def identity(cls) -> HeadCalibration:
        table = IDENTITY
        return cls(table, table)

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "greedy": asdict(self.greedy), "sampling": asdict(self.sampling)},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> HeadCalibration:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version-{VERSION} calibration file")
        tables = []
        for key in ("greedy", "sampling"):
            d = dict(data[key])
            tables.append(Calibration(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}))
        return cls(*tables)


def file_for(weights: str = "dense") -> str:
    """The calibration's file name for a target whose products compute this way (`TargetModel.weights`): a
    target computing from its file's blocks with int8 activations has its own table where one was fitted (its
    features and logits carry the rounding; for the shipped head the two tables agree within a few points,
    docs/tree-policy.md)."""
    return FILE if weights == "dense" else f"calibration-{weights}.json"


def read(head_dir: str | Path | None, weights: str = "dense") -> HeadCalibration | None:
    """The head's calibration for a target computing with `weights` (`file_for`; the dense table where no own
    table was fitted), None when it has none. A damaged file is a ValueError naming it."""
    if head_dir is None:
        return None
    path = Path(head_dir) / file_for(weights)
    if not path.is_file():
        path = Path(head_dir) / FILE
    if not path.is_file():
        return None
    try:
        return HeadCalibration.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a calibration this build reads: {exc}") from exc
