"""Two settings on the same prompt, side by side: the statistics serving engines log, drawn from two RunTraces.

    tokens per cycle              tokens one cycle commits: its accept length (the draft tokens accepted, as the
                                  per-cycle chart and the glossary count it) plus the bonus token. SGLang logs
                                  its mean as "accept len"; the page calls that mean tau and never accept length
    acceptance histogram          how many cycles committed 1, 2, 3, ... tokens per cycle (vLLM's histogram of
                                  accepted tokens per draft)
    acceptance rate per position  vLLM's: of all cycles, the share whose k-th draft token was accepted, i.e.
                                  whose accepted path reached depth k (unconditional, unlike the paper's n-alpha,
                                  which divides by the cycles that reached depth n)

Everything is counted from the traces' cycles (`CycleTrace.accept_length`, `CycleTrace.positions`) and timings
(`RunTrace.wall_s`), never from decoded text.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from eagleviz.trace import RunTrace, summarize
from eagleviz.visuals.style import ACCEPTED, BONUS, INK, empty_figure, figure, layout

SETTING_COLOURS = (ACCEPTED, BONUS)      # A, B; B's bars are hatched and its line dashed: never colour alone
SETTING_PATTERNS = ("", "/")
SETTING_DASHES = ("solid", "dash")
FIGURE_PX = 340
TITLE_PX, LEGEND_PX, PLOT_PX = 34, 60, 92   # from the top: the title (below the toolbar), the legend, the plot
SOURCES = {"eagle": "EAGLE head", "lookup": "prompt lookup", "eagle+lookup": "head + lookup"}
WORDS = ("**Tokens per cycle**: the tokens one cycle commits, its accept length (draft tokens accepted) plus the "
         "bonus token; their mean is the page's \u03c4, which SGLang logs as *accept len*.\n\n"
         "**Acceptance histogram**: how many cycles committed 1, 2, 3, \u2026 tokens per cycle.\n\n"
         "**Acceptance rate per position** (vLLM's): of all cycles, the share whose k-th draft token was "
         "accepted.")


@dataclass(frozen=True)
class SettingStats:
    """One setting's run in the serving engines' terms. `histogram[i]`: cycles that committed i + 1 tokens;
    `per_position[k - 1]`: the share of cycles whose draft token at depth k was accepted, for k = 1 .. the
    deepest draft token the run verified."""

    name: str                    # "A" or "B"
    setting: str                 # the tree, draft source and temperature, in words
    cycles: int
    tokens: int                  # new tokens, the prefill's included (as the run's tokens/s counts them)
    wall_s: float
    histogram: list[int]
    per_position: list[float]

    @property
    def tau(self) -> float:
        """Mean tokens committed per cycle, the bonus included (SGLang's "accept len")."""
        return sum((i + 1) * n for i, n in enumerate(self.histogram)) / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def setting_label(run: RunTrace) -> str:
    """The run's tree (steps / topk / draft tokens, fixed or cost-aware), draft source and temperature."""
    tree = run.config.get("tree")
    temperature = f"T = {float(run.config['sampling']['temperature']):g}"
    if not isinstance(tree, dict):
        return f"plain decoding, {temperature}"
    kind = "cost-aware" if tree.get("adaptive") else "fixed"
    source = SOURCES.get(tree.get("source", "eagle"), str(tree.get("source")))
    return (f"tree {tree['steps']} / {tree['topk']} / {tree['draft_tokens']} (steps / topk / draft tokens), {kind}, "
            f"{source}, {temperature}")


def setting_stats(run: RunTrace, name: str) -> SettingStats:
    lengths = [c.accept_length for c in run.cycles]
    deepest = max((max(c.positions) - c.positions[0] for c in run.cycles if c.positions), default=0)
    histogram = [0] * (max(lengths, default=0) + 1)
    for n in lengths:
        histogram[n] += 1
    n = len(lengths)
    per_position = [sum(a >= k for a in lengths) / n for k in range(1, deepest + 1)] if n else []
    return SettingStats(name=name, setting=setting_label(run), cycles=n, tokens=summarize(run)["new_tokens"],
                        wall_s=run.wall_s, histogram=histogram, per_position=per_position)


def compare_stats(a: RunTrace, b: RunTrace) -> list[SettingStats]:
    return [setting_stats(a, "A"), setting_stats(b, "B")]


def _layout(title: str, **extra) -> dict:
    """The title under the toolbar's band, then the one-row legend, then the plot, placed in px from the top
    so that neither prints over the other at any width (two short legend entries never wrap)."""
    title_y, legend_y = 1 - TITLE_PX / FIGURE_PX, 1 - LEGEND_PX / FIGURE_PX   # container coordinates: 1 = top
    return layout(title, FIGURE_PX) | extra | {
        "title": dict(text=title, x=0.01, xanchor="left", yref="container", y=title_y, yanchor="top",
                      font=dict(size=15)),
        "legend": dict(orientation="h", x=0, yref="container", y=legend_y, yanchor="top", font=dict(size=12)),
        "margin": dict(l=10, r=10, t=PLOT_PX, b=10)}


def histogram_figure(stats: list[SettingStats]) -> go.Figure:
    """Grouped bars: per setting, the share of its cycles that committed 1, 2, 3, ... tokens (the counts in the
    bars' `customdata` and hover), so runs of different lengths compare."""
    if not any(s.cycles for s in stats):
        return empty_figure("No speculation cycles to count.", FIGURE_PX)
    width = max(len(s.histogram) for s in stats)
    counts = [s.histogram + [0] * (width - len(s.histogram)) for s in stats]
    traces = [dict(type="bar", name=s.name, x=list(range(1, width + 1)), y=[n / max(s.cycles, 1) for n in counts[k]],
                   customdata=counts[k],
                   marker=dict(color=SETTING_COLOURS[k % 2], line=dict(color=INK, width=1),
                               pattern=dict(shape=SETTING_PATTERNS[k % 2])),
                   hovertemplate=f"{s.name}: %{{customdata}} of {s.cycles} cycles committed %{{x}} token(s)"
                                 "<extra></extra>")
              for k, s in enumerate(stats)]
    return figure(traces, _layout("Acceptance histogram", barmode="group",
                                  xaxis=dict(title=dict(text="tokens per cycle"), dtick=1),
                                  yaxis=dict(title=dict(text="share of cycles"), tickformat=".0%", rangemode="tozero")))


def positions_figure(stats: list[SettingStats]) -> go.Figure:
    """Per setting, vLLM's acceptance rate at each draft position (depth 1 = the root's child)."""
    if not any(s.per_position for s in stats):
        return empty_figure("No draft tokens were verified.", FIGURE_PX)
    traces = [dict(type="scatter", mode="lines+markers", name=s.name, x=list(range(1, len(s.per_position) + 1)),
                   y=s.per_position, line=dict(color=SETTING_COLOURS[k % 2], dash=SETTING_DASHES[k % 2], width=3),
                   marker=dict(size=9, symbol=("circle", "square")[k % 2]),
                   hovertemplate=f"{s.name}: position %{{x}} accepted in %{{y:.0%}} of cycles<extra></extra>")
              for k, s in enumerate(stats)]
    return figure(traces, _layout("Acceptance rate per position",
                                  xaxis=dict(title=dict(text="draft position (depth)"), dtick=1),
                                  yaxis=dict(title=dict(text="accepted, share of cycles"), tickformat=".0%",
                                             range=[0, 1.05])))


def compare_table(stats: list[SettingStats]) -> str:
    """The settings, then their measured speed and counts as a Markdown table, then the words explained."""
    settings = "\n".join(f"- **{s.name}**: {s.setting}" for s in stats)
    # One column per setting: narrow enough for a phone
    cells = {"tokens/s": [f"{s.tokens_per_s:.1f}" for s in stats],
             "\u03c4, tokens per cycle": [f"{s.tau:.2f}" for s in stats],
             "cycles": [str(s.cycles) for s in stats], "tokens": [str(s.tokens) for s in stats]}
    head = f"| | {' | '.join(s.name for s in stats)} |\n|---|{'---:|' * len(stats)}"
    rows = "\n".join(f"| {name} | {' | '.join(values)} |" for name, values in cells.items())
    a, b = stats[0].tokens_per_s, stats[-1].tokens_per_s
    ratio = f"**B decodes at {b / a:.2f}x A's speed.** " if a > 0 else ""
    return (f"{settings}\n\n{head}\n{rows}\n\n{ratio}Both ran on this server now, on this prompt; each one's time counts its own turns "
            f"at the model only.\n\n{WORDS}")
