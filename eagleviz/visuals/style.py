"""Shared look of every figure: a colour-blind-safe palette (Okabe and Ito, 2008), fonts sized for a
projector, token labels that show whitespace, and the placeholder figure shown when there is nothing to draw.

Status is never encoded by colour alone: shapes, line styles and text repeat it.
"""

from __future__ import annotations

import html
import re

import plotly.graph_objects as go
from plotly.colors import get_colorscale

from eagleviz.visuals.fit import FONT_PX, PHONE_PX, Header, wrap

# Okabe-Ito colours, named by the role they play everywhere in the app.
ACCEPTED = "#0072B2"     # blue: a draft token the target agreed with
BONUS = "#E69F00"        # orange: the token the target supplies itself
REJECTED = "#D55E00"     # vermillion: a draft token the target refused
VISIBLE = "#56B4E9"      # sky blue: attention allowed
PREFIX = "#7FA7C9"       # muted blue: the committed prefix
NEUTRAL = "#999999"      # grey: verified but never reached
PRUNED = "#CCCCCC"       # light grey: cut by reranking, or a discarded cache slot
HIDDEN = "#F2F2F2"       # near white: attention not allowed
INK = "#222222"          # text and the root
FOCUS = "#CC79A7"        # reddish purple: the token selected on the page, outlined the same way in every view
LOOKUP = "#009E73"       # bluish green: a candidate that came from prompt lookup (the context's own text)
PROB_SCALE = get_colorscale("Cividis")   # sequential, designed for colour-vision deficiency (as Plotly spells it out)

CHIPS = "chips"          # the name of a trace of labelled rectangles (`chips`), kept out of the legend
# Chip labels shrunk to fit share one size in a figure, and go (their hover stays) where that would be below 8 px.
CHIP_TEXT = dict(minsize=8, mode="hide")
FONT = dict(family="DejaVu Sans, Arial, sans-serif", size=FONT_PX, color=INK)
HOVER = dict(font=dict(family=FONT["family"], size=14), bgcolor="white", bordercolor=INK)
# Tick labels are never hidden for crossing the figure's edge (`ticklabeloverflow`): the margins are sized for them on
# the server (`fit.margins`), and Plotly's default ("hide past div" on a numeric axis) measured every label's box on
# every redraw: ~3-5% of the four views' redraw in Chromium (`python scripts/follower_costs.py redraw`, entry 71).
_AXIS = dict(showline=True, linecolor=INK, ticks="outside", showgrid=False, zeroline=False, automargin=True,
             ticklabeloverflow="allow")
# A small template built once: Plotly's named templates are deep-copied on every use (~25 ms per figure).
TEMPLATE = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", font=FONT, hoverlabel=HOVER, xaxis=_AXIS, yaxis=_AXIS,
    colorway=[ACCEPTED, BONUS, "#009E73", "#CC79A7", VISIBLE, REJECTED, NEUTRAL, INK]))


# A tokenizer's control marker (`<|im_end|>`, `</s>`, `<eos>`) is a token of its own: shown in words, in brackets
# (cut to a label's few characters, `<|im_e` said nothing). The end-of-text markers all read "[end]".
_MARKER = re.compile(r"<\|([A-Za-z_]+)\|>|</?(s|eos|bos|pad|unk)>")
END_MARKERS = {"im_end", "endoftext", "end_of_text", "eos", "eot_id", "s"}


def token_label(text: str, limit: int = 12) -> str:
    """A token as plain display text: spaces, newlines and tabs made visible, a control marker in words, long
    tokens cut."""
    marker = _MARKER.fullmatch(text)
    if marker:
        name = marker.group(1) or marker.group(2)
        return "[end]" if name.lower() in END_MARKERS and text != "<s>" else f"[{name[: max(limit - 2, 1)]}]"
    shown = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5").replace("\r", "")
    if not shown:
        shown = "\u2205"
    if len(shown) > limit:
        shown = shown[: limit - 1] + "\u2026"
    return shown


def token_html(text: str, limit: int = 12) -> str:
    """`token_label` escaped for Plotly's HTML-like text rendering."""
    return html.escape(token_label(text, limit), quote=False)


def prob_note(prob: float | None) -> str:
    """" (p = 0.123)" after a target token in a hover, or nothing where the cycle did not compute the probability
    (a greedy plain step reads the argmax alone)."""
    return "" if prob is None else f" (p = {prob:.3f})"


