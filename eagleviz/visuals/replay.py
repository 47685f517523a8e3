"""Losslessness made visible: replay the acceptance step at the root many times, without the model.

For the selected cycle at T > 0, the trace holds the target's sampling distribution p at the root (its
most likely tokens, `root_top`) and the draft's children of the root in the order they were tried. One
replay runs the rule of multi-round speculative sampling with top-k drafts (EAGLE Algorithm 1, SpecInfer):
try child x1: accept iff u < p(x1); else set p(x1) = 0, renormalise, try x2 the same way, ...; if every
child is rejected, draw the token from the residual. The histogram of the committed first token over many
seeded replays must match p itself: P(commit x_i) = prod_{j<i}(1 - r_j) * r_i = p(x_i), where r_i is x_i's
residual probability, and the residual draw covers the rest exactly.

Tokens outside `root_top` (and not tried) are pooled into one "other" bucket holding the remaining mass; a
child of the root that is in neither has less probability than the last `root_top` entry and is treated as
part of that bucket (an error below that probability).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from eagleviz.trace import CycleTrace
from eagleviz.visuals.fit import Header, legend_names
from eagleviz.visuals.style import BONUS, NEUTRAL, empty_figure, figure, layout, token_html

OTHER = -1   # token id of the pooled "other" bucket
DEFAULT_DRAWS = 10_000
PLOT_PX = 300   # the bars, their token labels at -30 degrees and the axis title under them
NO_REPLAY_GREEDY = "Replay needs a sampling run (temperature > 0): at T = 0 acceptance is deterministic."
NO_REPLAY_SAMPLING = "This trace does not record the target's distribution at the root (made by an older build)."
NO_REPLAY_ROOT = ("Nothing was drafted for this cycle to verify: its token came from the target alone, as in plain "
                  "decoding, so there is no acceptance to replay.")


@dataclass
class ReplayResult:
    tokens: list[int]            # bucket token ids (OTHER = everything else)
    texts: list[str]
    target: np.ndarray           # (K,) the target's probability per bucket
    counts: np.ndarray           # (K,) committed-first-token counts over the replays
    tried: list[int]             # the root's children, in the order a replay tries them
    draws: int

    @property
    def empirical(self) -> np.ndarray:
        return self.counts / max(self.draws, 1)

    @property
    def total_variation(self) -> float:
        """Half the L1 distance between the replayed and the target distribution (0 = identical)."""
        return 0.5 * float(np.abs(self.empirical - self.target).sum())


def root_distribution(cycle: CycleTrace) -> tuple[list[int], list[str], np.ndarray] | None:
    """The target's distribution at the root as buckets, or None when the trace has none (greedy)."""
    if not cycle.root_top:
        return None
    probs = {tok: p for tok, _, p in cycle.root_top}
    texts = {tok: text for tok, text, _ in cycle.root_top}
    remaining = 1.0
    for c in (c for c in cycle.checks if c.depth == 1):  # tried children: p0(x_i) = r_i * remaining mass
        p0 = c.p * remaining
        if c.token not in probs:
            probs[c.token], texts[c.token] = p0, c.text
        remaining -= probs[c.token]
    tokens = list(probs)
    values = np.array([probs[t] for t in tokens], dtype=np.float64)
    other = max(0.0, 1.0 - float(values.sum()))
    tokens.append(OTHER)
    texts[OTHER] = "(other)"
    values = np.append(values, other)
    return tokens, [texts[t] for t in tokens], values / values.sum()


def root_children(cycle: CycleTrace) -> list[int]:
    """Tokens of the root's children in verification order (best draft score first): the order they are tried.
    A replay tries all of them, also those the recorded run never reached because an earlier one was accepted."""
    return [cycle.tokens[s] for s in range(1, cycle.num_tree_tokens) if cycle.parents[s] == 0]


def replay_acceptance(cycle: CycleTrace, draws: int = DEFAULT_DRAWS, seed: int = 0) -> ReplayResult | None:
    """Replay the root's acceptance step `draws` times (vectorised over draws; numpy RNG, no model)."""
    dist = root_distribution(cycle)
    if dist is None:
        return None
    tokens, texts, p = dist
    index = {t: k for k, t in enumerate(tokens)}
    tried = [t for t in root_children(cycle) if t in index]
    rng = np.random.default_rng(seed)
    committed = np.full(draws, -1, dtype=np.int64)
    residual = p.copy()
    for tok in tried:
        k = index[tok]
        r = residual[k] / residual.sum() if residual.sum() > 0 else 0.0
        open_ = committed < 0
        accept = open_ & (rng.random(draws) < r)
        committed[accept] = k
        residual[k] = 0.0
    left = committed < 0
    if left.any():
        committed[left] = rng.choice(len(tokens), size=int(left.sum()), p=residual / residual.sum())
    counts = np.bincount(committed, minlength=len(tokens)).astype(np.float64)
    return ReplayResult(tokens=tokens, texts=texts, target=p, counts=counts, tried=tried, draws=draws)


def replay_figure(cycle: CycleTrace, draws: int = DEFAULT_DRAWS, seed: int = 0, top: int = 12,
                  height: int | None = None) -> go.Figure:
    result = replay_acceptance(cycle, draws, seed)
    if result is None:
        sampled = any(c.uniform is not None for c in cycle.checks)
        why = NO_REPLAY_ROOT if cycle.num_tree_tokens == 1 else NO_REPLAY_SAMPLING if sampled else NO_REPLAY_GREEDY
        return empty_figure(why, height or 320)
    order = [k for k in np.argsort(-result.target) if result.tokens[k] != OTHER][:top]
    order.append(result.tokens.index(OTHER))
    labels = [token_html(result.texts[k], 10) + (" (draft)" if result.tokens[k] in result.tried else "")
              for k in order]
    traces = [dict(type="bar", x=labels, y=result.target[order].tolist(), name="target distribution p",
                   marker_color=NEUTRAL, hovertemplate="%{x}<br>p = %{y:.4f}<extra></extra>"),
              dict(type="bar", x=labels, y=result.empirical[order].tolist(), name=f"committed in {draws:,} replays",
                   marker_color=BONUS, hovertemplate="%{x}<br>replayed frequency = %{y:.4f}<extra></extra>")]
    header = Header(f"Cycle {cycle.index} \u00b7 first committed token",
                    (f"{draws:,} replays of the acceptance step",
                     f"total variation to p: {result.total_variation:.3f}"),
                    legend=tuple(legend_names(traces)))
    return figure(data=traces, layout=layout(
        header, height or round(header.px() + PLOT_PX), barmode="group",
        xaxis=dict(title=dict(text="token (\u201c(draft)\u201d = a child the draft proposed, tried first)"),
                   tickangle=-30,
                   type="category"),
        yaxis=dict(title=dict(text="probability"), rangemode="tozero")))
