"""What fits where: every figure is drawn on the server without knowing the screen, and Plotly stretches it to
the width of its panel, so each is laid out for the narrowest panel it meets (a 390-px phone) and only gains
room on wider ones. Heights are the figures' own: they grow with what they show.

Sizes are estimated from character counts with DejaVu Sans' average advance (`CHAR_EM`), which errs wide, so
that text sized here fits in the browser (tests/test_figures_browser.py measures the drawn page); an axis's tick
labels, whose widths set a margin, from DejaVu Sans' own advances (`label_px`).

The top of a figure (`Header`), from its top edge down:
    toolbar band   Plotly's toolbar (shown on hover, on a tap on a phone) spans a phone's width: nothing under it
    title          a head line, then detail phrases wrapped to the narrowest width
    band           room a figure fills itself (the draft tree's colour bar)
    legend         horizontal, its foot on the plot: on a phone it wraps to its most rows and fills the room the
                   top margin holds for it; a wider screen's fewer rows leave room above them. Or under the plot
                   and its axes (`Header.below`: the draft tree, the mask, the KV), its spare rows at the foot
The other sides (`margins`) hold what each `Axis` draws there: its tick labels, ticks and title.

Plotly widens a margin that a legend or an axis's labels need (automargin) by laying the figure out, measuring it
and laying it out again: margins as wide as these, which Plotly keeps (tests/test_figures_browser.py draws the views
of recorded cycles at the page's three widths), have it lay each figure out once (docs/performance.md entry 62).
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
LEGEND_GAP_PX = 12        # between the legend and the plot (under the plot: the axes' room)
GAP_PX = 8
# Plotly's room for an axis, measured in Chromium on the app's figures (`Axis`)
LABEL_PAD_PX = 10.6       # between an axis's tick labels and the figure's edge, on top of what follows
TICK_PX = 5               # an outside tick (Plotly's ticklen)
LABEL_EM = 1.03           # a tick label's height
TITLE_EM = 1.08           # an axis title's thickness, beyond its standoff
STANDOFF_PX = 10          # a title's standoff where the figure sets none (Plotly's own is ~8-10 px)
SLACK_PX = 3              # over every estimate: a px of rounding is a second layout
FONT_PX = 14              # the figures' font size (style.FONT's) and so the default tick and title size
MARGIN_PX = 10            # a side no axis needs
_TAG = re.compile(r"<[^>]+>")

# DejaVu Sans' advances in thousandths of an em, regular and bold, of the characters tick labels show (token labels:
# ASCII, the marks `style.token_label` writes, a few symbols), measured in Chromium's canvas
# (tests/test_figures_browser.py measures them again). Arial, the page's fallback, is narrower: a margin sized here is
# never too small for it.
_GLYPHS = (' !"#$%&\'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVW'
           'XYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~␣↵⇥…∅●◆×·“”’→←≤≥τé')
_REGULAR = (
    318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636, 636, 636, 636, 636,
    636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656,
    557, 863, 748, 787, 603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500, 500, 613,
    635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818,
    592, 592, 525, 636, 337, 636, 838, 635, 838, 838, 1000, 871, 873, 769, 838, 318, 518, 518, 318, 838, 838, 838,
    838, 602, 615)
_BOLD = (
    348, 456, 521, 838, 696, 1002, 872, 306, 457, 457, 523, 838, 380, 415, 380, 365, 696, 696, 696, 696, 696, 696,
    696, 696, 696, 696, 400, 400, 838, 838, 838, 580, 1000, 774, 762, 734, 830, 683, 683, 821, 837, 372, 372, 775,
    637, 995, 837, 850, 733, 850, 770, 720, 682, 812, 774, 1103, 771, 724, 725, 457, 365, 457, 838, 500, 500, 675,
    716, 593, 716, 678, 435, 716, 712, 343, 343, 665, 343, 1042, 712, 687, 716, 716, 493, 595, 478, 712, 652, 924,
    645, 652, 582, 712, 365, 712, 838, 716, 838, 838, 1000, 856, 873, 769, 838, 380, 657, 657, 380, 838, 838, 838,
    838, 638, 678)
OTHER_EM = 1.2            # any other character (CJK, emoji, a fallback font's symbols): wider than most glyphs
_ADVANCE = {False: dict(zip(_GLYPHS, _REGULAR)), True: dict(zip(_GLYPHS, _BOLD))}


def text_px(text: str, size: float) -> float:
    """Estimated width in px of one line of Plotly text (its HTML-like tags dropped) at font `size`."""
    return len(html.unescape(_TAG.sub("", text))) * size * CHAR_EM


def label_px(text: str, size: float) -> float:
    """Width in px of a one-line label at font `size` as DejaVu Sans draws it (bold where the label is wrapped in
    <b>): what an axis's tick labels take beside the plot (`Axis`)."""
    advance = _ADVANCE["<b>" in text]
    return sum(advance.get(ch, 1000 * OTHER_EM) for ch in html.unescape(_TAG.sub("", text))) * size / 1000


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
    below: bool = False       # the legend under the plot and its axes (the picture first, under the title)

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

    def legend_px(self, width: float | None = None) -> float:
        """The legend's room, wrapped for a plot `width` px wide (None: a phone's), and its gap to the plot."""
        rows = legend_rows(self.legend, self.plot_width if width is None else width)
        return rows * LEGEND_ROW_PX + (LEGEND_GAP_PX if rows else 0)

    def px(self, width: float | None = None) -> float:
        """Where the plot starts with the legend wrapped for a plot `width` px wide (None: a phone's)."""
        return self.legend_top() + (0 if self.below else self.legend_px(width))

    def foot_px(self) -> float:
        """The room a legend under the plot takes at the figure's foot (a phone's rows), under the axes."""
        return self.legend_px() if self.below else 0.0

    def entries(self, height: float, sides: dict | None = None) -> dict:
        """Layout entries: the title (its block centred where it belongs: Plotly centres a multi-line title on
        its anchor), the legend and the margins, for a figure `height` px tall whose axes need `sides` (l, r, b:
        `margins`). The margin on the legend's side holds it as a phone wraps it (its most rows), so Plotly never
        moves the plot away from it: a legend pushing the plot makes Plotly lay the figure out twice."""
        # Anchored in the middle, Plotly centres a title's first line a few px above its anchor (its glyphs'
        # middle, MID_SHIFT = 0.35 em); the other lines follow below it.
        first = MODEBAR_PX + LINE_EM * TITLE_SIZE / 2 + 0.35 * TITLE_SIZE
        top, axes = self.px(), dict(l=MARGIN_PX, r=MARGIN_PX, b=MARGIN_PX) | (sides or {})
        out = {"title": dict(text=self.text(), x=0.01, xanchor="left", yref="container", y=1 - first / height,
                             yanchor="middle", font=dict(size=TITLE_SIZE)),
               "margin": axes | dict(t=math.ceil(max(top, self.legend_top() + GAP_PX)),
                                     b=math.ceil(axes["b"] + self.foot_px()))}
        if self.legend:
            # on top, its foot on the plot; under it, its head under the axes: a wider screen's fewer rows leave
            # the room on the far side of them, away from the plot
            place = (dict(y=(self.foot_px() - LEGEND_GAP_PX) / height, yanchor="top") if self.below else
                     dict(y=1 - (top - LEGEND_GAP_PX) / height, yanchor="bottom"))
            out["legend"] = dict(orientation="h", xref="container", x=0, xanchor="left", yref="container",
                                 font=dict(size=LEGEND_SIZE)) | place
        return out


