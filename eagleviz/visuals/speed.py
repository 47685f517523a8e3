"""Measured speed: the `bench` bar chart (its table: `eagleviz.visuals.table`), the verification cost curve
cost(n) / cost(1), and the ceiling: what a drafter whose guesses were always right would reach here, against
the shipped head.

Drawn from the JSON that `python -m eagleviz bench` and `python -m eagleviz tune` write (plain dicts; read back
from JSON, the curve's integer keys are strings). The curve is the roofline argument for speculation: while a
forward's time goes to reading the weights from memory, n tokens cost about what 1 costs, so verifying a tree
of drafts is nearly free; once arithmetic dominates, cost grows with n and the tree stops paying.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go

from eagleviz.measured import Measured
from eagleviz.visuals.fit import Header
from eagleviz.visuals.style import ACCEPTED, INK, NEUTRAL, REJECTED, VISIBLE, empty_figure, figure, layout
from eagleviz.visuals.table import against_plain, dtypes_label, markdown_table

NO_CURVE = ("No verification cost curve is available: run `python -m eagleviz tune` to measure this machine "
            "(`python -m eagleviz tune --curve-only` measures just the curve).")
NO_CURVE_FIGURE = "No verification cost curve measured yet"
NO_BENCH = "No bench result is available: run `python -m eagleviz bench` to measure this machine."
CURVE_TITLE = "One forward verifies n tokens for less than n forwards"
BENCH_PLOT_PX = 270          # the bars, the method names under them and the axis title
CURVE_PLOT_PX = 300          # the curve, its tick labels and axis titles
NO_CEILING = ("No ceiling is measured: run `python -m eagleviz ceiling` to measure what a perfect drafter would "
              "reach on this machine.")
CEILING_PLOT_PX = 300        # the bars, their labels and axis titles
TEMPERATURE_TITLES = {0.0: "Greedy decoding (T = 0)", 1.0: "Sampling (T = 1)"}
VS_PLAIN_NOTE = ("*vs plain decoding*: the median over prompts of each method's tokens/s over the plain row's on "
                 "the same prompt (95% bootstrap interval in brackets), eagleviz's own loop with the same model and "
                 "no speculation, which is what EAGLE speeds up; *vs {reference}*: the median per-prompt ratio "
                 "against that peer. ")


def method_colour(method: str) -> str:
    """EAGLE in blue, eagleviz's own plain loop in sky blue, the peers (Hugging Face, llama.cpp) in grey."""
    if method.startswith("eagle"):
        return ACCEPTED
    return VISIBLE if method == "plain" else NEUTRAL


def bench_caption(result: dict, origin: str) -> str:
    """One line: what was measured, on what, with which command, and where the file comes from."""
    mc, s, tree = result.get("machine", {}), result["sampling"], result.get("tree")
    what = f"{result['prompts']:g} prompts, {s.get('max_new_tokens', '?')} new tokens"
    if tree:
        kind = {True: "cost-aware, knobs as bounds", False: "SGLang's fixed tree"}.get(tree.get("adaptive"))
        source = f", candidates from {tree['source']}" if isinstance(tree.get("source"), str) else ""
        what += (f", tree {tree['steps']}/{tree['topk']}/{tree['draft_tokens']} (steps/topk/draft tokens"
                 f"{'; ' + kind if kind else ''}{source})")
    if tuned := result.get("tuned_tree"):
        at = {None: "", "tuned.json": " at T = 0"}.get(tuned.get("source"), f" at T = {s.get('temperature', 0):g}")
        what += f", eagle-tuned {tuned['steps']}/{tuned['topk']}/{tuned['draft_tokens']} (found by tune{at})"
    where = (f"{mc.get('model', '?')} with head {mc.get('head', '?')}, {dtypes_label(mc)} on "
             f"{mc.get('cpu', '?')} ({mc.get('device', 'cpu')}), {mc.get('threads', '?')} threads, "
             f"torch {mc.get('torch', '?')}{', ' + mc['date'] if mc.get('date') else ''}")
    command = f" Command: `{result['command']}`." if result.get("command") else ""
    return f"{what}; {where}.{command} Source: {origin}."


