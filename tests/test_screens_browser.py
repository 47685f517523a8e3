"""What each screen shows, in headless Chromium: a plain visit's first screen at 1280 x 800 and 1024 x 768 (the
picture, its draft tree drawn, with the line inviting Run; a phone keeps Run first), the tour's words and the view
they describe apart on a 390 px phone, and labels that stay legible: the draft tree's apart in every frame while
the phases play, the KV cells' shown on a phone.

Every check reads boxes from getBoundingClientRect in the page. Uses the page and browser
tests/conftest.py starts once (same requirements). Screenshots go to artifacts/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, figure, open_accordion, open_page,  # noqa: F401
                              prose, shot)
from test_arrival_browser import RECT_JS, TOUR, TOUR_TEXT_JS, arrived, tour_stops
from test_figures_browser import apart, overlap, parts
from test_workshop_browser import SCROLLED_JS, shown_cycle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
# The tops and bottoms of a view's drawings (Plotly's plot areas), in px of the window.
DRAWN_JS = ("(id) => [...document.querySelectorAll('#' + id + ' .nsewdrag')].map(e => e.getBoundingClientRect())"
            ".filter(b => b.height > 0).map(b => [b.top, b.bottom])")
# The first screen as it settles: the line inviting Run whole in the window, the draft tree's drawing begun in it.
FIRST_SCREEN_JS = """() => { const n = document.getElementById('arrival-note'),
  d = document.querySelector('#draft-tree .nsewdrag');
  if (!n || !d || !n.innerText.trim()) return false;
  const a = n.getBoundingClientRect(), b = d.getBoundingClientRect();
  return a.top >= -1 && a.bottom <= window.innerHeight + 1 && b.top >= a.bottom && b.top < window.innerHeight; }"""


@pytest.mark.parametrize("width,height", [(1280, 800), (1024, 768)])
def test_a_plain_visits_first_screen_shows_the_picture_and_the_line_inviting_run(browser, app_url, width, height):
    """No knobs between the visitor and the picture: on arrival the line inviting Run (its link goes to Run) is in
    the window with the draft tree's drawing under it, a quarter of the window of it at least."""
    tab = open_page(browser, app_url, width, height)
    try:
        arrived(tab)
        figure(tab, "draft-tree")
        try:
            tab.wait_for_function(FIRST_SCREEN_JS, timeout=60_000)
        except Exception:  # noqa: BLE001 (playwright's TimeoutError): say where things are
            where = {i: tab.evaluate("(i) => { const e = document.getElementById(i); return e && "
                                     "e.getBoundingClientRect().top; }", i) for i in ("arrival-note", "draft-tree")}
            pytest.fail(f"the first screen at {width} x {height} does not show the picture: {where}")
        tab.evaluate(SCROLLED_JS)
        note = prose(tab, "arrival-note")
        assert "Run" in note and "recorded run" in note and "no model work" in note, note
        assert tab.locator("#arrival-note a").first.get_attribute("href") == "#run"
        shot(tab, f"s01_first_screen_{width}.png")
        drawn = tab.evaluate(DRAWN_JS, "draft-tree")
        assert drawn and height - drawn[0][0] >= height / 4, drawn
        tab.locator("#arrival-note a").first.click()          # "Press Run": Run in sight
        tab.evaluate(SCROLLED_JS)
        assert tab.evaluate(RECT_JS, "run")["inside"]
    finally:
        tab.close()


def test_a_phone_opens_at_the_top_with_run_in_sight(browser, app_url):
    tab = open_page(browser, app_url, 390, 844)
    try:
        arrived(tab)
        tab.wait_for_function(f"() => ({PROSE_JS})('arrival-note').includes('Run')", timeout=60_000)
        tab.wait_for_timeout(500)
        assert tab.evaluate("() => window.scrollY") == 0 and tab.evaluate(RECT_JS, "run")["inside"]
    finally:
        tab.close()


def test_on_a_phone_the_tours_words_and_the_view_they_describe_share_the_screen_apart(browser, app_url):
    """At 390 x 844 each stop's view sits above the tour's panel, its drawing whole in the window, and the tour's
    text is in the window too: neither covers the other."""
    tab = open_page(browser, app_url, 390, 844)
    try:
        arrived(tab)
        k = shown_cycle(tab)
        open_accordion(tab, TOUR)
        for stop, view in tour_stops(tab, k):
            where = tab.evaluate(RECT_JS, view)
            panel = tab.evaluate(RECT_JS, "tour-section")
            top, bottom = tab.evaluate(TOUR_TEXT_JS)
            shot(tab, f"s02_phone_tour_{stop + 1}.png")
            assert 0 <= top and bottom <= 844 + 1, (stop, top, bottom)
            assert where["bottom"] <= panel["top"] + 1, (stop, where, panel)          # the panel covers nothing
            for drawn_top, drawn_bottom in tab.evaluate(DRAWN_JS, view):
                assert -1 <= drawn_top and drawn_bottom <= panel["top"] + 1, (stop, drawn_top, drawn_bottom, panel)
    finally:
        tab.close()


