"""The workshop, end to end in headless Chromium, as an instructor tries it before a class: every control does
what it says. The cycle slider typed, clicked and dragged; the queue notice counting only runs that exist;
results where the visitor looks (the views brought into sight after a run and an output click, the race
answered beside its button, the tour naming the cycle shown); figures that fit their layout, normal or
projector, at 1280 x 800 and 1024 x 768; Race refusing an unfinished run; presets that let go once edited and
come back on a click, and an imported trace bringing back its prompt and knobs; labels that say what they
measure (speedups against plain decoding, launch flags from the first screen, a prompt over the limit said);
plain words instead of the machinery's; a run opening on its most instructive cycle.

Uses the page and browser tests/conftest.py starts once (same requirements: Debian's chromium and the
Python `playwright` package). Screenshots go to artifacts/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, PROSE_JS, RUN_TIMEOUT_MS, export, figure,  # noqa: F401
                              open_accordion, open_page, page, playwright_sync, prose, run_and_wait, set_number,
                              shot)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]

# Null-safe: the draft tree's plot is drawn a moment after the run's status says Done.
TREE_TITLE_JS = ("() => { const g = document.querySelector('#draft-tree .js-plotly-plot'); "
                 "return (g && g.layout && g.layout.title && g.layout.title.text) || ''; }")


def shown_cycle(page) -> int:
    """The cycle the four views show, from the caption and the draft tree's title (they must agree)."""
    page.wait_for_function(f"() => {{ const t = /Cycle (\\d+)/.exec(({TREE_TITLE_JS})()), "
                           f"c = /Cycle (\\d+)/.exec(({PROSE_JS})('cycle-caption')); "
                           f"return t && c && t[1] === c[1]; }}", timeout=30_000)
    caption = re.search(r"Cycle (\d+)", prose(page, "cycle-caption"))
    title = re.search(r"Cycle (\d+)", page.evaluate(TREE_TITLE_JS))
    assert caption and title, (prose(page, "cycle-caption"), page.evaluate(TREE_TITLE_JS))
    assert caption.group(1) == title.group(1)
    return int(caption.group(1))


def wait_for_cycle(page, k: int) -> None:
    page.wait_for_function(f"() => ({TREE_TITLE_JS})().includes('Cycle {k} ') && "
                           f"({PROSE_JS})('cycle-caption').includes('Cycle {k} of')", timeout=30_000)


# A run that outlasts the test's clicks (512 tokens, about 13 s alone on this machine's 2 cores).
LONG_PROMPT = "Write a 2000-word essay about the history of Rome, with many sections."


def slider_value(page) -> int:
    return int(page.locator("#cycle-slider input[type=number]").first.input_value())


# ------------------------------------------------------------------ 1. the cycle slider

