"""A room of laptops, end to end in headless Chromium: a link opens a recorded run at one picture (cycle, phase,
picked token) with no model work, and the page offers the link to the picture it shows; a preset says that
one click restores it; the tour brings each view it talks about into sight, steps with the arrow keys, and
shows one view at a time, full width, in slides mode; the words a learner meets link to a glossary, and the
page's icons draw without an emoji font.

Uses the page and browser tests/conftest.py starts once (same requirements: Debian's chromium and the
Python `playwright` package). Screenshots go to artifacts/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, open_accordion, open_page, page,  # noqa: F401
                              prose, shot)
from test_workshop_browser import wait_for_cycle, wait_in_sight

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
WORKSHOP = "Workshop: recorded runs, a link to these settings, projector"


# A view in sight: its top as IN_SIGHT_JS, or, a view taller than the room above the tour's panel (a phone), the top
# of its drawing (its first plot area), its title and legend then above the window.
VIEW_IN_SIGHT_JS = ("([id, px]) => { const e = document.getElementById(id), d = e.querySelector('.nsewdrag'); "
                    "const b = e.getBoundingClientRect(), t = d && b.top < -1 ? d.getBoundingClientRect().top : b.top; "
                    "return b.height > 0 && t >= -1 && t + Math.min(px, b.bottom - t) <= window.innerHeight + 1; }")


def a_picture():
    """A cycle of the story's recorded run other than the one it opens on, with a few tree tokens."""
    from eagleviz.app import gallery, navigation

    run = gallery.load("story")
    return next(k for k, c in enumerate(run.cycles) if k != navigation.instructive_cycle(run) and c.num_tree_tokens > 2)


def open_picture(browser, url: str, query: str, width: int = 1280, height: int = 800):
    tab = open_page(browser, url + query, width, height)
    tab.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
    return tab


def test_a_link_opens_a_recorded_runs_picture_and_the_page_offers_the_link_to_what_it_shows(browser, app_url):
    k = a_picture()
    query = f"?gallery=story&cycle={k}&phase=verify&token=2"
    first = open_picture(browser, app_url, query)
    try:
        wait_for_cycle(first, k)
        first.wait_for_function(f"() => ({PROSE_JS})('phase-text').startsWith('Verify') && "
                                f"({PROSE_JS})('focus-text').startsWith('Selected')", timeout=30_000)
        assert prose(first, "link-note") == ""
        first.locator("#draft-tree").scroll_into_view_if_needed()
        shot(first, "r01_picture_link_1280.png")
        # the page offers the link to what it shows, and it opens the same picture in a second tab
        open_accordion(first, WORKSHOP)
        first.click("#link")
        first.wait_for_function(f"() => ({PROSE_JS})('link-text').includes('Link to this picture')", timeout=30_000)
        href = first.locator("#link-text a", has_text="Link to this picture").get_attribute("href")
        assert href == query, href
        first.locator("#link-text").scroll_into_view_if_needed()
        shot(first, "r01_link_offered.png")
    finally:
        first.close()
    phone = open_picture(browser, app_url, query, 390, 844)
    try:
        wait_for_cycle(phone, k)
        phone.locator("#draft-tree").scroll_into_view_if_needed()
        shot(phone, "r01_picture_link_390.png")
    finally:
        phone.close()
    # what the run lacks is said in one line each, and the rest is shown
    bad = open_picture(browser, app_url, "?gallery=story&cycle=999&phase=commit&token=2")
    try:
        bad.wait_for_function(f"() => ({PROSE_JS})('link-note') !== ''", timeout=30_000)
        notes = prose(bad, "link-note").splitlines()
        notes = [n for n in notes if n.strip()]
        assert len(notes) == 2 and "cycle=999" in notes[1] and "phase='commit'" in notes[0], notes
    finally:
        bad.close()


def test_a_preset_says_one_click_restores_it(page):
    from eagleviz.app import presets

    assert presets.RESTORE in page.locator("#preset").inner_text()
    page.locator("#steps input[type=number]").first.fill("3")
    page.locator("#steps input[type=number]").first.press("Enter")
    first = presets.PRESETS[0].name
    page.wait_for_function(f"() => ({PROSE_JS})('preset-note').includes('Click **') || "
                           f"({PROSE_JS})('preset-note').includes('Click {first}')", timeout=60_000)
    page.get_by_role("radio", name=first).click()
    page.wait_for_function(f"() => ({PROSE_JS})('preset-note').includes('tau about')", timeout=30_000)
    shot(page, "r02_preset_restores.png")


