"""A room of laptops, end to end in headless Chromium: a link opens a recorded run at one picture (cycle, phase,
picked token) with no model work, and the page offers the link to the picture it shows; a preset says that
one click restores it.

Uses the server and the browser of tests/test_app_browser.py (same requirements: Debian's chromium and the
Python `playwright` package). Screenshots go to artifacts/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, app_url, browser, open_accordion, open_page, page,  # noqa: F401
                              prose, shot)
from test_workshop_browser import wait_for_cycle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
WORKSHOP = "Workshop: recorded runs, a link to these settings, projector"


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
                           f"({PROSE_JS})('preset-note').includes('Click {first}')", timeout=10_000)
    page.get_by_role("radio", name=first).click()
    page.wait_for_function(f"() => ({PROSE_JS})('preset-note').includes('tau about')", timeout=30_000)
    shot(page, "r02_preset_restores.png")