def test_the_cycle_slider_moves_every_view_when_typed_clicked_or_dragged(page):
    set_number(page, "max-new-tokens", 32)
    run_and_wait(page)
    n = int(page.locator("#cycle-slider input[type=range]").get_attribute("max")) + 1
    assert n >= 4, n
    # typed into its number box
    target = 2 if shown_cycle(page) != 2 else 1
    set_number(page, "cycle-slider", target)
    wait_for_cycle(page, target)
    # clicked on its track: the left end is cycle 0
    track = page.locator("#cycle-slider input[type=range]")
    track.scroll_into_view_if_needed()
    box = track.bounding_box()
    track.click(position={"x": 2, "y": box["height"] / 2})
    wait_for_cycle(page, 0)
    assert slider_value(page) == 0
    # dragged from the left end to the right end: the last cycle
    page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, steps=5)
    page.mouse.move(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    wait_for_cycle(page, n - 1)
    assert slider_value(page) == n - 1 and shown_cycle(page) == n - 1
    shot(page, "w01_slider_dragged_to_the_last_cycle.png")


# ------------------------------------------------------------------ 2. the queue notice

def test_the_queue_notice_counts_only_runs_that_exist_and_goes_when_the_run_is_done(browser, app_url):
    """One visitor presses Run four times during a long run: the page starts one run, and the notice counts
    one. A second visitor's run then has exactly one run ahead of it, and its notice goes once it is done."""
    first, second = open_page(browser, app_url), open_page(browser, app_url)
    try:
        first.fill("#prompt textarea", LONG_PROMPT)
        set_number(first, "max-new-tokens", 512)
        first.click("#run")
        first.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Running\\u2026 cycle')",
                                timeout=RUN_TIMEOUT_MS)
        for _ in range(3):
            first.click("#run")
        first.wait_for_timeout(1000)
        assert prose(first, "queue-note") == ""          # its own extra clicks are not runs ahead of it
        set_number(second, "max-new-tokens", 8)
        second.click("#run")
        second.wait_for_function(f"() => ({PROSE_JS})('queue-note').includes('ahead')", timeout=30_000)
        assert prose(second, "queue-note").startswith("\u25f7 1 run(s) ahead"), prose(second, "queue-note")
        assert prose(first, "status").startswith("Running")
        shot(second, "w02_queue_notice.png")
        second.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Done')", timeout=RUN_TIMEOUT_MS)
        second.wait_for_function(f"() => ({PROSE_JS})('queue-note') === ''", timeout=60_000)
        first.click("#stop")
        first.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Done')", timeout=60_000)
        assert prose(first, "queue-note") == ""
    finally:
        first.close()
        second.close()


# ------------------------------------------------------------------ 3. results where the visitor looks

# The element's top inside the window (within a pixel: a scroll may land between two) with `px` of it seen below
# (all of it when it is shorter).
IN_SIGHT_JS = ("([id, px]) => { const e = document.getElementById(id); if (!e) return false; "
               "const b = e.getBoundingClientRect(); "
               "return b.height > 0 && b.top >= -1 && b.top + Math.min(px, b.height) <= window.innerHeight + 1; }")
RECT_JS = "(id) => { const b = document.getElementById(id).getBoundingClientRect(); return [b.top, b.bottom]; }"
# The page is placing the views (ui.SHOW_VIEWS_JS): a smooth scroll, then its checks.
PLACING_JS = "() => document.body.dataset.evPlacing === '1'"


# Resolves once the page has stopped scrolling (a smooth scroll takes a few hundred ms) and placing the views.
SCROLLED_JS = ("() => new Promise(done => { let y = window.scrollY; const check = () => setTimeout(() => "
               "{ if (window.scrollY === y && !(" + PLACING_JS + ")()) done(y); else { y = window.scrollY; check(); } "
               "}, 150); check(); })")


def wait_in_sight(page, *elem_ids: str, px: int = 10_000, sight: str = IN_SIGHT_JS, timeout_ms: int = 60_000) -> None:
    """Each element wholly in the window, or its top with `px` of it below (`sight`), once the page has placed
    the views and stopped scrolling."""
    for elem_id in elem_ids:
        page.wait_for_function(f"(a) => !({PLACING_JS})() && ({sight})(a)", arg=[elem_id, px], timeout=timeout_ms)
    page.evaluate(SCROLLED_JS)
    for elem_id in elem_ids:
        assert page.evaluate(sight, [elem_id, px]), elem_id


def race_beside_its_button(page) -> None:
    """The race's answer starts in the window, at most a status line below the Race button."""
    top, _ = page.evaluate(RECT_JS, "race-result")
    _, button = page.evaluate(RECT_JS, "race")
    assert 0 <= top < page.viewport_size["height"] and 0 <= top - button <= 120, (top, button)


