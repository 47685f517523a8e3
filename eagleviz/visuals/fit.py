"""What fits where: every figure is drawn on the server without knowing the screen, and Plotly stretches it to
the width of its panel, so each is laid out for the narrowest panel it meets (a 390-px phone) and only gains
room on wider ones. Heights are the figures' own: they grow with what they show.

Sizes are estimated from character counts with DejaVu Sans' average advance (`CHAR_EM`), which errs wide, so
that text sized here fits in the browser (tests/test_figures_browser.py measures the drawn page).

The top of a figure (`Header`), from its top edge down:
    toolbar band   Plotly's toolbar (shown on hover, on a tap on a phone) spans a phone's width: nothing under it
    title          a head line, then detail phrases wrapped to the narrowest width
    band           room a figure fills itself (the draft tree's colour bar)
    legend         horizontal: on a narrow screen it wraps to more rows and Plotly moves the plot down under it
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

MODEBAR_PX = 32           # the toolbar's band: 26 px of buttons from 2 px below the top, and a gap
PHONE_PX = 320            # a figure's width on a 390-px phone, between the page's margins
CHAR_EM = 0.56            # average advance of DejaVu Sans in em, measured on titles and tokens: ~0.50, capitals more
LINE_EM = 1.3             # line height of multi-line text in em
TITLE_SIZE = 15
DETAIL_SIZE = 13
LEGEND_SIZE = 12
LEGEND_ROW_PX = 21        # one row of a horizontal legend at LEGEND_SIZE
LEGEND_ITEM_PX = 50       # a legend entry besides its text: the symbol, the gaps
LEGEND_GAP_PX = 12        # between the legend and the plot Plotly moves under it
GAP_PX = 8
_TAG = re.compile(r"<[^>]+>")


def text_px(text: str, size: float) -> float:
    """Estimated width in px of one line of Plotly text (its HTML-like tags dropped) at font `size`."""
    return len(html.unescape(_TAG.sub("", text))) * size * CHAR_EM


def chars_for(px: float, size: float) -> int:
    """How many characters fit in `px` at font `size` (at least 1)."""
    return max(1, int(px / (size * CHAR_EM)))


def wrap(phrases: Sequence[str], size: float, width: float, sep: str = ", ") -> list[str]:
    """Phrases packed greedily into lines no wider than `width` px, each phrase kept whole (a line that goes
    on ends with the separator's mark); a phrase wider than a line is broken between words."""
    mark = sep.rstrip()
    budget = width - text_px(mark, size)
    lines: list[str] = []
    for phrase in phrases:
        if lines and text_px(lines[-1] + sep + phrase, size) <= budget:
            lines[-1] += sep + phrase
            continue
        if lines:
            lines[-1] += mark
        lines += break_words(phrase, size, budget)
    return lines


def break_words(phrase: str, size: float, width: float) -> list[str]:
    """The phrase as it is, or, wider than `width`, broken between words into lines that fit (a word wider than
    `width` keeps a line of its own)."""
    if text_px(phrase, size) <= width:
        return [phrase]
    pieces: list[str] = []
    for word in phrase.split(" "):
        if pieces and text_px(pieces[-1] + " " + word, size) <= width:
            pieces[-1] += " " + word
        else:
            pieces.append(word)
    return pieces


def legend_rows(names: Sequence[str], width: float, size: float = LEGEND_SIZE) -> int:
    """Rows a horizontal Plotly legend takes in a plot `width` px wide: one row if every entry fits, else as
    many entries per row as the widest one allows (Plotly then aligns them in columns)."""
    if not names:
        return 0
    items = [LEGEND_ITEM_PX + text_px(n, size) for n in names]
    if sum(items) <= width:
        return 1
    return math.ceil(len(items) / max(1, int(width // max(items))))


def legend_names(traces: Sequence[dict]) -> list[str]:
    """The legend entries the traces make: the named ones not hidden from the legend."""
    return [t["name"] for t in traces if t.get("name") and t.get("showlegend", True)]


@dataclass(frozen=True)
class Header:
    """A figure's title and what sits between it and the plot (module docstring), in px from the top.

    `plot_width`: the plot's width on a phone, where the legend wraps the most (the figure less its axis
    labels and margins)."""

    head: str
    details: tuple[str, ...] = ()
    band_px: float = 0.0
    legend: tuple[str, ...] = ()
    plot_width: float = PHONE_PX - 60
    note: str = ""            # a last line of its own, about the band (what a colour bar's colours mean)

    def lines(self) -> tuple[list[str], list[str]]:
        """The head line (broken between words where it is wider than a phone) and the wrapped detail lines."""
        width = PHONE_PX - 20
        head = break_words(self.head, TITLE_SIZE, width) if self.head else []
        return head, wrap(self.details, DETAIL_SIZE, width) + (break_words(self.note, DETAIL_SIZE, width)
                                                               if self.note else [])

    def text(self) -> str:
        head, details = self.lines()
        return "<br>".join(head + [f"<span style='font-size:{DETAIL_SIZE}px'>{line}</span>" for line in details])

    def title_px(self) -> float:
        """Plotly spaces a title's lines by its own font size, smaller spans included."""
        head, details = self.lines()
        return LINE_EM * TITLE_SIZE * (len(head) + len(details))

    def band_top(self) -> float:
        return MODEBAR_PX + self.title_px() + (GAP_PX if self.head or self.details else 0)

    def legend_top(self) -> float:
        return self.band_top() + self.band_px

    def px(self, width: float | None = None) -> float:
        """Where the plot starts with the legend wrapped for a plot `width` px wide (None: a phone's)."""
        rows = legend_rows(self.legend, self.plot_width if width is None else width)
        return self.legend_top() + rows * LEGEND_ROW_PX + (LEGEND_GAP_PX if rows else 0)

    def entries(self, height: float) -> dict:
        """Layout entries: the title (its block centred where it belongs: Plotly centres a multi-line title on
        its anchor), the legend and the top margin, for a figure `height` px tall."""
        # Anchored in the middle, Plotly centres a title's first line a few px above its anchor (its glyphs'
        # middle, MID_SHIFT = 0.35 em); the other lines follow below it.
        first = MODEBAR_PX + LINE_EM * TITLE_SIZE / 2 + 0.35 * TITLE_SIZE
        out = {"title": dict(text=self.text(), x=0.01, xanchor="left", yref="container", y=1 - first / height,
                             yanchor="middle", font=dict(size=TITLE_SIZE)),
               "margin": dict(l=10, r=10, t=round(self.legend_top() + GAP_PX), b=10)}
        if self.legend:
            out["legend"] = dict(orientation="h", xref="container", x=0, xanchor="left", yref="container",
                                 y=1 - self.legend_top() / height, yanchor="top", font=dict(size=LEGEND_SIZE))
        return out
