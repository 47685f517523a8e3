"""The training curve (loss and top-1 agreement with the target, train and held-out, as one Plotly page) and the
calibration's reliability plot (a small SVG written without any plotting package)."""

from __future__ import annotations

import math
from pathlib import Path


def curve_figure(history: list[dict], title: str = ""):
    """Two panels over training steps: loss (left) and top-1 at unroll step 0 (right)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "top-1 agreement with the target"))
    series = (("train", "#1f77b4"), ("heldout", "#d62728"))
    for split, color in series:
        points = [h for h in history if split in h]
        steps = [h["step"] for h in points]
        fig.add_scatter(x=steps, y=[h[split]["loss"] for h in points], name=f"{split} loss", row=1, col=1,
                        line={"color": color})
        fig.add_scatter(x=steps, y=[h[split]["acc"][0] for h in points], name=f"{split} top-1", row=1, col=2,
                        line={"color": color})
    ho = [h for h in history if "heldout" in h]
    if ho and len(ho[0]["heldout"]["acc"]) > 1:
        for k in range(1, len(ho[0]["heldout"]["acc"])):
            fig.add_scatter(x=[h["step"] for h in ho], y=[h["heldout"]["acc"][k] for h in ho],
                            name=f"heldout top-1, unroll step {k}", row=1, col=2,
                            line={"color": "#d62728", "dash": "dot", "width": 1}, opacity=1 - 0.15 * k)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title, height=420, width=1100, template="plotly_white")
    return fig


def write_curve(history: list[dict], path: Path, title: str = "") -> bool:
    """A small HTML file (plotly.js from its CDN) with the curves of `history`; False, and no file, where plotly
    is not installed (a GPU machine lent bare: history.json holds the same numbers)."""
    try:
        figure = curve_figure(history, title)
    except ImportError:
        return False
    figure.write_html(str(path), include_plotlyjs="cdn", full_html=True)
    return True


PANEL, PAD = 300, 44  # the reliability plot: one square panel per regime, its axes inset by PAD
REGIMES = {"greedy": "T = 0 (greedy)", "sampling": "T = 1 (sampling)"}


def reliability_panel(rows: list[dict], title: str, x0: int) -> list[str]:
    """One square panel: the diagonal, then a dot per score bin (area ~ its node count) at (predicted, observed)."""
    size = PANEL - 2 * PAD
    left, top = x0 + PAD, PAD

    def at(p: float, o: float) -> tuple[float, float]:
        return left + p * size, top + (1 - o) * size

    out = [f'<rect x="{left}" y="{top}" width="{size}" height="{size}" fill="none" stroke="#888"/>',
           f'<line x1="{left}" y1="{top + size}" x2="{left + size}" y2="{top}" stroke="#bbb" stroke-dasharray="4 3"/>',
           f'<text x="{left + size / 2}" y="{top - 12}" text-anchor="middle" font-size="13">{title}</text>',
           f'<text x="{left + size / 2}" y="{top + size + 32}" text-anchor="middle" font-size="11">predicted '
           'acceptance</text>',
           f'<text x="{left - 30}" y="{top + size / 2}" text-anchor="middle" font-size="11" '
           f'transform="rotate(-90 {left - 30} {top + size / 2})">observed on held-out prompts</text>']
    for tick in (0.0, 0.5, 1.0):
        x, y = at(tick, tick)
        out.append(f'<text x="{x}" y="{top + size + 14}" text-anchor="middle" font-size="10">{tick:g}</text>')
        out.append(f'<text x="{left - 6}" y="{y + 3}" text-anchor="end" font-size="10">{tick:g}</text>')
    biggest = max((r["nodes"] for r in rows), default=1)
    for r in rows:
        x, y = at(r["predicted"], r["observed"])
        radius = 2.5 + 7 * math.sqrt(r["nodes"] / biggest)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius:.1f}" fill="#1f77b4" fill-opacity="0.55">'
                   f'<title>{r["nodes"]} nodes: predicted {r["predicted"]:.3f}, observed {r["observed"]:.3f}'
                   '</title></circle>')
    return out


def reliability_svg(reports: dict) -> str:
    """The calibration's reliability plot: per score bin, the acceptance the table predicts against the acceptance
    observed on held-out prompts, one panel per regime. `reports`: what `calibrate` writes to reliability.json
    ({"greedy" | "sampling": {"reliability": [{"predicted", "observed", "nodes", ...}, ...]}})."""
    body = []
    for i, name in enumerate(k for k in REGIMES if k in reports):
        body += reliability_panel(reports[name]["reliability"], REGIMES[name], i * PANEL)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL * max(1, len(reports))}" height="{PANEL + 10}" '
            f'font-family="DejaVu Sans, sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")