def test_results_appear_where_the_visitor_looks(page):
    """At 1280 x 800 the four views start a screen and a half below Run, and the output a screen above them:
    a finished run and a click in the output bring the views into sight, also on a busy machine; the race
    answers beside its button, at once and when done; the tour's text names the cycle shown and sets the phase
    it talks about."""
    set_number(page, "max-new-tokens", 24)
    run_and_wait(page)
    wait_in_sight(page, "cycle-slider", "cycle-caption")
    wait_in_sight(page, "draft-tree", px=300)     # a tall tree may go on below the window
    opened = shown_cycle(page)
    shot(page, "w03_after_run_the_views_in_sight.png")
    # the tour: its text names the cycle shown, its step sets the phase, and it follows a step to another cycle
    open_accordion(page, "Guided tour: one cycle in four steps")
    page.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Draft (cycle {opened})')", timeout=60_000)
    page.click("#tour-next")
    page.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Verify (cycle {opened})') && "
                           f"({PROSE_JS})('phase-text').startsWith('Verify')", timeout=60_000)
    other = opened - 1 if opened else 1
    page.click("#prev" if opened else "#next")
    wait_for_cycle(page, other)
    page.wait_for_function(f"() => ({PROSE_JS})('tour').includes('Verify (cycle {other})')", timeout=60_000)
    page.locator("#tour-next").scroll_into_view_if_needed()
    shot(page, "w03_tour_beside_the_views.png")
    # a click in the output, a screen above the views: the page takes the visitor to them
    page.evaluate("window.scrollTo(0, 0)")
    page.locator("#output-text .token").last.click()
    page.wait_for_function("() => document.querySelector('#focus-text').innerText.startsWith('Selected')",
                           timeout=30_000)
    wait_in_sight(page, "cycle-caption")
    wait_in_sight(page, "draft-tree", px=300)
    shot(page, "w03_after_an_output_click_the_views_in_sight.png")
    # a busy machine (the browser's CPU slowed 8 times): the smooth scroll stalls and the outputs land late, and
    # each click in the output still leaves the views' top at the window's top (a correction made mid-scroll
    # overshot by 200-350 px in 2 of 4 such clicks)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": 8})
    try:
        for k in range(3):
            page.evaluate("window.scrollTo(0, 0)")
            before = page.evaluate(PROSE_JS, "focus-text")
            page.locator("#output-text .token").nth(-2 - 2 * k).click()
            # the click's answer landed (what takes 0.7 s on an idle page takes seconds at this pace), then the
            # views placed
            page.wait_for_function(f"(b) => ({PROSE_JS})('focus-text') !== b", arg=before, timeout=60_000)
            wait_in_sight(page, "cycle-caption", timeout_ms=60_000)
            assert abs(page.evaluate(RECT_JS, "cycle-view")[0]) <= 4, page.evaluate(RECT_JS, "cycle-view")
    finally:
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
    # Race: said at once beside the button, and its table comes there too
    page.click("#race")
    page.wait_for_function(f"() => ({PROSE_JS})('race-result').startsWith('Racing')", timeout=60_000)
    race_beside_its_button(page)
    page.wait_for_function(f"() => ({PROSE_JS})('race-result').includes('This run against plain decoding')",
                           timeout=RUN_TIMEOUT_MS)
    race_beside_its_button(page)
    shot(page, "w03_race_result_beside_its_button.png")


# ------------------------------------------------------------------ 4. figures that fit, projector or not

# What of each figure on the page lies outside its box (the Plot block): its drawing, title, legend, plot
# areas, colour bars, axis titles; legend entries printed over each other or over the title; a toolbar shown
# in projector mode. Empty when every figure fits.
MISFITS_JS = """() => {
  const out = [], projector = document.body.classList.contains('ev-projector');
  const meet = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 2 &&
                         Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 2;
  for (const g of document.querySelectorAll('.js-plotly-plot')) {
    const block = g.closest('.block'), box = block.getBoundingClientRect(), id = block.id;
    if (box.width === 0) continue;
    const rects = (sel) => Array.from(g.querySelectorAll(sel)).map(e => e.getBoundingClientRect())
                                 .filter(r => r.width > 0);
    for (const part of ['.main-svg', '.gtitle', '.legend', '.nsewdrag', '.colorbar', '.g-xtitle', '.g-ytitle'])
      for (const r of rects(part))
        if (r.left < box.left - 1 || r.right > box.right + 1)
          out.push(`${id} ${part}: ${Math.round(r.left)}..${Math.round(r.right)} outside ${Math.round(box.left)}..${Math.round(box.right)}`);
    const entries = rects('.legend .traces .legendtext'), titles = rects('.gtitle');
    entries.forEach((a, i) => entries.slice(i + 1).forEach(b => { if (meet(a, b)) out.push(`${id}: legend entries overlap`); }));
    for (const t of titles) for (const e of rects('.legend')) if (meet(t, e)) out.push(`${id}: legend over the title`);
    const bar = g.querySelector('.modebar-container');
    if (projector && bar && getComputedStyle(bar).display !== 'none') out.push(`${id}: toolbar shown`);
  }
  return out;
}"""


