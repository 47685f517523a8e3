"""The page as a workshop meets it, in headless Chromium: a picture on arrival (the first preset's recorded run at
its telling cycle, one line inviting Run), the tour's words on screen beside or below the view they describe at
1280 x 800 and 1024 x 768 (and going on into the next cycle), a room's link opening on its picture, typed knob
values that never give a raw error, Compare's B starting from A, notices that go with what they spoke of, a
projector link that keeps the preset, and race tables whose headers do not wrap.

Uses the page and browser tests/conftest.py starts once (same requirements: Debian's chromium and the
Python `playwright` package). Screenshots go to artifacts/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, RUN_TIMEOUT_MS, figure,  # noqa: F401
                              open_accordion, open_page, page, prose, set_number, shot)
from test_compare_browser import SECTION as COMPARE
from test_room_browser import a_picture
from test_workshop_browser import SCROLLED_JS, shown_cycle, wait_for_cycle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
TOUR = "Guided tour: one cycle in four steps"
VIEWS = ("draft-tree", "attention-mask", "accepted-path", "kv-rewind")
ERRORS_JS = "() => [...document.querySelectorAll('.toast-body')].map(t => t.innerText)"
# Where an element is on the screen: its rectangle, and whether it is wholly inside the window.
RECT_JS = """(id) => { const b = document.getElementById(id).getBoundingClientRect();
  return {top: b.top, bottom: b.bottom, left: b.left, right: b.right,
          inside: b.height > 0 && b.top >= -1 && b.bottom <= window.innerHeight + 1 && b.left >= -1 &&
                  b.right <= window.innerWidth + 1}; }"""
TOUR_TEXT_JS = "() => { const b = document.getElementById('tour').getBoundingClientRect(); return [b.top, b.bottom]; }"


def arrived(page) -> None:
    page.wait_for_function(f"() => ({PROSE_JS})('status').includes('Press')", timeout=60_000)


def test_the_page_opens_on_a_picture_the_first_presets_recorded_run_with_one_line_inviting_run(page):
    from eagleviz.app import gallery, navigation, presets, workshop

    arrived(page)
    entry = workshop.arrival_entry()
    run = gallery.load(entry)
    assert shown_cycle(page) == navigation.instructive_cycle(run) > 0      # its telling cycle, not cycle 0
    status = prose(page, "status")
    assert "recorded run" in status and "no model work" in status and "\u25b6 Run" in status and "\n" not in status
    for view in VIEWS:                                                      # four pictures, no empty frame
        assert figure(page, view)["traces"], view
    assert page.locator("#preset input:checked").get_attribute("value") == presets.PRESETS[0].name
    assert prose(page, "preset-note").startswith("Tree 5 / 4 / 16")
    shot(page, "a01_arrival_1280.png")
    page.click("#status a")                                                 # "the picture below"
    page.evaluate(SCROLLED_JS)
    assert abs(page.evaluate(RECT_JS, "cycle-view")["top"]) < 20 and page.evaluate(RECT_JS, "draft-tree")["top"] < 400
    shot(page, "a01_arrival_picture_1280.png")


def tour_stops(tab, k: int):
    """Steps the open tour through its four stops at cycle k; yields (stop, its view's id) once each is shown and
    the page has stopped scrolling."""
    for stop, view in enumerate(VIEWS):
        if stop:
            tab.click("#tour-next")
        name = ("Draft", "Verify", "Accept", "Rewind")[stop]
        tab.wait_for_function(f"() => ({PROSE_JS})('tour').includes('{name} (cycle {k})')", timeout=60_000)
        tab.evaluate(SCROLLED_JS)
        tab.wait_for_timeout(300)
        yield stop, view


@pytest.mark.parametrize("width,height,projector", [(1280, 800, False), (1024, 768, False), (1024, 768, True)],
                         ids=["1280", "1024", "1024-projector"])
def test_the_tours_words_are_on_screen_with_the_view_they_describe(browser, app_url, width, height, projector):
    """Each stop: the view it talks about wholly in the window, the tour's text in the window too and not over
    the view; past the last stop the tour goes on into the next cycle. Projecting (larger text, the tour below
    the views), a view taller than what the tour leaves is drawn smaller, the tour's words in two lines."""
    tab = open_page(browser, app_url + ("?projector=1" if projector else ""), width, height)
    try:
        arrived(tab)
        k = shown_cycle(tab)
        open_accordion(tab, TOUR)
        tab.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Draft (cycle {k})')", timeout=60_000)
        for stop, view in tour_stops(tab, k):
            where = tab.evaluate(RECT_JS, view)
            top, bottom = tab.evaluate(TOUR_TEXT_JS)
            panel = tab.evaluate(RECT_JS, "tour-section")
            assert where["inside"], (stop, where)
            assert 0 <= top and bottom <= height + 1, (stop, top, bottom)
            apart = panel["left"] >= where["right"] - 1 or panel["top"] >= where["bottom"] - 1
            assert apart, (stop, panel, where)                              # beside or below, never over
            shot(tab, f"a02_tour_{stop + 1}_{width}{'_projector' if projector else ''}.png")
        tab.click("#tour-next")                                             # on into the next cycle
        wait_for_cycle(tab, k + 1)
        tab.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Draft (cycle {k + 1})')", timeout=60_000)
        assert tab.evaluate(RECT_JS, "draft-tree")["inside"]
    finally:
        tab.close()


def test_a_rooms_link_opens_with_its_picture_in_sight(browser, app_url):
    k = a_picture()
    tab = open_page(browser, app_url + f"?gallery=story&cycle={k}&phase=verify", 1280, 800)
    try:
        wait_for_cycle(tab, k)
        tab.wait_for_function("() => { const b = document.getElementById('draft-tree').getBoundingClientRect(); "
                              "return b.top >= -1 && b.top < window.innerHeight / 2; }", timeout=60_000)
        shot(tab, "a03_room_link_1280.png")
    finally:
        tab.close()


def test_typed_knob_values_are_taken_into_range_and_an_empty_box_raises_nothing(page):
    arrived(page)
    set_number(page, "steps", 10000)
    page.wait_for_function("() => document.querySelector('#steps input[type=number]').value === '8'", timeout=60_000)
    page.wait_for_function(f"() => ({PROSE_JS})('typed-note').includes('10000 is above')", timeout=60_000)
    assert "8 is used" in prose(page, "typed-note")                # said, not silent
    set_number(page, "steps", 2.5)                                 # runs as the slider's thumb shows it
    page.wait_for_function("() => document.querySelector('#steps input[type=number]').value === '3'", timeout=60_000)
    page.wait_for_function(f"() => ({PROSE_JS})('typed-note').includes('2.5 is not a whole number: 3 is used')",
                           timeout=60_000)
    shot(page, "a04_typed_fraction.png")
    set_number(page, "steps", 5)                                   # a value that runs as typed: no line
    page.wait_for_function(f"() => ({PROSE_JS})('typed-note') === ''", timeout=60_000)
    set_number(page, "temperature", 7)
    page.wait_for_function("() => document.querySelector('#temperature input[type=number]').value === '1.5'",
                           timeout=60_000)
    for knob in ("topk", "max-new-tokens", "seed"):
        set_number(page, knob, "")
    page.wait_for_timeout(1500)
    assert page.evaluate(ERRORS_JS) == []                      # no "Value 10000 is greater than maximum value 8."
    assert not prose(page, "validity").startswith("**Invalid")
    shot(page, "a04_typed_knobs.png")


def test_compare_b_starts_from_a_and_follows_it_until_moved(page):
    arrived(page)
    open_accordion(page, COMPARE)

    def b_knobs():
        return [page.locator(f"#{k} input[type=number]").first.input_value()
                for k in ("b-steps", "b-topk", "b-draft-tokens", "b-temperature")]

    assert b_knobs() == ["5", "4", "16", "0"]                  # the first preset's tree, as A
    page.get_by_role("radio", name="Story, sampled at T = 0.8").click()
    page.wait_for_function("() => document.querySelector('#b-temperature input[type=number]').value === '0.8'",
                           timeout=60_000)
    assert b_knobs() == ["4", "4", "12", "0.8"]                # the preset's six knobs, copied in the page
    assert prose(page, "b-follows") == "B follows A."
    # B moved by hand at once: it keeps its own, and says so. The copies are made in the page, so none answered
    # late by a busy server can land over the typed value (one did when the server made them; test_ui.py
    # checks that no server function takes part)
    set_number(page, "b-steps", 2)
    page.wait_for_function(f"() => ({PROSE_JS})('b-follows').startsWith('B keeps its own')", timeout=30_000)
    set_number(page, "steps", 6)
    page.wait_for_timeout(2000)
    assert b_knobs()[0] == "2" and page.locator("#steps input[type=number]").first.input_value() == "6"
    page.click("#b-from-a")
    page.wait_for_function("() => document.querySelector('#b-steps input[type=number]').value === '6'",
                           timeout=60_000)
    assert prose(page, "b-follows") == "B follows A."
    shot(page, "a05_compare_b_from_a.png")


def test_a_picked_preset_shows_its_own_recorded_run(page):
    """Picking another preset replaces the picture with that preset's recording (its tau in the status line and in
    the run's summary), never the last preset's under the new one's settings."""
    from eagleviz.app import gallery, presets, workshop

    arrived(page)
    story = next(p for p in presets.PRESETS if p.temperature > 0)
    entry = gallery.entry(workshop.preset_entry(story.name))
    tau = entry.description.split(":")[0]                                   # "tau 1.78"
    assert tau not in prose(page, "status")
    page.get_by_role("radio", name=story.name).click()
    page.wait_for_function(f"() => ({PROSE_JS})('status').includes('{tau}')", timeout=60_000)
    assert "no model work" in prose(page, "status")
    assert page.locator("#prompt textarea").input_value() == story.prompt
    page.wait_for_function(f"() => ({PROSE_JS})('arrival-note').includes({entry.title!r})",   # the line above the
                           timeout=60_000)                                                 # views says whose
    for view in VIEWS:
        assert figure(page, view)["traces"], view
    shot(page, "a07_preset_story_picture.png")


def test_a_preset_clears_the_notices_of_what_it_replaced(page):
    arrived(page)
    page.fill("#prompt textarea", "x" * 20_000)
    page.wait_for_function(f"() => ({PROSE_JS})('prompt-note').includes('20,000')", timeout=60_000)
    page.click("#run")
    page.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('\\u26a0')", timeout=60_000)
    page.get_by_role("radio", name="Code").click()
    page.wait_for_function("() => document.querySelector('#prompt textarea').value.startsWith('Write a Python')",
                           timeout=60_000)
    page.wait_for_function(f"() => ({PROSE_JS})('prompt-note') === '' && "
                           f"!({PROSE_JS})('status').startsWith('\\u26a0')", timeout=60_000)


def test_an_old_race_goes_under_a_new_preset_its_verdict_in_sight_and_its_headers_unwrapped(page):
    arrived(page)
    page.click("#race")                                        # the recorded run against plain decoding
    page.wait_for_function("() => document.querySelectorAll('#race-result th').length > 0",
                           timeout=RUN_TIMEOUT_MS)
    heights = page.evaluate("() => [...document.querySelectorAll('#race-result th')].map(t => "
                            "[t.innerText, t.getBoundingClientRect().height])")
    one_line = min(h for _, h in heights)
    assert all(h < 1.5 * one_line for _, h in heights), heights   # "tokens", "speedup" on one line each
    # each number and tree on one line ("3.00", "\u2264 5 / 4 / 16"): one text line is as tall as the cell's text
    lines = page.evaluate("() => [...document.querySelectorAll('#race-result td:not(:first-child)')].map(t => { "
                          "const r = document.createRange(); r.selectNodeContents(t); "
                          "return [t.innerText, new Set([...r.getClientRects()].map(q => Math.round(q.top))).size]; })")
    assert all(n <= 1 for _, n in lines), lines
    # under the button, on the first screen: the verdict, then the table's plain decoding row
    plain_bottom = page.evaluate("() => [...document.querySelectorAll('#race-result tr')].find(r => "
                                 "r.innerText.startsWith('plain decoding')).getBoundingClientRect().bottom")
    verdict_top = page.evaluate("() => [...document.querySelectorAll('#race-result p')].find(p => "
                                "p.innerText.startsWith('This run against')).getBoundingClientRect().top")
    assert 0 <= verdict_top < plain_bottom <= 800, (verdict_top, plain_bottom)
    shot(page, "a06_race_first_screen.png")
    page.locator("#race-result").scroll_into_view_if_needed()
    shot(page, "a06_race_headers.png")
    page.get_by_role("radio", name="Code").click()
    page.wait_for_function(f"() => ({PROSE_JS})('race-result') === ''", timeout=60_000)


def test_a_projector_link_keeps_the_preset_and_its_lesson(browser, app_url):
    from eagleviz.app import presets

    tab = open_page(browser, app_url + "?projector=1", 1024, 768)
    try:
        arrived(tab)
        tab.wait_for_function("() => document.body.classList.contains('ev-projector')", timeout=60_000)
        assert tab.locator("#preset input:checked").get_attribute("value") == presets.PRESETS[0].name
        assert prose(tab, "preset-note").startswith("Tree 5 / 4 / 16")
        shot(tab, "a07_projector_link_1024.png")
    finally:
        tab.close()


# Per chip of a figure's chip traces: its label's width against its rectangle's (both in the drawing's pixels).
CHIP_FIT_JS = """(id) => [...document.querySelectorAll('#' + id + ' g.point')].map(g => {
  const bar = g.querySelector('path'), text = g.querySelector('text.bartext');
  if (!bar || !text || !text.textContent) return null;
  const b = bar.getBoundingClientRect(), t = text.getBoundingClientRect();
  return [text.textContent, t.width, b.width];
}).filter(x => x)"""


@pytest.mark.parametrize("width,height", [(1280, 800), (1024, 768), (390, 844)])
def test_word_tokens_keep_their_labels_in_the_mask_the_kv_cache_and_the_path(browser, app_url, width, height):
    """Every row of a 16 x 16 mask is named (the accepted rows in bold among them); on a wide enough panel the
    KV cells of word tokens and of the root show their first letters; no path chip's label spills out of it."""
    from eagleviz.app import gallery, navigation

    counting, story = gallery.load("counting"), gallery.load("story")
    tab = open_page(browser, app_url + "?gallery=counting", width, height)
    try:
        tab.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
        figure(tab, "attention-mask")
        tab.locator("#attention-mask").scroll_into_view_if_needed()
        shot(tab, f"a08_mask_{width}.png")
        rows = counting.cycles[navigation.instructive_cycle(counting)].num_tree_tokens
        assert tab.evaluate("() => document.querySelectorAll('#attention-mask .ytick text').length") == rows == 16
    finally:
        tab.close()
    tab = open_page(browser, app_url + "?gallery=story", width, height)
    try:
        tab.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
        figure(tab, "accepted-path")
        tab.locator("#accepted-path").scroll_into_view_if_needed()
        spills = [c for c in tab.evaluate(CHIP_FIT_JS, "accepted-path") if c[1] > c[2] + 1]
        assert not spills, spills                                    # "\u2713 \u2423upon", "none left" on a phone
        shot(tab, f"a08_path_{width}.png")
        if width < 1000:
            return    # a phone's KV labels, written over the cells: tests/test_screens_browser.py
        figure(tab, "kv-rewind")
        tab.locator("#kv-rewind").scroll_into_view_if_needed()
        labels = tab.evaluate("() => [...document.querySelectorAll('#kv-rewind text.bartext')].filter(t => "
                              "t.getBoundingClientRect().width > 0 && !t.textContent.startsWith('prefix'))"
                              ".map(t => t.textContent)")
        shown = story.cycles[navigation.instructive_cycle(story)]
        assert len(labels) >= 2 * shown.num_tree_tokens, labels      # verify and drafting rows, root and words
        shot(tab, f"a08_kv_{width}.png")
    finally:
        tab.close()


# Where node k of a tree trace is on the screen, and its item in the cycle's token list.
POINT_JS = """([name, k]) => { const gd = document.querySelector('#draft-tree .js-plotly-plot');
  const t = gd.data.find(d => d.name === name), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const r = gd.getBoundingClientRect();
  return [r.left + xa._offset + xa.l2p(t.x[k]), r.top + ya._offset + ya.l2p(t.y[k]), t.customdata[k]]; }"""
MASK_FOCUS_JS = ("() => (document.querySelector('#attention-mask .js-plotly-plot').layout.shapes || [])"
                 ".filter(s => s.line && s.line.dash === 'dot').length")


def point_at(page, name: str, k: int) -> int:
    """Moves the pointer onto node k of the tree's trace `name`, once the page has stopped scrolling; its item of
    the token list."""
    page.locator("#draft-tree").scroll_into_view_if_needed()
    page.evaluate(SCROLLED_JS)
    x, y, item = page.evaluate(POINT_JS, [name, k])
    page.mouse.move(x - 30, y - 30)
    page.mouse.move(x, y, steps=4)
    return item


def test_pointing_at_a_tree_node_picks_it_in_every_view(browser, app_url):
    """Hover links between the views: a node pointed at is picked as a click in the token list picks it (its
    mask row and column outlined, its path chips and KV slot), and again after a step to another cycle."""
    tab = open_page(browser, app_url + "?gallery=counting", 1280, 800)
    try:
        tab.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
        k = shown_cycle(tab)
        for name in ("rejected", "accepted"):
            item = point_at(tab, name, 0)
            tab.wait_for_function(f"() => ({PROSE_JS})('focus-text').startsWith('Selected slot {item}')",
                                  timeout=60_000)
            tab.wait_for_function(f"() => ({MASK_FOCUS_JS})() === 2", timeout=60_000)
        shot(tab, "a09_hover_picks_1280.png")
        tab.click("#next")
        wait_for_cycle(tab, k + 1)
        item = point_at(tab, "verified, not reached", 0)
        tab.wait_for_function(f"() => ({PROSE_JS})('focus-text').startsWith('Selected slot {item}')", timeout=60_000)
    finally:
        tab.close()
