"""Compare two settings, end to end in headless Chromium: B set to another tree, Compare pressed; the acceptance
histogram, the acceptance rate per position and the table come back with both settings, and their numbers
agree with each other and with the server's own run of setting A (the page's Run, exported). The section is
looked at, and measured to fit, at 1280 x 800, on a 390 px phone and at 1024 x 768 in projector mode.

Uses the page and browser tests/conftest.py starts once (same requirements). Screenshots go to artifacts/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, RUN_TIMEOUT_MS,  # noqa: F401
                              export, open_accordion, page, prose, run_and_wait, set_knob, set_number, shot)
from test_workshop_browser import LONG_PROMPT, MISFITS_JS, set_projector

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]

SECTION = "Compare two settings on this prompt"
# The live Plotly data of a figure: per trace its name, x, y and customdata (the histogram's cycle counts).
DATA_JS = """(id) => {
  const gd = document.querySelector('#' + id + ' .js-plotly-plot');
  if (!gd || !gd.data || !gd.data.length) return null;
  return {title: (gd.layout.title || {}).text || '',
          traces: gd.data.map(t => ({name: t.name || '', x: Array.from(t.x || []), y: Array.from(t.y || []),
                                     counts: Array.from(t.customdata || [])}))};
}"""
ROW = re.compile(r"^\s*(tokens/s|\u03c4, tokens per cycle|cycles|tokens)\s+([\d.]+)\s+([\d.]+)\s*$", re.MULTILINE)
KEYS = {"tokens/s": "tokens_per_s", "\u03c4, tokens per cycle": "accept_length", "cycles": "cycles", "tokens": "tokens"}


def figure_data(page, elem_id: str) -> dict:
    page.wait_for_function(f"(id) => ({DATA_JS})(id) !== null", arg=elem_id, timeout=30_000)
    return page.evaluate(DATA_JS, elem_id)


def table(text: str) -> dict[str, dict]:
    """The table's columns, read as the visitor sees them (tab-separated cells): per setting, its numbers."""
    out: dict[str, dict] = {"A": {}, "B": {}}
    for name, a, b in ROW.findall(text.replace("\t", " ")):
        kind = int if name in ("cycles", "tokens") else float
        out["A"][KEYS[name]], out["B"][KEYS[name]] = kind(a), kind(b)
    return out


def knob(page, elem_id: str) -> int:
    return int(page.locator(f"#{elem_id} input[type=number]").first.input_value())


def misfits(page) -> list[str]:
    return [m for m in page.evaluate(MISFITS_JS) if m.startswith("compare-")]