VIEWS = ("draft-tree", "attention-mask", "accepted-path", "kv-rewind", "summary-plot")
DRAWN_WIDTH_JS = "(id) => document.querySelector('#' + id + ' .js-plotly-plot')._fullLayout.width"


def assert_figures_fit(page, where: str) -> None:
    """Waits for the figures to settle at the layout (Plotly redraws a moment after a resize), then checks
    them, and that each is drawn at least as wide as the page gives a view (two side by side only where both
    get that width; one per row on a narrow or zoomed page)."""
    from eagleviz.app.ui import VIEW_MIN_WIDTH

    for elem_id in VIEWS:
        figure(page, elem_id)
    try:
        page.wait_for_function(f"() => ({MISFITS_JS})().length === 0", timeout=60_000)
    except playwright_sync.TimeoutError:
        pass
    assert page.evaluate(MISFITS_JS) == [], where
    widths = {elem_id: page.evaluate(DRAWN_WIDTH_JS, elem_id) for elem_id in VIEWS}
    assert min(widths.values()) >= VIEW_MIN_WIDTH, (where, widths)


def fits_and_shot(page, where: str, elem_id: str, name: str) -> None:
    assert_figures_fit(page, where)
    page.locator(f"#{elem_id}").scroll_into_view_if_needed()
    shot(page, name)


# The smallest label drawn in a figure, in screen pixels (its font size times the zoom of every box around it),
# and its text: hidden labels (Plotly's or the projector's CSS) are not drawn.
SMALLEST_LABEL_JS = """(id) => { let least = [1e9, ''];
  for (const t of document.getElementById(id).querySelectorAll('svg text')) {
    const st = getComputedStyle(t);
    if (st.display === 'none' || st.visibility === 'hidden' || !t.textContent.trim()) continue;
    if (t.getBoundingClientRect().height === 0) continue;
    let z = 1; for (let e = t; e; e = e.parentElement) { const v = parseFloat(getComputedStyle(e).zoom); if (v) z *= v; }
    const px = parseFloat(st.fontSize) * z; if (px < least[0]) least = [px, t.textContent]; }
  return least; }"""


def set_projector(page, on: bool) -> None:
    page.locator("#projector input[type=checkbox]").click()
    page.wait_for_function("(on) => document.body.classList.contains('ev-projector') === on", arg=on,
                           timeout=60_000)