def figure(data: list[dict] | None = None, layout: dict | None = None) -> go.Figure:
    """A Plotly figure of plain dicts, as the browser receives them: Plotly's validation of every property is
    skipped (most of the time drawing a cycle took: stepping between cycles went from 25 to 9 ms of server
    time, `scripts/measure_ui_latency.py`). The dicts are written in
    Plotly's own spelling (a title is {"text": ...}, a colour scale is spelled out), which
    tests/test_visuals.py checks: each figure the page draws, validated, is the same data."""
    return go.Figure(data=data, layout=layout, _validate=False)


def layout(title: str | Header, height: int, sides: dict | None = None, **extra) -> dict:
    """Common layout as a plain dict: the small template, the title, legend and top margin placed by `fit.Header`
    (a plain string: a title alone), the other margins `sides` (`fit.margins` of the figure's axes; None: compact
    ones); `extra` entries are added (or replace these).

    Figures are assembled from dicts by `figure`; the graph-object update methods re-walk the whole figure
    on every call and would cost more than the 200 ms a step between cycles may take."""
    header = title if isinstance(title, Header) else Header(title)
    return {"template": TEMPLATE, "height": height} | header.entries(height, sides) | extra


def empty_figure(message: str, height: int = 320) -> go.Figure:
    """A figure that says why nothing is drawn (no run yet, a plain-decoding trace, ...)."""
    lines = wrap(html.escape(message).split("; "), 16, PHONE_PX - 20, sep="; ")   # clauses kept whole if they fit
    note = dict(text="<br>".join(lines), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                font=dict(size=16, color=NEUTRAL))
    return figure(layout=layout("", height, annotations=[note], xaxis=dict(visible=False),
                                yaxis=dict(visible=False)))


def chips(cells: list[dict], half_width: float = 0.45, half_height: float = 0.42, axes: tuple[str, str] = ("x", "y"),
          text_size: int = 14, above: bool = False) -> list[dict]:
    """Labelled rectangles in data coordinates (they scale with the panel, unlike markers), as one bar trace.

    Each cell: x, y (its centre), fill, text, font (text colour), hover. Each bar spans x +- half_width and
    y +- half_height (an explicit offset: bar traces sharing axes are not grouped side by side). A label wider
    or taller than its rectangle is shrunk by Plotly to fit it (text inside a bar), so no label spills out of
    its chip however narrow the panel; the hover keeps the whole token. `above`: each label is written upwards
    over its chip instead, at its own size (for chips a few pixels wide on a phone, where a label inside would
    shrink away); its colour is then INK."""
    xref, yref = axes
    text = dict(textposition="outside", textangle=-90, constraintext="none", cliponaxis=False,
                textfont=dict(color=INK, size=text_size)) if above else dict(
        textposition="inside", insidetextanchor="middle", textangle=0,
        textfont=dict(color=[c["font"] for c in cells], size=text_size))
    return [dict(
        type="bar", x=[c["x"] for c in cells], y=[2 * half_height] * len(cells),
        base=[c["y"] - half_height for c in cells],
        width=2 * half_width, offset=-half_width, xaxis=xref, yaxis=yref, name=CHIPS, showlegend=False,
        marker=dict(color=[c["fill"] for c in cells], line=dict(color=INK, width=1)),
        text=[c["text"] for c in cells], hovertext=[c["hover"] for c in cells], hoverinfo="text", **text)]


def chip_centres(trace) -> list[tuple[float, float]]:
    """(x, y) of each chip of a `chips` trace (a dict or a Plotly trace)."""
    get = trace.get if isinstance(trace, dict) else trace.__getitem__
    return [(x, round(b + h / 2, 9)) for x, b, h in zip(get("x"), get("base"), get("y"))]


def legend_swatches(entries: list[tuple[str, str]], symbol: str = "square") -> list[dict]:
    """Legend-only traces (no data) for colours that appear in shapes, heatmaps or polygons."""
    return [dict(type="scatter", x=[None], y=[None], mode="markers", name=name,
                 marker=dict(symbol=symbol, size=14, color=colour, line=dict(color=INK, width=1)))
            for name, colour in entries]


def focus_box(x: float, y: float, half_width: float, half_height: float, axes: tuple[str, str] = ("x", "y")) -> dict:
    """The outline drawn around the selected token in the chip figures (path, KV)."""
    x0, x1, y0, y1 = x - half_width, x + half_width, y - half_height, y + half_height
    return dict(type="scatter", x=[x0, x1, x1, x0, x0], y=[y0, y0, y1, y1, y0], xaxis=axes[0], yaxis=axes[1],
                mode="lines", line=dict(color=FOCUS, width=4), hoverinfo="skip", showlegend=False)
