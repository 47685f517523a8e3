"""What fits where: wrapped text, legend rows, and a figure's header (title under Plotly's toolbar, then the
band and the legend), as eagleviz.visuals.fit estimates them. tests/test_figures_browser.py measures the same
things in the drawn page."""

from __future__ import annotations

import pytest

from eagleviz.visuals.fit import (DETAIL_SIZE, LEGEND_ITEM_PX, LINE_EM, MODEBAR_PX, PHONE_PX, TITLE_SIZE, Header,
                                  break_words, legend_names, legend_rows, text_px, wrap)


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
        assert (1 - entries["legend"]["y"]) * height == pytest.approx(header.legend_top())
        assert header.px() > header.px(width=10_000) > header.legend_top()   # a phone wraps the legend more
    else:
        assert "legend" not in entries and header.px() == header.legend_top()