def test_the_figures_fit_the_layout_normal_and_projector(page, browser, app_url):
    set_number(page, "max-new-tokens", 24)
    run_and_wait(page)
    assert_figures_fit(page, "1280 x 800")
    # the projector box turned on, with the figures already drawn: they follow the larger text's layout
    open_accordion(page, "Workshop: recorded runs, a link to these settings, projector")
    box = page.locator("#projector")
    box.evaluate("e => e.scrollIntoView({block: 'center'})")
    before = box.bounding_box()["y"]
    set_projector(page, True)
    page.wait_for_timeout(500)
    assert abs(box.bounding_box()["y"] - before) < 40, (before, box.bounding_box())   # the box stays in place
    fits_and_shot(page, "1280 x 800, projector", "draft-tree", "w04_projector_1280.png")
    page.set_viewport_size({"width": 1024, "height": 768})
    fits_and_shot(page, "1024 x 768, projector", "kv-rewind", "w04_projector_1024_kv.png")
    set_projector(page, False)
    fits_and_shot(page, "1024 x 768", "draft-tree", "w04_normal_1024.png")
    # a link that opens a recorded run in projector mode at 1024 x 768
    tab = browser.new_page(viewport={"width": 1024, "height": 768})
    try:
        tab.goto(app_url + "?projector=1&gallery=code")
        tab.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Recorded run')", timeout=60_000)
        assert tab.evaluate("() => document.body.classList.contains('ev-projector')")
        fits_and_shot(tab, "1024 x 768, ?projector=1", "draft-tree", "w04_projector_link_1024.png")
        tab.goto(app_url + "?projector=1")                     # the arrival: a cycle of 32 cache chips in a row
        tab.wait_for_function(f"() => ({PROSE_JS})('status').includes('Press')", timeout=60_000)
        for view in ("draft-tree", "attention-mask", "accepted-path", "kv-rewind"):   # read from the back row
            tab.wait_for_function("(id) => document.querySelector('#' + id + ' svg text')", arg=view, timeout=60_000)
            px, text = tab.evaluate(SMALLEST_LABEL_JS, view)
            assert px >= 12, (view, px, text)
    finally:
        tab.close()


DARK_JS = """() => { const svg = document.querySelector('#draft-tree .main-svg');
  const rgb = getComputedStyle(document.querySelector('gradio-app')).backgroundColor.match(/\\d+/g).map(Number);
  return {dark: document.body.classList.contains('dark'), filter: svg ? getComputedStyle(svg).filter : '',
          light: rgb[0] + rgb[1] + rgb[2]}; }"""


def test_dark_turns_the_page_and_its_figures_dark_and_a_dark_link_opens_ticked(page, browser, app_url):
    """For a projector in a dim room: the page in Gradio's dark theme and the figures dark with it (inverted, hues
    kept); untick, and both are light again; a page opened at `?__theme=dark` shows the box ticked."""
    open_accordion(page, "Workshop: recorded runs, a link to these settings, projector")
    light = page.evaluate(DARK_JS)
    assert not light["dark"] and "invert" not in light["filter"] and light["light"] > 600
    page.locator("#dark input[type=checkbox]").click()
    page.wait_for_function("() => document.body.classList.contains('dark')", timeout=30_000)
    dark = page.evaluate(DARK_JS)
    assert "invert" in dark["filter"] and dark["light"] < 200, dark
    page.evaluate("() => document.getElementById('draft-tree').scrollIntoView()")
    shot(page, "w04_dark_1280.png")
    page.locator("#dark input[type=checkbox]").click()
    page.wait_for_function("() => !document.body.classList.contains('dark')", timeout=30_000)
    assert "invert" not in page.evaluate(DARK_JS)["filter"]
    tab = browser.new_page(viewport={"width": 1024, "height": 768})
    try:
        tab.goto(app_url + "?__theme=dark")
        tab.wait_for_selector("#run", timeout=60_000)
        open_accordion(tab, "Workshop: recorded runs, a link to these settings, projector")
        tab.wait_for_function("() => document.querySelector('#dark input[type=checkbox]').checked", timeout=30_000)
    finally:
        tab.close()


# ------------------------------------------------------------------ 6. Race during a run

def test_race_during_a_run_is_refused_in_plain_words(page):
    page.fill("#prompt textarea", LONG_PROMPT)
    set_number(page, "max-new-tokens", 512)
    page.click("#run")
    page.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Running\\u2026 cycle')", timeout=RUN_TIMEOUT_MS)
    page.click("#race")
    page.wait_for_function(f"() => ({PROSE_JS})('race-result').includes('still going')", timeout=30_000)
    assert prose(page, "status").startswith("Running")             # refused at once, not after the run
    assert "|" not in prose(page, "race-result")                    # no race table of a half-made run
    assert "still going" in page.locator(".toast-body").first.inner_text()   # said where the visitor looks
    shot(page, "w06_race_refused_during_a_run.png")
    page.click("#stop")
    page.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Done')", timeout=60_000)