SHOWN_VIEWS_JS = ("() => ['draft-tree', 'attention-mask', 'accepted-path', 'kv-rewind'].filter(id => "
                  "getComputedStyle(document.getElementById(id)).display !== 'none')")
WIDTH_JS = "(id) => document.querySelector('#' + id + ' .js-plotly-plot')._fullLayout.width"


def tour_says(page, words: str) -> None:
    page.wait_for_function(f"(w) => ({PROSE_JS})('tour').includes(w)", arg=words, timeout=30_000)


def arrow(page, key: str) -> None:
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
    page.keyboard.press(key)


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_the_tour_shows_each_view_it_talks_about_steps_with_the_arrows_and_makes_slides(browser, app_url, width,
                                                                                         height):
    from eagleviz.app import gallery, navigation
    from eagleviz.visuals.phases import frames

    tab = open_picture(browser, app_url, "?gallery=story", width, height)
    try:
        k = int(tab.evaluate(f"() => /Cycle (\\d+)/.exec(({PROSE_JS})('cycle-caption'))[1]"))
        # an arrow key from the top of the page: the tour opens at its first stop, the tree at its drafted phase
        # (no path, no bonus drawn yet); the next steps, and its view comes into sight
        arrow(tab, "ArrowRight")
        tour_says(tab, f"Draft (cycle {k})")
        run = gallery.load("story")
        draft = navigation.tour_frame(run.cycles[k], 0)
        tab.wait_for_function("(v) => document.querySelector('#phase-slider input[type=range]').value === v",
                              arg=str(draft), timeout=30_000)
        assert draft < len(frames(run.cycles[k])) - 1
        shot(tab, f"r03_tour_draft_{width}.png")
        arrow(tab, "ArrowRight")
        tour_says(tab, f"Verify (cycle {k})")
        wait_in_sight(tab, "attention-mask", px=200, sight=VIEW_IN_SIGHT_JS)
        arrow(tab, "ArrowRight")
        tour_says(tab, f"Accept (cycle {k})")
        wait_in_sight(tab, "accepted-path", px=200, sight=VIEW_IN_SIGHT_JS)
        # not while typing: the arrows move the caret in the prompt
        tab.locator("#prompt textarea").focus()
        tab.keyboard.press("ArrowLeft")
        tab.wait_for_timeout(500)
        tour_says(tab, f"Accept (cycle {k})")
        arrow(tab, "ArrowLeft")
        tour_says(tab, f"Verify (cycle {k})")
        # slides: the tour's view alone, the page's width, and the arrows go from one to the next
        narrow = tab.evaluate(WIDTH_JS, "attention-mask")
        tab.locator("#slides input[type=checkbox]").click()
        tab.wait_for_function(f"() => ({SHOWN_VIEWS_JS})().join() === 'attention-mask'", timeout=60_000)
        # the page's width: beside the open tour where it is a column (a wide window), else the window's
        page_width = tab.evaluate("() => document.getElementById('cycle-view').getBoundingClientRect().width")
        wide = min(narrow * 1.8, page_width - 60)
        try:
            tab.wait_for_function(f"(w) => ({WIDTH_JS})('attention-mask') >= w", arg=wide, timeout=60_000)
        finally:
            shot(tab, f"r03_slides_verify_{width}.png")
        assert tab.evaluate(WIDTH_JS, "attention-mask") >= wide, (narrow, tab.evaluate(WIDTH_JS, "attention-mask"))
        tab.keyboard.press("ArrowRight")   # the focus still on Slides' box: the arrows go on stepping
        tour_says(tab, f"Accept (cycle {k})")
        tab.wait_for_function(f"() => ({SHOWN_VIEWS_JS})().join() === 'accepted-path'", timeout=60_000)
        wait_in_sight(tab, "accepted-path", px=200, sight=VIEW_IN_SIGHT_JS)
        shot(tab, f"r03_slides_accept_{width}.png")
        tab.locator("#slides input[type=checkbox]").click()
        tab.wait_for_function(f"() => ({SHOWN_VIEWS_JS})().length === 4", timeout=60_000)
    finally:
        tab.close()