def bench_figure(result: dict, height: int | None = None, vs_plain: bool = False) -> go.Figure:
    """Median tokens/s per method, each bar labelled with its median per-prompt speedup over the reference,
    or (`vs_plain`, where the bench has a plain row) with its speed against plain decoding (`against_plain`)."""
    rows, mc = result["rows"], result.get("machine", {})
    methods = list(rows)
    tps = [rows[m]["tokens_per_s"] for m in methods]
    taus = [f"{rows[m]['tau']:.2f}" if rows[m]["tau"] else "-" for m in methods]
    ratios = against_plain(result) if vs_plain else None
    speedups = [ratios[m] if ratios else rows[m]["speedup"] for m in methods]
    against = f"{'plain decoding' if ratios else result['reference']} (median per prompt)"
    bar = dict(type="bar", x=methods, y=tps, text=[f"{x:.2f}x" for x in speedups],
               textposition="outside", cliponaxis=False, customdata=taus,
               marker=dict(color=[method_colour(m) for m in methods], line=dict(color=INK, width=1)),
               hovertemplate=(f"%{{x}}: %{{y:.1f}} tokens/s<br>%{{text}} vs {against}"
                              "<br>\u03c4 = %{customdata}<extra></extra>"))
    header = Header("Median tokens/s", (f"{result['prompts']:g} prompts", f"T = {result['sampling']['temperature']:g}",
                                        f"{dtypes_label(mc)}, {mc.get('threads', '?')} threads"))
    return figure(data=[bar], layout=layout(
        header, height or round(header.px() + BENCH_PLOT_PX), showlegend=False,
        xaxis=dict(title=dict(text=f"method (bar label: speedup vs {against.split(' (')[0]})")),
        yaxis=dict(title=dict(text="tokens/s"), range=[0, max(tps) * 1.18], rangemode="tozero")))


def _curve_points(verify_cost: dict) -> list[tuple[int, float, float]]:
    """(n, ms, relative) sorted by n; keys may be ints or, after a JSON round trip, strings."""
    ms = {int(n): v for n, v in verify_cost["ms"].items()}
    rel = {int(n): v for n, v in verify_cost["relative"].items()}
    return [(n, ms[n], rel[n]) for n in sorted(ms)]


def verify_cost_figure(verify_cost: dict | None, height: int | None = None) -> go.Figure:
    """cost(n) / cost(1) against n on log2 axes, between the ideal (flat at 1: n tokens for the price of one)
    and n separate forwards (y = n, what plain decoding pays for n tokens)."""
    if verify_cost is None:
        return empty_figure(NO_CURVE_FIGURE, 160)
    pts = _curve_points(verify_cost)
    sizes = [n for n, _, _ in pts]
    top = max(max(sizes), math.ceil(max(r for _, _, r in pts)))
    ticks = [2 ** k for k in range(top.bit_length() + 1) if 2 ** k <= 2 * top]
    traces = [
        dict(type="scatter", x=sizes, y=sizes, mode="lines", name="n separate forwards (cost n)",
             line=dict(color=REJECTED, dash="dot", width=2),
             hovertemplate="%{x} separate forwards: %{y}x<extra></extra>"),
        dict(type="scatter", x=sizes, y=[1] * len(sizes), mode="lines", name="ideal: n tokens for the price of 1",
             line=dict(color=INK, dash="dash", width=2), hoverinfo="skip"),
        dict(type="scatter", x=sizes, y=[r for _, _, r in pts], mode="lines+markers+text",
             name="measured: one forward of n tokens", line=dict(color=ACCEPTED, width=3), marker=dict(size=9),
             text=[f"{r:.2f}x" for _, _, r in pts], textposition="top center", customdata=[m for _, m, _ in pts],
             hovertemplate="n = %{x}: %{customdata:.1f} ms, %{y:.2f}x the cost of 1 token<extra></extra>")]
    header = Header(_curve_title(pts), _curve_subtitle(pts))
    axis = dict(type="log", tickvals=ticks, ticktext=[str(t) for t in ticks], showgrid=True, gridcolor="#EEEEEE")
    return figure(data=traces, layout=layout(
        header, height or round(header.px() + CURVE_PLOT_PX),
        legend=dict(x=0.01, y=0.99, xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.85)",
                    font=dict(size=12)),
        xaxis=axis | dict(title=dict(text="tokens verified in one forward (n)")),
        yaxis=axis | dict(title=dict(text="time relative to n = 1"), range=[-0.15, math.log10(top) + 0.1])))


