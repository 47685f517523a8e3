"""A class in a room, in headless Chromium: the instructor's page and its followers (`eagleviz.app.rooms`). Each
follower shows the instructor's cycle, phase and picked token within a second or two; a reloaded instructor's page
takes its room back; the follow line stays in sight and a mistyped code still shows a picture; the instructor's
tour reaches the class with its words and its view.

Serves its own page (`app_url` below) and uses the browser tests/conftest.py starts once (same requirements:
Debian's chromium and the Python `playwright` package). Screenshots go to artifacts/.
"""

from __future__ import annotations

import pytest

from test_app_browser import PROSE_JS, open_accordion, open_page, shot  # noqa: F401
from test_arrival_browser import RECT_JS, TOUR, VIEWS, pytestmark  # noqa: F401
from test_workshop_browser import shown_cycle, wait_for_cycle


@pytest.fixture(scope="module")
def app_url():
    """A server of its own: a class's rooms and its followers' streams live in the server, and on the page the other
    suites share, run after them, a follower waited over 30 s for its instructor's cycle (the file alone passed)."""
    from servers import embedded_page

    with embedded_page() as url:
        yield url


def room_opened(teacher) -> tuple[int, str]:
    """On an instructor's page showing a recorded run: a room opened. Returns the cycle shown and the room's link."""
    teacher.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
    k = shown_cycle(teacher)
    open_accordion(teacher, "Workshop: recorded runs, a link to these settings, projector")
    teacher.click("#open-room")
    teacher.wait_for_function(f"() => ({PROSE_JS})('room-text').startsWith('Room')", timeout=60_000)
    return k, teacher.locator("#room-text a").first.get_attribute("href")


def read_back(teacher, link: str) -> None:
    """The room's QR code as the page draws it, photographed and decoded (zxing-cpp, the test extra): the full link."""
    import io

    zxing = pytest.importorskip("zxingcpp", reason="zxing-cpp (the test extra) decodes the room's QR code")
    from PIL import Image

    code = teacher.locator("#room-text img")
    code.scroll_into_view_if_needed()
    assert code.evaluate("i => i.naturalWidth") > 0
    read = zxing.read_barcodes(Image.open(io.BytesIO(code.screenshot())))
    assert [r.text for r in read] == [link]


def class_of_one(browser, app_url):
    """An instructor's page on a recorded run with a room opened, and one follower (1024 x 768) showing its cycle:
    (teacher, follower, the cycle, the room's link)."""
    teacher = open_page(browser, app_url + "?gallery=story", 1280, 800)
    k, link = room_opened(teacher)
    follower = open_page(browser, app_url + link, 1024, 768)
    wait_for_cycle(follower, k)
    return teacher, follower, k, link


def test_a_room_follows_the_instructor_live(browser, app_url):
    """One instructor and three followers: each follower's page shows the instructor's cycle, phase and picked
    token within a second or two of the instructor's click, with no model work; a follower who unticks "Follow"
    stays where it is, and ticking it again brings the instructor's picture back."""
    import time

    teacher = open_page(browser, app_url + "?gallery=story", 1280, 800)
    followers = []
    try:
        k, link = room_opened(teacher)
        assert link.startswith("?room=") and len(link) == len("?room=") + 5, link
        shot(teacher, "a10_room_opened.png")
        read_back(teacher, app_url.split("?")[0].rstrip("/") + "/" + link)
        followers = [open_page(browser, app_url + link, *size) for size in ((1280, 800), (1024, 768), (390, 844))]
        for tab in followers:
            wait_for_cycle(tab, k)
            tab.wait_for_function(f"() => ({PROSE_JS})('follow-text').startsWith('Following room')", timeout=60_000)
        shot(followers[2], "a10_room_follower_390.png")
        # the instructor steps: every follower follows, each timed from the click
        teacher.locator("#next").scroll_into_view_if_needed()
        start = time.monotonic()
        teacher.click("#next")
        wait_for_cycle(teacher, k + 1)
        own = time.monotonic() - start          # drawing four figures in a browser that draws four pages at once
        delays = []
        for tab in followers:
            wait_for_cycle(tab, k + 1)
            delays.append(time.monotonic() - start)
        print(f"room: the instructor's page after {own:.2f} s, the followers' after {[round(d, 2) for d in delays]} s")
        # the picture pushed and the followers' own drawing, three pages sharing the CPU with the instructor's
        # (a loose bound: the browser's drawing dominates, and this machine's 2 cores may be busy with other work)
        assert max(delays) - own < 10.0, (own, delays)
        # a picked token and a phase follow too
        teacher.locator("#cycle-tokens .token").nth(1).click()
        for tab in followers:
            tab.wait_for_function(f"() => ({PROSE_JS})('focus-text').startsWith('Selected slot 1')", timeout=60_000)
        # one steps away, then comes back
        away = followers[0]
        away.locator("#follow input[type=checkbox]").click()
        teacher.click("#next")
        for tab in followers[1:]:
            wait_for_cycle(tab, k + 2)
        away.wait_for_timeout(1500)
        assert shown_cycle(away) == k + 1
        away.locator("#follow input[type=checkbox]").click()
        wait_for_cycle(away, k + 2)
        shot(away, "a10_room_follower_back_1280.png")
    finally:
        for tab in [teacher, *followers]:
            tab.close()