@dataclass(frozen=True)
class Axis:
    """What an axis puts beside its plot: tick labels (`labels`, at font `size`, turned `angle` degrees as Plotly's
    tickangle), outside ticks or none, a title (`titled`; `standoff`: its distance from the labels, None: Plotly's).
    `inset`: px between the axis and the figure's margin (a panel above the bottom of a figure of several panels).
    `ends`: a y axis with a label at its lower end, whose half height Plotly keeps inside the figure's bottom margin
    (measured from the figure's foot, wherever the axis's panel is)."""

    labels: tuple[str, ...] = ()
    size: float = FONT_PX
    angle: float = 0.0
    ticks: bool = True
    standoff: float | None = None
    titled: bool = False
    inset: float = 0.0
    ends: bool = False

    def depth(self, across: bool) -> float:
        """px from the plot's edge to the far side of the labels and title: `across` for an x axis (labels stacked
        below it), else for a y axis (labels side by side with it)."""
        turn = math.radians(self.angle if across else self.angle + 90)
        wide = max((label_px(t, self.size) for t in self.labels), default=0.0)
        tall = LABEL_EM * self.size
        labels = abs(wide * math.sin(turn)) + abs(tall * math.cos(turn)) if self.labels else 0.0
        title = (STANDOFF_PX if self.standoff is None else self.standoff) + TITLE_EM * FONT_PX if self.titled else 0
        return LABEL_PAD_PX + (TICK_PX if self.ticks else 0) + labels + title + SLACK_PX - self.inset

    def overhang(self) -> float:
        """px an x axis's last label reaches past the plot's right edge (its half width, or a turned label's
        corner)."""
        if not self.labels:
            return 0.0
        if self.angle == 0:
            return label_px(self.labels[-1], self.size) / 2 + LABEL_PAD_PX + SLACK_PX
        return LABEL_EM * self.size * abs(math.sin(math.radians(self.angle))) / 2 + 7 + SLACK_PX

    def foot(self) -> float:
        """px a y axis needs under the plot: its lowest label's lower half where it sits at the axis's end."""
        return LABEL_EM * self.size / 2 + LABEL_PAD_PX + SLACK_PX if self.ends else 0.0


def margins(left: Sequence[Axis] = (), bottom: Sequence[Axis] = ()) -> dict:
    """The left, right and bottom margins (px) that a figure's axes need: the widest of each side's axes, never
    under MARGIN_PX. With `Header.entries`' top, a figure Plotly lays out once."""
    return dict(l=round(max([MARGIN_PX] + [a.depth(False) for a in left])),
                r=round(max([MARGIN_PX] + [a.overhang() for a in bottom])),
                b=round(max([MARGIN_PX] + [a.depth(True) for a in bottom] + [a.foot() for a in left])))