def _curve_title(pts: list[tuple[int, float, float]]) -> str:
    """The headline with this curve's own number: what verifying 16 tokens (or the nearest n measured) costs,
    in single-token forwards (about 1.2 on a CPU with AMX, about 1.9 in fp32 without)."""
    n, _, r = min(pts, key=lambda p: abs(p[0] - 16))
    return f"One forward verifies {n} tokens for the price of {r:.1f}" if n > 1 else CURVE_TITLE


def _curve_subtitle(pts: list[tuple[int, float, float]]) -> tuple[str, ...]:
    """What bounds the curve, read from it (16 tokens for at most twice one: reading the weights; more:
    arithmetic, as with int8 products from weight blocks), then its measured points."""
    shown = [f"n = {n} costs {r:.2f}x" for n, _, r in pts if n in (16, pts[-1][0])]
    _, _, r16 = min(pts, key=lambda p: abs(p[0] - 16))
    why = ("reading the weights dominates" if r16 <= 2.0 else "arithmetic catches up within a few tokens")
    return (why, "measured: " + shown[0], *shown[1:]) if shown else (why,)


def verify_cost_text(found: Measured | None) -> str:
    """What the curve shows and why it matters, with the machine it was measured on and where it comes from."""
    if found is None:
        return NO_CURVE
    mc, curve = found.data.get("machine", {}), found.data["verify_cost"]
    one = _curve_points(curve)[0]
    return (f"**Why a tree is cheap to verify.** Each point is the median time of one target forward of n new "
            f"tokens after a {curve.get('prefix', '?')}-token prefix, divided by the time for n = {one[0]} "
            f"({one[1]:.1f} ms). At small n the forward's time goes to reading the weights from memory, once, "
            "whatever n is: the extra tokens ride along almost for free until arithmetic catches up. EAGLE's "
            "speedup over plain decoding is roughly \u03c4 divided by this relative cost plus the draft's time (in "
            "single forwards), so the flatter the curve, the more a wide tree pays.\n\n"
            f"{mc.get('model', '?')}, {dtypes_label(mc)} on {mc.get('cpu', '?')}, {mc.get('threads', '?')} "
            f"threads, torch {mc.get('torch', '?')}. Source: {found.origin}.")


def _chain_rows(result: dict, kind: str) -> list[tuple[int, dict]]:
    """(k, row) of `kind`-k rows (foresight, eagle-chain), by chain length."""
    rows = result["rows"]
    return [(k, rows[f"{kind}-{k}"]) for k in result["chains"] if f"{kind}-{k}" in rows]