def test_shift_and_the_arrows_step_the_cycle_and_p_plays_it(browser, app_url):
    """A projected page driven from the keyboard: Shift with the right or left arrow steps the cycle (not while the
    prompt takes the keys), P starts the cycles playing and P again pauses them."""
    from test_workshop_browser import wait_for_cycle

    tab = open_picture(browser, app_url, "?gallery=story")
    try:
        k = int(tab.evaluate(f"() => /Cycle (\\d+)/.exec(({PROSE_JS})('cycle-caption'))[1]"))
        arrow(tab, "Shift+ArrowRight")
        wait_for_cycle(tab, k + 1)
        arrow(tab, "Shift+ArrowLeft")
        wait_for_cycle(tab, k)
        tab.locator("#prompt textarea").focus()
        tab.keyboard.press("Shift+ArrowRight")   # selects text in the prompt, nothing else
        tab.wait_for_timeout(1000)
        wait_for_cycle(tab, k)
        arrow(tab, "p")
        tab.wait_for_function("() => document.getElementById('play').innerText.includes('Pause')", timeout=30_000)
        arrow(tab, "p")
        tab.wait_for_function("() => document.getElementById('play').innerText.includes('Play cycles')",
                              timeout=30_000)
    finally:
        tab.close()


# The entry's paragraph: lit, and its top inside the window.
ENTRY_SHOWN_JS = ("(id) => { const a = document.getElementById(id), p = a && a.closest('p'); if (!p) return false; "
                  "const b = p.getBoundingClientRect(); return p.classList.contains('ev-glossary-hit') && b.height > 0 "
                  "&& b.top >= 0 && b.bottom <= window.innerHeight; }")


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_the_words_a_learner_meets_link_to_the_glossary(browser, app_url, width, height):
    tab = open_picture(browser, app_url, "?gallery=story", width, height)
    try:
        pages = len(tab.context.pages)
        # from the intro at the top of the page: the glossary opens at the bottom, its entry in sight and lit
        word = tab.locator("#intro a[href='#g-kv']")
        word.scroll_into_view_if_needed()
        before = tab.evaluate("() => window.scrollY")
        word.click()
        tab.wait_for_function(ENTRY_SHOWN_JS, arg="g-kv", timeout=60_000)
        assert "keys and values" in tab.locator("#glossary-text").inner_text()
        assert len(tab.context.pages) == pages                    # no new tab for a word
        shot(tab, f"r04_glossary_entry_{width}.png")
        # ... and a way back to the word, thousands of pixels up
        assert tab.evaluate("() => window.scrollY") > before + 1000
        tab.locator("#glossary-back").click()
        tab.wait_for_function("(y) => Math.abs(window.scrollY - y) < 8", arg=before, timeout=30_000)
        assert tab.locator("#glossary-back").is_hidden()
        # from the explanations of a cycle: their first use of a term
        open_accordion(tab, "Explain these four views, with this cycle's numbers")
        link = tab.locator("#explain a[href^='#g-']").first
        target = link.get_attribute("href")[1:]
        link.scroll_into_view_if_needed()
        link.click()
        tab.wait_for_function(ENTRY_SHOWN_JS, arg=target, timeout=60_000)
        # the play button's pause sign is a character DejaVu Sans has, not an emoji
        tab.locator("#play").click()
        tab.wait_for_function("() => document.querySelector('#play').innerText.includes('Pause')", timeout=60_000)
        assert "\u275a" in tab.locator("#play").inner_text()
        tab.locator("#play").click()
    finally:
        tab.close()


@pytest.mark.slow
def test_the_room_latency_measurement_times_every_follower_of_every_click():
    """scripts/measure_ui_latency.py --room: HTTP followers speaking the page's protocol and a Chromium follower
    each receive the instructor's step, and every series has one time per follower and click. In a process of
    its own: the script starts its own Playwright, which cannot run beside this file's (its event loop)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = ("import importlib.util, json; from eagleviz.decoding.load import load_engine; "
            "spec = importlib.util.spec_from_file_location('m', 'scripts/measure_ui_latency.py'); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(json.dumps(m.room_latency(load_engine, followers=3, pages=1, clicks=2)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    times = json.loads(done.stdout.strip().splitlines()[-1])
    assert [len(times[k]) for k in ("server+network", "end to end", "browser paint")] == [6, 2, 2], times
    assert all(t > 0 for k in ("server+network", "end to end", "browser paint") for t in times[k]), times