def test_compare_two_trees_side_by_side(page, tmp_path):
    set_number(page, "max-new-tokens", 24)
    run_and_wait(page)                                  # setting A, run by the page's Run
    trace, _ = export(page, tmp_path, "a.json")
    a_lengths = [c["accept_length"] for c in trace["cycles"]]
    a_tree = f"tree {knob(page, 'steps')} / {knob(page, 'topk')} / {knob(page, 'draft-tokens')} (steps / topk / draft"

    open_accordion(page, SECTION)
    set_knob(page, "b-steps", 3)
    set_knob(page, "b-topk", 1)
    set_knob(page, "b-draft-tokens", 4)                 # B: a chain of 3 draft tokens, the head only
    page.locator("#compare").scroll_into_view_if_needed()
    page.click("#compare")
    page.wait_for_function(f"() => ({PROSE_JS})('compare-result').startsWith('Comparing')", timeout=60_000)
    page.wait_for_function(f"() => /\\u26a0|\\ntokens\\s/.test(({PROSE_JS})('compare-result'))",
                           timeout=RUN_TIMEOUT_MS)
    text = prose(page, "compare-result")
    assert "\u26a0" not in text, text
    assert f"A: {a_tree}" in text and "B: tree 3 / 1 / 4 (steps / topk / draft tokens), fixed, EAGLE head" in text, text
    for words in ("Tokens per cycle", "Acceptance histogram", "Acceptance rate per position"):
        assert words in text
    rows = table(text)
    assert all(len(rows[name]) == 4 for name in "AB"), text

    hist, pos = figure_data(page, "compare-histogram"), figure_data(page, "compare-positions")
    assert "histogram" in hist["title"].lower() and "per position" in pos["title"].lower()
    assert [t["name"] for t in hist["traces"]] == ["A", "B"] and [t["name"] for t in pos["traces"]] == ["A", "B"]
    for bars, line in zip(hist["traces"], pos["traces"]):
        row = rows[bars["name"]]
        counts = dict(zip(bars["x"], bars["counts"]))    # tokens per cycle -> cycles
        assert sum(counts.values()) == row["cycles"]
        assert sum(x * n for x, n in counts.items()) / row["cycles"] == pytest.approx(row["accept_length"], abs=0.006)
        assert bars["y"] == pytest.approx([n / row["cycles"] for n in bars["counts"]])
        # position k accepted in the cycles that committed more than k tokens
        assert line["y"] == pytest.approx([sum(n for x, n in counts.items() if x > k) / row["cycles"]
                                           for k in line["x"]])
        assert row["tokens_per_s"] > 0 and row["cycles"] <= row["tokens"] <= 24
    assert len(pos["traces"][1]["x"]) == 3                  # the chain verifies 3 draft positions
    # Setting A at T = 0 is the page's own run again: the same cycles, accepting the same
    a_counts = dict(zip(hist["traces"][0]["x"], hist["traces"][0]["counts"]))
    assert {x: n for x, n in a_counts.items() if n} == {n + 1: a_lengths.count(n) for n in set(a_lengths)}
    assert rows["A"]["tokens"] == len(trace["output"])

    page.locator("#compare-section").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    assert misfits(page) == []
    page.locator("#compare-result").scroll_into_view_if_needed()
    shot(page, "c01_compare_1280.png")
    page.locator("#compare-histogram").scroll_into_view_if_needed()
    shot(page, "c02_compare_figures_1280.png")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(1500)                             # the figures redraw to the new width
    assert misfits(page) == [], "390 px"
    wide = page.evaluate("() => { const e = document.querySelector('#compare-result');"
                         " return e.scrollWidth - e.clientWidth; }")
    assert wide <= 1, wide
    page.locator("#compare-result").scroll_into_view_if_needed()
    shot(page, "c03_compare_390.png")
    page.locator("#compare-histogram").scroll_into_view_if_needed()
    shot(page, "c04_compare_figures_390.png")
    page.locator("#compare-positions").scroll_into_view_if_needed()
    shot(page, "c05_compare_positions_390.png")
    page.set_viewport_size({"width": 1024, "height": 768})   # a classroom projector, large text
    page.locator("#workshop").scroll_into_view_if_needed()
    open_accordion(page, "Workshop")
    set_projector(page, True)
    page.wait_for_timeout(1500)
    assert misfits(page) == [], "1024 x 768, projector"
    page.locator("#compare-histogram").scroll_into_view_if_needed()
    shot(page, "c06_compare_projector_1024.png")


def test_compare_during_a_run_is_refused_in_plain_words(page):
    open_accordion(page, SECTION)
    page.fill("#prompt textarea", LONG_PROMPT)
    set_number(page, "max-new-tokens", 512)
    page.click("#run")
    page.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Running\\u2026 cycle')", timeout=RUN_TIMEOUT_MS)
    page.locator("#compare").scroll_into_view_if_needed()
    page.click("#compare")
    page.wait_for_function(f"() => ({PROSE_JS})('compare-result').includes('still going')", timeout=30_000)
    assert prose(page, "status").startswith("Running")              # refused at once, not after the run
    assert "|" not in prose(page, "compare-result")                 # no table of runs never made
    # cleanup (tests/test_app_browser.py holds Stop to its minute): the run's end, however it comes. This run is
    # short (the default tree), so Stop often lands as it ends: the page must say Done, not "Stopping", then.
    page.click("#stop")
    try:
        page.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Done')", timeout=RUN_TIMEOUT_MS)
    except Exception as exc:  # noqa: BLE001 (playwright's TimeoutError): say what the page said instead
        raise AssertionError(f"the run never said Done; its status: {prose(page, 'status')!r}") from exc