# ------------------------------------------------------------------ 7. presets that do not go stale

def knob_values(page) -> dict:
    return {k: page.locator(f"#{k} input[type=number]").first.input_value()
            for k in ("steps", "topk", "draft-tokens", "temperature")}


def selected_preset(page) -> str | None:
    checked = page.locator("#preset input[type=radio]:checked")
    return checked.first.get_attribute("value") if checked.count() else None


def test_an_edited_preset_lets_go_a_click_restores_it_and_an_import_restores_its_settings(page, tmp_path):
    from eagleviz.app import gallery, presets

    first = presets.PRESETS[0]
    opened = knob_values(page)
    assert selected_preset(page) == first.name and "tau about" in prose(page, "preset-note")
    # a knob moved: the preset is no longer what the page shows, and its note stops promising its tau
    set_number(page, "steps", 3)
    page.wait_for_function("() => !document.querySelector('#preset input[type=radio]:checked')", timeout=60_000)
    assert "tau about" not in prose(page, "preset-note") and first.name in prose(page, "preset-note")
    # clicking it restores it (a click, not check(): the knob's own update may still be arriving as it lands,
    # so the final state is waited for rather than read at once)
    page.get_by_role("radio", name=first.name).click()
    page.wait_for_function(f"() => ({PROSE_JS})('preset-note').includes('tau about')", timeout=30_000)
    assert knob_values(page) == opened and selected_preset(page) == first.name
    # the prompt edited: the same
    page.locator("#prompt textarea").press_sequentially(" Then stop.")
    page.wait_for_function("() => !document.querySelector('#preset input[type=radio]:checked')", timeout=60_000)
    page.get_by_role("radio", name=first.name).click()
    page.wait_for_function(f"(p) => document.querySelector('#prompt textarea').value === p", arg=first.prompt,
                           timeout=30_000)
    # "Fastest on this CPU" is another tree: the preset lets go
    if page.locator("#fastest-tree").is_enabled():
        page.click("#fastest-tree")
        page.wait_for_function("() => !document.querySelector('#preset input[type=radio]:checked')", timeout=60_000)
    # an imported trace brings back its prompt and knobs, and the preset they are
    entry = next(e for e in gallery.entries() if e.preset and e.preset != first.name and e.knobs.temperature > 0)
    open_accordion(page, "Save, load, deploy")
    page.locator("#import input[type=file]").set_input_files(str(gallery.GALLERY_DIR / entry.file))
    page.wait_for_function(f"() => ({PROSE_JS})('status').startsWith('Imported')", timeout=60_000)
    page.wait_for_function("(p) => document.querySelector('#prompt textarea').value === p", arg=entry.prompt,
                           timeout=30_000)
    k = entry.knobs
    page.wait_for_function(f"() => document.querySelector('#steps input[type=number]').value === '{k.steps}'",
                           timeout=60_000)
    assert knob_values(page) == {"steps": str(k.steps), "topk": str(k.topk), "draft-tokens": str(k.draft_tokens),
                                 "temperature": f"{k.temperature:g}"}
    page.wait_for_function("(n) => (document.querySelector('#preset input[type=radio]:checked') || {}).value === n",
                           arg=entry.preset, timeout=60_000)
    assert "tau about" in prose(page, "preset-note")
    shot(page, "w07_imported_trace_restores_its_settings.png")


# ------------------------------------------------------------------ 8. labels that say what they measure