def ceiling_figure(result: dict | None, height: int | None = None) -> go.Figure:
    """Speedup over the plain loop by chain length: guesses always right (foresight: the ceiling), against the
    shipped head's chains; plain decoding and the default tree as lines named in the legend. Each bar names its
    speedup; hovering gives its tau and its cycle's price."""
    if result is None:
        return empty_figure("No ceiling measured yet", 160)
    traces, chains = [], [f"chain of {k}" for k in result["chains"]]
    for kind, name, colour, where in (("foresight", "every guess right (the ceiling)", VISIBLE, "outside"),
                                      ("eagle-chain", "the head's guesses", ACCEPTED, "inside")):  # clear of the lines
        pts = _chain_rows(result, kind)
        if not pts:  # a result measured without a draft head
            continue
        traces.append(dict(type="bar", name=name, x=[f"chain of {k}" for k, _ in pts],
                           y=[r["speedup"] for _, r in pts], marker=dict(color=colour, line=dict(color=INK, width=1)),
                           text=[f"{r['speedup']:.2f}x" for _, r in pts], textposition=where, cliponaxis=False,
                           customdata=[[r["tau"], r["cycle_steps"]] for _, r in pts],
                           hovertemplate=("%{x}, " + name + ": %{y:.2f}x plain<br>\u03c4 = %{customdata[0]:.2f} "
                                          "tokens a cycle, a cycle costs %{customdata[1]:.2f} plain steps"
                                          "<extra></extra>")))
    levels = [("plain decoding: 1.00x", 1.0, INK, "dot")]
    if (default := result["rows"].get("eagle")) is not None:
        levels.append((f"the default tree: {default['speedup']:.2f}x", default["speedup"], REJECTED, "dash"))
    for name, y, colour, dash in levels:
        traces.append(dict(type="scatter", mode="lines", name=name, x=[chains[0], chains[-1]], y=[y, y],
                           line=dict(color=colour, dash=dash, width=2), hoverinfo="skip"))
    best = max(r["speedup"] for _, r in _chain_rows(result, "foresight"))
    head = max((r["speedup"] for _, r in _chain_rows(result, "eagle-chain")), default=None)
    top = max(max(t["y"]) for t in traces)  # bars and lines: the default tree can beat every chain
    title = f"Guesses always right: up to {best:.2f}x" + ("" if head is None else f"; the head's: {head:.2f}x")
    mc = result.get("machine", {})
    details = (f"{result['prompts']:g} prompts, T = 0", f"{dtypes_label(mc)}, {mc.get('threads', '?')} threads")
    header = Header(title, details,
                    legend=tuple(t["name"] for t in traces))  # above the plot: the ceiling's bars reach its top
    return figure(data=traces, layout=layout(
        header, height or round(header.px() + CEILING_PLOT_PX), barmode="group",
        xaxis=dict(title=dict(text="tokens drafted per cycle (a chain)")),
        yaxis=dict(title=dict(text="speed over the plain loop"), range=[0, top * 1.15], rangemode="tozero")))


def chain_acceptance(tau: float, k: int) -> float | None:
    """The per-token acceptance a at which a chain of k drafted tokens commits `tau` tokens a cycle on average
    (1 + a + ... + a^k, each guess accepted with the same chance once its parent is); None beyond k + 1."""
    if tau > k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < tau else (lo, mid)
    return (lo + hi) / 2


