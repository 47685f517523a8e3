"""The calibration's reliability plot as a small SVG (no plotting package needed): per score bin, the
acceptance the table predicts against the acceptance observed on held-out prompts, one panel per regime.

    python scripts/reliability_plot.py [runs/calibrate/reliability.json] [--out docs/reliability.svg]

The input is what `python -m eagleviz calibrate` writes beside its journal.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

W, H, PAD = 300, 300, 44


def panel(rows: list[dict], title: str, x0: int) -> list[str]:
    """One square panel: the diagonal, then a dot per bin (area ~ its node count) at (predicted, observed)."""
    size = W - 2 * PAD
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", nargs="?", type=Path, default=Path("runs/calibrate/reliability.json"))
    p.add_argument("--out", type=Path, default=Path("docs/reliability.svg"))
    args = p.parse_args()
    report = json.loads(args.report.read_text())
    titles = {"greedy": "T = 0 (greedy)", "sampling": "T = 1 (sampling)"}
    body = []
    for i, name in enumerate(k for k in ("greedy", "sampling") if k in report):
        body += panel(report[name]["reliability"], titles[name], i * W)
    width = W * max(1, len(report))
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H + 10}" '
           f'font-family="DejaVu Sans, sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n'
           + "\n".join(body) + "\n</svg>\n")
    args.out.write_text(svg)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