# Each frame's draft tree as it plays: its title, and its node labels and node markers (text or name, box).
TREE_FRAME_JS = """() => { const gd = document.querySelector('#draft-tree .js-plotly-plot');
  if (!gd || !gd.layout) return null;
  const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const labels = [...gd.querySelectorAll('.textpoint text')].map(e => [e.textContent, box(e)])
                   .filter(([t, b]) => t && b[2] > b[0]);
  const markers = [...gd.querySelectorAll('.scatterlayer .trace')].flatMap(t => {
    const trace = t.__data__[0].trace;
    return /markers/.test(trace.mode) && trace.name !== 'pruned by reranking'
      ? [...t.querySelectorAll('.points .point')].map(m => [trace.name, box(m)]) : []; });
  return [(gd.layout.title || {}).text || '', labels, markers]; }"""


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_the_draft_trees_labels_stay_apart_while_the_phases_play(browser, app_url, width, height):
    """Every frame drawn while "Play phases" runs through a cycle: no two node labels overlap, and no label lies
    on a node other than its own."""
    tab = open_page(browser, app_url, width, height)
    try:
        arrived(tab)
        figure(tab, "draft-tree")
        tab.locator("#draft-tree").scroll_into_view_if_needed()
        tab.click("#play-phases")
        seen: dict[str, tuple] = {}
        for _ in range(200):                                   # up to 20 s: a cycle's frames at 0.9 s each
            frame = tab.evaluate(TREE_FRAME_JS)
            if frame and frame[0] not in seen:
                seen[frame[0]] = frame
                if len(seen) == 2:
                    shot(tab, f"s03_tree_playing_{width}.png")
            if "Play phases" in tab.locator("#play-phases").inner_text() and len(seen) > 2:
                break
            tab.wait_for_timeout(100)
        assert len(seen) >= 4, list(seen)
        for title, labels, markers in seen.values():
            apart(labels, f"node labels of {title!r}")
            for text, label in labels:
                hit = [(name, b) for name, b in markers if overlap(label, b, tol=2)]
                assert len(hit) <= 1, f"{title!r}: node label {text!r} {label} lies on other nodes {hit}"
    finally:
        tab.close()


# The KV cells' labels as drawn: text, font size in px of the window (Plotly shrinks a label to fit its cell), box.
KV_LABELS_JS = """() => [...document.querySelectorAll('#kv-rewind text.bartext')].map(t => {
  const r = t.getBoundingClientRect(), b = t.getBBox(), size = parseFloat(t.style.fontSize || t.getAttribute('font-size'));
  return [t.textContent, size * Math.max(r.width, r.height) / Math.max(b.width, b.height, 1e-6),
          [r.left, r.top, r.right, r.bottom]]; }).filter(([text, size, b]) => text && b[2] > b[0] && b[3] > b[1])"""


CELLS_JS = ("() => [...document.querySelectorAll('#kv-rewind .point path')].map(e => e.getBoundingClientRect())"
            ".filter(b => b.width > 0).map(b => [b.left, b.top, b.right, b.bottom])")


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 800)])
@pytest.mark.parametrize("entry", ["story", "counting"])
def test_the_kv_cells_keep_legible_labels(browser, app_url, width, height, entry):
    """On a phone too, the KV cells of the cycle shown name their tokens: a label in each cell the verify row
    wrote at least, each drawn at 8 px or more, within its cell or clear of every cell, no two overlapping."""
    from eagleviz.app import gallery, navigation

    run = gallery.load(entry)
    tab = open_page(browser, app_url + f"?gallery={entry}", width, height)
    try:
        tab.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
        p = parts(tab, "kv-rewind")
        tab.locator("#kv-rewind").scroll_into_view_if_needed()
        shot(tab, f"s04_kv_{entry}_{width}.png")
        labels = [(t, size, b) for t, size, b in tab.evaluate(KV_LABELS_JS) if not t.startswith("prefix")]
        shown = run.cycles[navigation.instructive_cycle(run)]
        assert len(labels) >= shown.num_tree_tokens, labels
        small = [(t, round(size, 1)) for t, size, _ in labels if size < 8]
        assert not small, small
        apart([(t, b) for t, _, b in labels], "KV cell labels")
        cells = tab.evaluate(CELLS_JS)
        for text, _, label in labels:                          # over its own cell at most, never on another row's
            assert sum(overlap(label, cell) for cell in cells) <= 1, (text, label)
        for text, label, chip in p["chips"]:                 # inside a cell: within it, or hidden (0 px)
            assert label[2] == label[0] or label[0] >= chip[0] - 1 and label[2] <= chip[2] + 1, (text, label, chip)
    finally:
        tab.close()