def test_a_picture_pushed_to_a_follower_costs_its_page_no_request(browser, app_url):
    """A pushed picture changes a follower's views and fires nothing back: the room line and the tour's words answer
    a page's own moves (`workshop.moved`, chained after each). Fired by the views' `.change`, every picture cost
    every follower two requests, one queued, and rounds of Gradio's status updates (docs/performance.md, 64-65).
    The follower's own step still asks, and steps it away from the room."""
    teacher, follower, k, _ = class_of_one(browser, app_url)
    asked = []
    follower.on("request", lambda r: asked.append(r.url) if r.method == "POST" else None)
    try:
        for step in (1, 2):
            teacher.click("#next")
            wait_for_cycle(follower, k + step)
        follower.wait_for_timeout(1500)   # (an event the picture fired would have been sent by now)
        assert asked == [], asked
        follower.locator("#next").click()
        wait_for_cycle(follower, k + 3)
        follower.wait_for_function(f"() => ({PROSE_JS})('follow-text').includes('stepped away')", timeout=30_000)
        assert asked
    finally:
        teacher.close()
        follower.close()


def test_an_instructors_page_reloaded_takes_its_room_back(browser, app_url):
    """The instructor's page reloads (a closed laptop lid, a stray F5): it takes its room back with the picture the
    class sees, and its next move reaches the follower again; the class's link and code stay the same."""
    teacher, follower, k, link = class_of_one(browser, app_url)
    try:
        teacher.click("#next")
        wait_for_cycle(follower, k + 1)
        kept = teacher.evaluate("() => localStorage.getItem('eagleviz-room')")
        assert kept and kept.startswith(link.split("=")[1] + ":")
        teacher.goto(app_url)                                   # reloaded, at the page's plain address
        teacher.wait_for_function(f"() => ({PROSE_JS})('status').includes('taken back')", timeout=60_000)
        open_accordion(teacher, "Workshop: recorded runs, a link to these settings, projector")
        teacher.wait_for_function(f"() => ({PROSE_JS})('room-text').includes('taken back')", timeout=60_000)
        wait_for_cycle(teacher, k + 1)                          # the room's picture, not the arrival's
        teacher.wait_for_function(f"() => ({PROSE_JS})('arrival-note') === ''", timeout=60_000)
        assert teacher.locator("#room-text a").first.get_attribute("href") == link
        wait_for_cycle(follower, k + 1)
        teacher.locator("#next").scroll_into_view_if_needed()
        teacher.click("#next")
        wait_for_cycle(follower, k + 2)                         # the class follows the reloaded page
        shot(teacher, "a11_room_taken_back.png")
    finally:
        teacher.close()
        follower.close()


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_a_student_sees_the_room_they_are_in_and_a_mistyped_code_shows_a_picture(browser, app_url, width, height):
    """The follow line stays at the window's top wherever the page is scrolled; a code no room has shows a recorded
    run (no empty views) under its warning, in sight."""
    teacher = open_page(browser, app_url + "?gallery=story", 1280, 800)
    tabs = []
    try:
        k, link = room_opened(teacher)
        student = open_page(browser, app_url + link, width, height)
        tabs.append(student)
        wait_for_cycle(student, k)
        student.wait_for_function(f"() => ({RECT_JS})('follow-row').inside", timeout=60_000)
        student.evaluate("() => document.getElementById('kv-rewind').scrollIntoView()")
        student.wait_for_timeout(300)
        assert student.evaluate(RECT_JS, "follow-row")["inside"]          # still there, scrolled down
        shot(student, f"a12_follow_line_{width}.png")
        lost = open_page(browser, app_url + "?room=QQQQQ", width, height)
        tabs.append(lost)
        lost.wait_for_function(f"() => ({PROSE_JS})('follow-text').includes('is not open')", timeout=60_000)
        for view in VIEWS:
            lost.wait_for_function("(id) => document.querySelector('#' + id + ' .js-plotly-plot')?.data?.length > 0",
                                   arg=view, timeout=60_000)
        lost.wait_for_function(f"() => ({RECT_JS})('follow-text').inside", timeout=60_000)
        shot(lost, f"a12_mistyped_room_{width}.png")
    finally:
        for tab in [teacher, *tabs]:
            tab.close()


