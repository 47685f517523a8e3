"""What fits where: wrapped text, legend rows, a figure's header (title under Plotly's toolbar, then the band and
the legend) and the margins its axes need, as eagleviz.visuals.fit estimates them. tests/test_figures_browser.py
measures the same things in the drawn page, and that Plotly keeps the margins."""

from __future__ import annotations

import math

import pytest

from eagleviz.visuals.fit import (DETAIL_SIZE, GAP_PX, LEGEND_GAP_PX, LEGEND_ITEM_PX, LEGEND_ROW_PX, LINE_EM, MARGIN_PX,
                                  MODEBAR_PX, PHONE_PX, TITLE_SIZE, Axis, Header, break_words, label_px, legend_names,
                                  legend_rows, margins, text_px, wrap)


def test_text_width_ignores_tags_and_counts_entities_once():
    assert text_px("<b>ab</b><span style='x'>c</span>", 10) == text_px("abc", 10)
    assert text_px("&lt;x&gt;", 10) == 3 * text_px("x", 10)      # an escaped token, as drawn


def test_phrases_are_wrapped_whole_and_each_line_fits():
    phrases = ["68 candidates", "15 verified", "53 pruned", "5 accepted"]
    lines = wrap(phrases, 13, 200)
    assert len(lines) > 1 and all(text_px(line, 13) <= 200 for line in lines)
    assert " ".join(lines) == ", ".join(phrases)                  # broken after a comma, nothing lost
    assert wrap(phrases, 13, 10_000) == [", ".join(phrases)]
    long = "one forward verifies sixteen tokens for the price of one"
    assert all(text_px(line, 15) <= 150 for line in break_words(long, 15, 150)) and len(break_words(long, 15, 150)) > 2


def test_legend_rows_follow_plotlys_rule():
    """One row when every entry fits; else entries in columns as wide as the widest one."""
    names = ["a", "bb", "ccc"]
    assert legend_rows([], 300) == 0
    assert legend_rows(names, 3 * LEGEND_ITEM_PX + text_px("abbccc", 12) + 1) == 1
    widest = LEGEND_ITEM_PX + text_px("ccc", 12)
    assert legend_rows(names, 2 * widest + 1) == 2 and legend_rows(names, widest) == 3
    assert legend_names([dict(name="x"), dict(name="y", showlegend=False), dict(), dict(name="z")]) == ["x", "z"]


@pytest.mark.parametrize("legend", [(), ("accepted", "rejected", "verified, not reached", "pruned by reranking")])
def test_a_header_puts_the_title_under_the_toolbar_then_the_band_then_the_legend(legend):
    header = Header("Cycle 12 \u00b7 draft tree", ("258 candidates", "63 verified", "195 pruned", "3 accepted"),
                    band_px=40, legend=legend, note="colour: cumulative draft prob exp(score)")
    height = 600
    entries = header.entries(height)
    title = entries["title"]
    head, details = header.lines()
    lines = head + details
    assert len(lines) >= 3 and all(text_px(line, TITLE_SIZE) <= PHONE_PX - 20 for line in head)
    assert all(text_px(line, DETAIL_SIZE) <= PHONE_PX - 20 for line in details)
    assert title["text"].count("<br>") == len(lines) - 1
    # Plotly centres the first line a third of an em above the middle anchor: its top is the toolbar's bottom
    first_top = (1 - title["y"]) * height - LINE_EM * TITLE_SIZE / 2 - 0.35 * TITLE_SIZE
    assert first_top == pytest.approx(MODEBAR_PX)
    title_bottom = MODEBAR_PX + LINE_EM * TITLE_SIZE * len(lines)
    assert header.band_top() > title_bottom and header.legend_top() == header.band_top() + 40
    assert entries["margin"]["t"] >= header.legend_top()
    if legend:
        # the top margin holds the legend as a phone wraps it, its foot on the plot: on a phone it fills its room
        foot = (1 - entries["legend"]["y"]) * height
        assert entries["legend"]["yanchor"] == "bottom" and entries["margin"]["t"] == math.ceil(header.px())
        assert foot == pytest.approx(header.px() - LEGEND_GAP_PX)
        assert foot - legend_rows(legend, header.plot_width) * LEGEND_ROW_PX == pytest.approx(header.legend_top())
        assert header.px() > header.px(width=10_000) > header.legend_top()   # a phone wraps the legend more
    else:
        assert "legend" not in entries and header.px() == header.legend_top()


def test_a_label_is_as_wide_as_dejavu_sans_draws_it():
    assert label_px("10", 10) == pytest.approx(2 * 6.36)                    # digits: 0.636 em
    assert label_px("<b>3:x</b>", 13) > label_px("3:x", 13) == label_px("3:x", 13.0)   # bold is wider
    assert label_px("&lt;", 10) == label_px("<", 10) == pytest.approx(8.38)  # escaped as drawn
    assert label_px("\u4e2d", 10) == pytest.approx(12.0)                    # any other character: 1.2 em
    assert label_px("\u2423a", 10) < text_px("\u2423a" * 2, 10)


def test_the_margins_grow_with_what_each_axis_draws():
    assert margins() == dict(l=MARGIN_PX, r=MARGIN_PX, b=MARGIN_PX)
    short, long = Axis(("0", "1")), Axis(("0", "a longer label"))
    assert margins([long])["l"] - margins([short])["l"] == pytest.approx(label_px("a longer label", 14)
                                                                          - label_px("0", 14), abs=1)
    assert margins([short, long]) == margins([long])                       # the widest of a side's axes
    titled = Axis(("0",), titled=True)
    assert margins([titled])["l"] > margins([Axis(("0",), titled=True, standoff=4)])["l"] > margins([short])["l"]
    assert margins([Axis(("0",), ticks=False)])["l"] == margins([short])["l"] - 5
    # under the plot: a flat label's height, a turned one's diagonal; a panel's inset takes its own room off
    flat, turned = Axis(("a long key label",)), Axis(("a long key label",), angle=-60)
    assert margins(bottom=[turned])["b"] > margins(bottom=[flat])["b"]
    assert margins(bottom=[Axis(("a long key label",), angle=-60, inset=40)])["b"] == margins(bottom=[turned])["b"] - 40
    assert margins(bottom=[flat])["r"] > margins(bottom=[Axis(("1",))])["r"] > MARGIN_PX   # half the last label
    # a y axis with a label at its lower end keeps half of it inside the bottom margin
    assert margins([Axis(("0",), ends=True)])["b"] > margins([short])["b"] == MARGIN_PX


def test_a_legend_under_the_plot_takes_its_phone_rows_under_the_axes():
    legend = ("accepted", "rejected", "verified, not reached", "pruned by reranking")
    above, below = Header("Cycle 1", legend=legend), Header("Cycle 1", legend=legend, below=True)
    assert below.px() == below.legend_top() < above.px() and above.foot_px() == 0
    rows = legend_rows(legend, below.plot_width)
    assert below.foot_px() == rows * LEGEND_ROW_PX + LEGEND_GAP_PX > 0
    entries = below.entries(500, dict(l=40, b=30))
    assert entries["margin"] == dict(l=40, r=MARGIN_PX, t=math.ceil(below.legend_top() + GAP_PX),
                                     b=math.ceil(30 + below.foot_px()))
    # its head a gap under the axes' room, its rows (a phone's) down to the figure's foot
    assert entries["legend"]["yanchor"] == "top"
    assert entries["legend"]["y"] * 500 == pytest.approx(entries["margin"]["b"] - 30 - LEGEND_GAP_PX)