@pytest.fixture
def tiny_page(browser, tmp_path, monkeypatch):
    """A page served by a tiny random engine, built with this machine's own bench results out of sight
    (EAGLEVIZ_CACHE empty): it shows the shipped ones, whose speedups the file holds."""
    from eagleviz.app.ui import PAGE, build_app
    from servers import serving
    from tiny import tiny_engine

    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path / "cache"))
    head = "assets/eagle-smollm2-135m"   # as app.py names the shipped head: a folder on this server
    with serving(build_app(tiny_engine("llama", vocab=8), model_id="tiny", head_path=head), **PAGE) as url:
        tab = open_page(browser, url)
        yield tab
        tab.close()


# null-safe: wait_for_function gives up on an exception, and the flags box appears with its accordion
FLAGS_JS = "() => { const e = document.querySelector('#launch-flags'); return e ? e.innerText : ''; }"


def test_labels_say_what_they_measure(tiny_page):
    from eagleviz.app.flags import HEAD_PLACEHOLDER
    from eagleviz.paths import SHIPPED_BENCH

    page = tiny_page
    # the launch flags are there on a fresh page, and follow the cost-aware switch and the draft source
    open_accordion(page, "Save, load, deploy")
    page.wait_for_function(f"() => ({FLAGS_JS})().includes('sglang.launch_server')", timeout=30_000)
    flags = page.evaluate(FLAGS_JS)
    assert "--speculative-num-steps 5" in flags                            # the opening preset's tree
    assert "assets/" not in flags and HEAD_PLACEHOLDER in flags            # no path that only the server has
    page.locator("#adaptive input[type=checkbox]").click()
    page.wait_for_function(f"() => ({FLAGS_JS})().includes('upper bounds')", timeout=30_000)
    page.locator("#draft-source input[value=lookup]").click()
    page.wait_for_function(f"() => ({FLAGS_JS})().includes('NGRAM')", timeout=30_000)
    assert '"method": "ngram"' in page.evaluate(FLAGS_JS)
    # measured speed: EAGLE against plain decoding, as the section's title says
    bench = json.loads((SHIPPED_BENCH / "bench-T0.json").read_text(encoding="utf-8"))
    rows = bench["rows"]
    ratio = f"{rows['eagle-tree']['vs_plain']:.2f}x"  # the median per-prompt ratio, as the README quotes it
    open_accordion(page, "Measured speed: EAGLE vs plain decoding vs peers")
    page.wait_for_function(f"() => ({PROSE_JS})('bench-table-0') !== ''", timeout=30_000)  # drawn as it opens
    table = prose(page, "bench-table-0")
    assert "vs plain decoding" in table and ratio in table, table
    figure(page, "bench-plot-0")
    bars = page.evaluate("() => { const gd = document.querySelector('#bench-plot-0 .js-plotly-plot');"
                         " return [gd.data[0].text, gd.layout.xaxis.title.text]; }")
    assert bars[0][list(rows).index("eagle-tree")] == ratio and "plain decoding" in bars[1]
    page.locator("#bench-table-0").scroll_into_view_if_needed()
    shot(page, "w08_measured_speed_vs_plain.png")
    # ... and the ceiling: a drafter that is always right, against the head's own guesses
    ceiling = json.loads((SHIPPED_BENCH / "ceiling-T0.json").read_text(encoding="utf-8"))["rows"]
    page.locator("#ceiling-text").scroll_into_view_if_needed()
    words = prose(page, "ceiling-text")
    assert f"{ceiling['foresight-1']['speedup']:.2f}x with a chain of 1" in words, words
    drawn = figure(page, "ceiling")["traces"]
    assert [t["name"] for t in drawn][:2] == ["every guess right (the ceiling)", "the head's guesses"]
    assert drawn[0]["y"][0] == pytest.approx(ceiling["foresight-1"]["speedup"])
    assert drawn[1]["y"][0] == pytest.approx(ceiling["eagle-chain-1"]["speedup"])
    page.locator("#ceiling").scroll_into_view_if_needed()
    shot(page, "w08_ceiling.png")
    # a 20,000-character paste is kept whole and the page says it is over the limit
    page.fill("#prompt textarea", "word " * 4000)
    assert len(page.locator("#prompt textarea").input_value()) == 20_000
    page.wait_for_function(f"() => ({PROSE_JS})('prompt-note').includes('20,000 characters')", timeout=30_000)
    assert "8,000" in prose(page, "prompt-note")


