"""The whole workshop in one sitting, in headless Chromium at 1280 x 800, as an instructor runs a class: the
arrival's picture, a preset, Run, the cycle slider to cycle k, a phase, a picked token, Race, Compare, the tour;
a live room that three followers join (they show the instructor's live run and follow a step); then a recorded
run stepped to cycle k, the page's link to that picture opened in a second tab, which shows cycle k at the
same phase with the same token picked. Each step's result is read from the page, as the class sees it.

Uses the page and browser tests/conftest.py starts once (same requirements: Debian's chromium and the
Python `playwright` package). Screenshots go to artifacts/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, RUN_TIMEOUT_MS, open_accordion,  # noqa: F401
                              open_page, page, prose, run_and_wait, set_knob, set_number, shot)
from test_compare_browser import SECTION as COMPARE
from test_room_browser import WORKSHOP, open_picture
from test_workshop_browser import shown_cycle, wait_for_cycle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
TOUR = "Guided tour: one cycle in four steps"


def phase_is(page, name: str) -> None:
    page.wait_for_function(f"() => ({PROSE_JS})('phase-text').startsWith('{name}')", timeout=30_000)


def picked(page, slot: int) -> None:
    page.wait_for_function(f"() => ({PROSE_JS})('focus-text').startsWith('Selected slot {slot}')", timeout=30_000)


def test_a_class_from_preset_to_a_shared_picture(page, browser, app_url):
    # arrival: a picture before any Run (the first preset's recorded run), and one line inviting Run
    assert "Press \u25b6 Run" in prose(page, "status") and "no model work" in prose(page, "status")
    page.wait_for_function("() => (document.querySelector('#draft-tree .js-plotly-plot')?.data || []).length > 0",
                           timeout=30_000)
    shot(page, "flow00_arrival.png")
    # a preset, then Run
    page.get_by_role("radio", name="Counting (high acceptance)").click()
    page.wait_for_function("() => document.querySelector('#prompt textarea').value.startsWith('List the numbers')",
                           timeout=30_000)
    set_number(page, "max-new-tokens", 32)
    run_and_wait(page)
    cycles = int(page.locator("#cycle-slider input[type=range]").get_attribute("max")) + 1
    assert cycles >= 3, cycles
    k = 2 if shown_cycle(page) != 2 else 1
    # the slider to cycle k, the verify phase, slot 1 of its tokens
    set_number(page, "cycle-slider", k)
    wait_for_cycle(page, k)
    open_accordion(page, TOUR)
    page.click("#tour-next")  # the tour's second stop: verify, on the cycle shown
    page.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Verify (cycle {k})')", timeout=60_000)
    phase_is(page, "Verify")
    page.locator("#cycle-tokens .token").nth(1).click()
    picked(page, 1)
    assert shown_cycle(page) == k
    shot(page, "flow01_cycle_k_verify_slot_1.png")
    # Race: this run against plain decoding, beside its button
    page.click("#race")
    page.wait_for_function(f"() => ({PROSE_JS})('race-result').includes('This run against plain decoding')",
                           timeout=RUN_TIMEOUT_MS)
    # Compare: the page's knobs against a chain of 3 draft tokens
    open_accordion(page, COMPARE)
    set_knob(page, "b-steps", 3)
    set_knob(page, "b-topk", 1)
    set_knob(page, "b-draft-tokens", 4)
    page.locator("#compare").scroll_into_view_if_needed()
    page.click("#compare")
    page.wait_for_function(f"() => /\\u26a0|\\ntokens\\s/.test(({PROSE_JS})('compare-result'))",
                           timeout=RUN_TIMEOUT_MS)
    compared = prose(page, "compare-result")
    assert "\u26a0" not in compared and "B: tree 3 / 1 / 4" in compared, compared
    assert re.search(r"tokens/s\s+[\d.]+\s+[\d.]+", compared.replace("\t", " ")), compared
    # the tour goes on from where it was, on the same cycle
    page.click("#tour-next")
    page.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Accept (cycle {k})')", timeout=60_000)
    phase_is(page, "Accept")
    # a live run's picture cannot be linked (it would have to be made again), and the page says so
    open_accordion(page, WORKSHOP)
    page.click("#link")
    page.wait_for_function(f"() => ({PROSE_JS})('link-text') !== ''", timeout=30_000)
    assert "Link to this picture" not in prose(page, "link-text")
    # a live room: three followers show the instructor's live run at the instructor's cycle, and follow a step
    page.click("#open-room")
    page.wait_for_function(f"() => ({PROSE_JS})('room-text').startsWith('Room')", timeout=60_000)
    room = page.locator("#room-text a").first.get_attribute("href")
    followers = [open_page(browser, app_url + room, *size) for size in ((1280, 800), (1024, 768), (390, 844))]
    try:
        for tab in followers:
            wait_for_cycle(tab, k)
            phase_is(tab, "Accept")
        page.locator("#prev").click()
        for tab in followers:
            wait_for_cycle(tab, k - 1)
        shot(followers[1], "flow01_room_follower_1024.png")
    finally:
        for tab in followers:
            tab.close()
    page.locator("#next").click()
    wait_for_cycle(page, k)

    # the room: a recorded run at cycle k, verify, slot 1; its link opens the same picture in another tab
    first = open_picture(browser, app_url, "?gallery=story")
    second = None
    try:
        runs = int(first.locator("#cycle-slider input[type=range]").get_attribute("max")) + 1
        k = min(k, runs - 1)
        set_number(first, "cycle-slider", k)
        wait_for_cycle(first, k)
        open_accordion(first, TOUR)
        first.click("#tour-next")
        phase_is(first, "Verify")
        first.locator("#cycle-tokens .token").nth(1).click()
        picked(first, 1)
        open_accordion(first, WORKSHOP)
        first.click("#link")
        first.wait_for_function(f"() => ({PROSE_JS})('link-text').includes('Link to this picture')", timeout=30_000)
        href = first.locator("#link-text a", has_text="Link to this picture").get_attribute("href")
        assert f"cycle={k}" in href and "gallery=story" in href, href
        second = open_picture(browser, app_url, href)
        wait_for_cycle(second, k)
        phase_is(second, "Verify")
        picked(second, 1)
        second.locator("#draft-tree").scroll_into_view_if_needed()
        shot(second, "flow02_the_shared_picture_in_a_second_tab.png")
    finally:
        first.close()
        if second is not None:
            second.close()