def ceiling_text(found: Measured | None) -> str:
    """Why speculation gains what it does here, in this result's own numbers: a cycle's price, the perfect
    drafter's speed, the head's first-guess acceptance, and the tau the default tree would need for the target."""
    if found is None:
        return NO_CEILING
    r, mc = found.data, found.data.get("machine", {})
    rows, target = r["rows"], r["target"]
    perfect, head = _chain_rows(r, "foresight"), dict(_chain_rows(r, "eagle-chain"))
    best_k, best = max(perfect, key=lambda p: p[1]["speedup"])
    first_k, first = perfect[0]
    text = (f"**What a perfect drafter would reach.** EAGLE's speedup is τ (the tokens a cycle commits) over "
            "what a cycle costs in plain steps: its drafting, one verification forward and the bookkeeping. Here a "
            f"drafter that is always right (each chain is the tokens plain decoding then chooses) reaches "
            f"**{first['speedup']:.2f}x** with a chain of {first_k} (a cycle costs {first['cycle_steps']:.2f} plain "
            f"steps for {first['tau']:.2f} tokens) and at most **{best['speedup']:.2f}x** (a chain of {best_k}).")
    if first_k in head:
        h = head[first_k]
        accepted = f" (its guess accepted {h['tau'] - 1:.0%} of the time)" if first_k == 1 else ""
        text += (f" The head's own chain of {first_k} commits {h['tau']:.2f} tokens a cycle{accepted} at "
                 f"{h['cycle_steps']:.2f} plain steps: **{h['speedup']:.2f}x**.")
    if (d := rows.get("eagle")) is not None:
        text += (f" The default tree commits {d['tau']:.2f} tokens a cycle at {d['cycle_steps']:.2f} plain steps "
                 f"(**{d['speedup']:.2f}x**); at that price, {target:g}x would take \u03c4 = {d['tau_needed']:.2f}.")
    needs = [(a, k) for k, h in head.items() if (a := chain_acceptance(h["tau_needed"], k)) is not None]
    if needs:
        a, k = min(needs)
        text += (f" At the price of the head's own chain of {k}, {target:g}x needs each guess accepted "
                 f"**{a:.0%}** of the time (once its parent is)")
        one = head[1]["tau"] - 1 if 1 in head else 0.0
        # the second guess's share from two runs' taus: shown only where it is a share
        second = (head[2]["tau"] - head[1]["tau"]) / one if 2 in head and one > 0 else -1.0
        if 0.0 <= second <= 1.0:
            text += (f", where the head's first guess is accepted {one:.0%} of the time and its second, once the "
                     f"first is, {second:.0%}")
        text += "."
    flipped = max((row.get("flipped", 0) for row in rows.values()), default=0)
    if flipped:  # numerics whose sums depend on the batch (dense products, CUDA): near-ties flip
        text += (f" In up to {flipped:g} of the {r['prompts']:g} prompts a run left plain decoding's output at a "
                 "near-tie, or a perfect guess was rejected there: these numerics round differently in a larger "
                 "batch, so the ceiling shown is a little low.\n\n")
    elif r.get("batch_invariant"):
        text += (" Every run's output was checked to be plain decoding's, and every perfect guess was accepted: a "
                 "token's logits do not depend on the tree it is verified in.\n\n")
    else:
        text += " Every run's output was plain decoding's, and every perfect guess was accepted.\n\n"
    text += (f"{mc.get('model', '?')} with head {mc.get('head', '?')}, {dtypes_label(mc)} on {mc.get('cpu', '?')}, "
             f"{mc.get('threads', '?')} threads.")
    if r.get("command"):
        text += f" Command: `{r['command']}`."
    text += f" Source: {found.origin}."
    if found.shipped:
        text += " Run `python -m eagleviz ceiling` to measure this machine."
    return text


@dataclass(frozen=True)
class BenchPanel:
    text: str
    figure: go.Figure


@dataclass(frozen=True)
class SpeedView:
    """Everything the page's measured-speed section shows: one panel per bench temperature, then the curve."""

    benches: tuple[BenchPanel, ...]
    curve_text: str
    curve: go.Figure
    ceiling_text: str = NO_CEILING
    ceiling: go.Figure | None = None


def bench_panel(found: Measured) -> BenchPanel:
    r = found.data
    t = float(r["sampling"]["temperature"])
    heading = TEMPERATURE_TITLES.get(t, f"Sampling (T = {t:g})")
    note = VS_PLAIN_NOTE.format(reference=r["reference"]) if against_plain(r) else ""
    text = (f"#### {heading}\n\n{markdown_table(r, mismatches='summary', vs_plain=True)}\n\n"
            f"{note}{bench_caption(r, found.origin)}")
    if found.shipped:
        text += " Run `python -m eagleviz bench` to measure this machine."
    return BenchPanel(text, bench_figure(r, vs_plain=True))


def speed_view(benches: list[Measured | None], curve: Measured | None, ceiling: Measured | None = None) -> SpeedView:
    """The section's contents from what `eagleviz.measured` found (None entries are skipped)."""
    panels = tuple(bench_panel(b) for b in benches if b is not None)
    if not panels:
        panels = (BenchPanel(NO_BENCH, empty_figure(NO_BENCH, 200)),)
    return SpeedView(panels, verify_cost_text(curve),
                     verify_cost_figure(curve.data["verify_cost"] if curve is not None else None),
                     ceiling_text(ceiling), ceiling_figure(ceiling.data if ceiling is not None else None))