# ------------------------------------------------------------------ 9. plain words, not the machinery's

RAW = ("<|im_end|>", "max_new_tokens", "Expecting value", "EAGLEVIZ_", "TRITON_INTERPRET")


def no_raw(text: str) -> None:
    assert not [r for r in RAW if r in text], text


def test_a_learner_reads_plain_words_not_internals(page, tmp_path, browser, app_url):
    from test_app_browser import OUTPUT_TEXT_JS

    # a run that ends itself (12 tokens): the end-of-text token is said in words, and so is why the run stopped
    page.fill("#prompt textarea", "What is 2 + 2?")
    set_number(page, "max-new-tokens", 64)
    run_and_wait(page)
    assert "the model ended its answer" in prose(page, "status")
    output = page.evaluate(OUTPUT_TEXT_JS)
    assert output.rstrip().endswith("[end of answer]"), output
    for elem_id in ("status", "summary", "cycle-caption"):
        no_raw(prose(page, elem_id))
    no_raw(output)
    # a run cut at its length
    set_number(page, "max-new-tokens", 6)
    run_and_wait(page)
    assert prose(page, "status").startswith("Done: reached max new tokens (6)")
    no_raw(prose(page, "status") + prose(page, "summary"))
    # a file that is not JSON
    bad = tmp_path / "notes.json"
    bad.write_text("my notes from the class", encoding="utf-8")
    open_accordion(page, "Save, load, deploy")
    page.locator("#import input[type=file]").set_input_files(str(bad))
    page.wait_for_function(f"() => ({PROSE_JS})('status').includes('not JSON')", timeout=30_000)
    no_raw(prose(page, "status"))
    # a prompt over the limit: the limit's value, not the variable that sets it
    page.fill("#prompt textarea", "word " * 2000 + "!")
    page.click("#run")
    page.wait_for_function(f"() => ({PROSE_JS})('status').includes('8,000')", timeout=30_000)
    no_raw(prose(page, "status"))
    # no Triton kernel offered on a CPU, and a link asking for it is answered in words
    offered = page.evaluate("() => window.gradio_config.components.find(c => c.props.elem_id === 'attn-impl')"
                            ".props.choices.map(c => c[1])")
    assert offered and "triton" not in offered, offered
    tab = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        tab.goto(app_url + "?attn_impl=triton&steps=3")
        tab.wait_for_function(f"() => ({PROSE_JS})('link-note').includes('needs a GPU')", timeout=60_000)
        no_raw(prose(tab, "link-note"))
        assert tab.locator("#steps input[type=number]").first.input_value() == "3"
    finally:
        tab.close()


# ------------------------------------------------------------------ 10. a run opens on its most instructive cycle

def test_a_run_opens_on_its_most_instructive_cycle_and_cycle_0_is_one_click_away(page, tmp_path):
    """The rule: the first cycle with the longest accepted path. The opening preset's cycle 0 drafts from the
    prompt alone and accepts little; a later cycle accepts four or five."""
    run_and_wait(page)
    trace, _ = export(page, tmp_path, "counting.json")
    lengths = [c["accept_length"] for c in trace["cycles"]]
    opened = lengths.index(max(lengths))
    assert opened > 0, lengths
    wait_for_cycle(page, opened)
    assert slider_value(page) == opened and "longest accepted path" in prose(page, "focus-text")
    assert f"{max(lengths)} accepted" in figure(page, "accepted-path")["title"]
    page.locator("#cycle-slider").scroll_into_view_if_needed()
    shot(page, "w10_opened_on_the_instructive_cycle.png")
    page.click("#first-cycle")
    wait_for_cycle(page, 0)
    assert slider_value(page) == 0