def test_the_instructors_tour_reaches_the_class_with_its_words_and_view(browser, app_url):
    """The instructor opens the tour and steps it: a follower's tour opens at the same stop, with its words, and
    the stop's view comes into sight there too."""
    teacher, follower, k, _ = class_of_one(browser, app_url)
    try:
        open_accordion(teacher, TOUR)
        teacher.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Draft (cycle {k})')", timeout=60_000)
        follower.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Draft (cycle {k})')", timeout=60_000)
        teacher.click("#tour-next")
        follower.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Verify (cycle {k})')", timeout=60_000)
        below_line = f"() => {{ const t = ({RECT_JS})('attention-mask').top; return t > 60 && t < 200; }}"
        follower.wait_for_function(below_line, timeout=60_000)  # the mask in sight, below the follow line
        follower.wait_for_timeout(1500)                         # and still there once the page has settled
        follower.wait_for_function(below_line, timeout=60_000)
        shot(follower, "a13_follower_tour_1024.png")
    finally:
        teacher.close()
        follower.close()


def test_the_instructor_sees_who_follows_and_the_class_hears_when_its_page_closes(browser, app_url):
    """The instructor's page shows the room's code large, its link written out in full for the projector, and how
    many pages follow; closed, its followers say so (this server's rooms: away after five unheard seconds, the
    default 25) and keep the last picture."""
    teacher, follower, k, link = class_of_one(browser, app_url)
    code = link.split("=")[1]
    try:
        teacher.wait_for_function(f"() => ({PROSE_JS})('room-class') === '1 page follows room {code} now.'",
                                  timeout=60_000)
        anchor = teacher.locator("#room-text a").first
        assert anchor.inner_text() == app_url.rstrip("/") + f"/?room={code}" and anchor.get_attribute("href") == link
        size = teacher.evaluate("() => parseFloat(getComputedStyle(document.querySelector('#room-text p strong'))"
                                ".fontSize)")
        assert size >= 30, size                                 # the code, read off a projector
        shot(teacher, "a14_room_code_1280.png")
        teacher.close()
        follower.wait_for_function(f"() => ({PROSE_JS})('follow-text').includes('not been heard')", timeout=20_000)
        assert shown_cycle(follower) == k                       # the last picture stays
        shot(follower, "a14_instructor_away_1024.png")
    finally:
        teacher.close()
        follower.close()


def test_a_student_who_steps_on_their_own_is_told_where_the_instructor_is_and_rejoins(browser, app_url):
    """A follower clicks Next on its own page: it stops following (the switch unticked), keeps its own picture,
    and its line says which cycle the instructor is on, as the instructor moves; ticking Follow brings the
    instructor's picture back."""
    teacher, follower, k, _ = class_of_one(browser, app_url)
    try:
        follower.locator("#next").scroll_into_view_if_needed()
        follower.click("#next")
        wait_for_cycle(follower, k + 1)
        follower.wait_for_function(f"() => ({PROSE_JS})('follow-text').startsWith('You stepped away')",
                                   timeout=30_000)
        # the switch is the move's own answer; the line above came by the page's stream, and may come first
        follower.wait_for_function("() => !document.querySelector('#follow input[type=checkbox]').checked",
                                   timeout=30_000)
        assert f"on cycle {k}." in follower.evaluate(PROSE_JS, "follow-text")
        teacher.locator("#next").scroll_into_view_if_needed()
        teacher.click("#next")
        wait_for_cycle(teacher, k + 1)
        teacher.click("#next")
        wait_for_cycle(teacher, k + 2)
        follower.wait_for_function(f"() => ({PROSE_JS})('follow-text').includes('on cycle {k + 2}.')", timeout=30_000)
        assert shown_cycle(follower) == k + 1                   # its own picture, not the instructor's
        shot(follower, "a15_stepped_away_1024.png")
        follower.locator("#follow input[type=checkbox]").click()
        wait_for_cycle(follower, k + 2)                         # rejoined: the instructor's picture
        follower.wait_for_function(f"() => ({PROSE_JS})('follow-text').startsWith('Following room')", timeout=30_000)
    finally:
        teacher.close()
        follower.close()
