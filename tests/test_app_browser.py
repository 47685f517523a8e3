"""End to end in headless Chromium: type a prompt, run, check the four figures against the exported trace,
step to another cycle, change knobs and run again, import an exported trace; the first screen's branching
tree, the code preset's line breaks, the page at three screen sizes. Each test opens its own tab on the page
and makes the run it needs, so the tests pass one by one and in any order. Screenshots go to artifacts/.

Needs Debian's chromium (`apt-get install -y chromium fonts-dejavu-core`) and the Python `playwright`
package (never `playwright install`). Runs the embedded SmolLM2 target with the default head.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleviz.app.workshop import TOUR_VIEWS
from servers import CHROMIUM

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
RUN_TIMEOUT_MS = 240_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
# playwright is a declared test dependency (pyproject's `test` extra): its absence is a broken install, a
# failure, not a skip. Only the browser binary, which comes from apt, may be missing.
import playwright.sync_api as playwright_sync  # noqa: E402

# Per-figure summaries read from the live Plotly objects in the page.
FIGURE_JS = """(id) => {
  const gd = document.querySelector('#' + id + ' .js-plotly-plot');
  if (!gd || !gd.data) return null;
  return {title: (gd.layout.title || {}).text || '',
          traces: gd.data.map(t => ({name: t.name || '', type: t.type, mode: t.mode || '',
                                     n: (t.x || []).length, y: Array.from(t.y || []), zrows: t.z ? t.z.length : 0,
                                     zcols: t.z && t.z.length ? t.z[0].length : 0})),
          arrows: (gd.layout.annotations || []).filter(a => a.showarrow).length};
}"""


def open_page(browser, url: str, width: int = 1280, height: int = 800):
    tab = browser.new_page(viewport={"width": width, "height": height}, accept_downloads=True)
    tab.goto(url)
    tab.wait_for_selector("#run", timeout=60_000)
    tab.wait_for_function("() => document.querySelector('#prompt textarea').value !== ''", timeout=60_000)
    if "?" not in url:   # a plain visit opens on a recorded run: its outputs are there before the test acts
        tab.wait_for_function(f"() => ({PROSE_JS})('status').includes('Press')", timeout=60_000)
    return tab


@pytest.fixture
def page(browser, app_url):
    """A fresh tab on the page at 1280 x 800: nothing left by another test."""
    tab = open_page(browser, app_url)
    yield tab
    tab.close()


def set_number(page, elem_id: str, value) -> None:
    """Type into the number box of a slider or number component, then commit it."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")
    box.blur()


def set_knob(page, elem_id: str, value: int) -> None:
    """`set_number`, then wait until the slider itself holds the value: a slider drawn as its accordion opens
    can take its default back if typed into while it mounts (seen once on a loaded machine), so type again."""
    for _ in range(3):
        set_number(page, elem_id, value)
        try:
            page.wait_for_function("([id, v]) => document.querySelector('#' + id + ' input[type=range]').value === v",
                                   arg=[elem_id, str(value)], timeout=2_000)
            return
        except Exception:  # noqa: BLE001 (playwright's TimeoutError): the value did not stay, type it again
            continue
    raise AssertionError(f"#{elem_id} would not keep {value}")


PROSE_JS = "(id) => { const e = document.querySelector('#' + id + ' .prose'); return e ? e.innerText.trim() : ''; }"


def prose(page, elem_id: str) -> str:
    """A Markdown component's own text (without Gradio's progress overlay)."""
    return page.evaluate(PROSE_JS, elem_id)


def run_and_wait(page) -> None:
    # A run ends with a new summary (its wall time and prefill in ms): the old "Done" of the previous run
    # must not be taken for this one's. Only the Markdown's own text counts, not the progress overlay that
    # Gradio lays over a pending output ("processing | 0.1s").
    before = prose(page, "summary")
    page.click("#run")
    page.wait_for_function(f"(before) => {{ const s = ({PROSE_JS})('status'), now = ({PROSE_JS})('summary');"
                           " return /\\u26a0/.test(s) || (s.startsWith('Done') && now !== '' && now !== before); }",
                           arg=before, timeout=RUN_TIMEOUT_MS)
    status = prose(page, "status")
    assert "Done" in status and "\u26a0" not in status, status


def export(page, tmp_path: Path, name: str) -> tuple[dict, Path]:
    open_accordion(page, "Save, load, deploy")
    page.locator("#export").scroll_into_view_if_needed()
    with page.expect_download() as info:
        page.click("#export")
    path = tmp_path / name
    info.value.save_as(path)
    return json.loads(path.read_text(encoding="utf-8")), path


def figure(page, elem_id: str) -> dict:
    page.wait_for_function(f"() => {{ const g = document.querySelector('#{elem_id} .js-plotly-plot'); "
                           "return g && g.data && g.data.length > 0; }", timeout=30_000)
    return page.evaluate(FIGURE_JS, elem_id)


def shot(page, name: str, full: bool = False) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=full)


def open_accordion(page, label: str) -> None:
    """Gradio renders an accordion's children only once it is open (its header button gets class `open`)."""
    button = page.get_by_role("button", name=label)
    if "open" not in (button.get_attribute("class") or "").split():
        button.click()
        page.wait_for_function("(b) => b.classList.contains('open')", arg=button.element_handle(), timeout=60_000)


def opened(trace: dict) -> dict:
    """The cycle a finished run opens on: the first with the longest accepted path."""
    lengths = [c["accept_length"] for c in trace["cycles"]]
    return trace["cycles"][lengths.index(max(lengths))]


def check_cycle_figures(page, cycle: dict) -> None:
    """The four figures of the selected cycle carry the trace's node, cell and slot counts."""
    tree = figure(page, "draft-tree")
    kept = sum(n["kept"] for n in cycle["nodes"])
    names = {t["name"]: t["n"] for t in tree["traces"] if t["name"]}
    assert f"Cycle {cycle['index']}" in tree["title"]
    assert names.get("pruned by reranking", 0) == len(cycle["nodes"]) - kept
    tried = ("accepted", "rejected", "verified, not reached")
    verified = sum(names.get(k, 0) for k in tried)
    assert verified == kept == len(cycle["tokens"]) - 1
    mask = figure(page, "attention-mask")
    heat = next(t for t in mask["traces"] if t["type"] == "heatmap")
    assert (heat["zrows"], heat["zcols"]) == (len(cycle["tokens"]), len(cycle["tokens"]) + 1)
    path = figure(page, "accepted-path")
    assert f"{cycle['accept_length']} accepted" in path["title"]
    kv = figure(page, "kv-rewind")
    assert kv["arrows"] == len(cycle["path"])
    assert f"keeps {len(cycle['path'])} of {len(cycle['tokens'])} tree slots" in kv["title"]


def test_run_step_rerun_and_import(page, tmp_path):
    page.fill("#prompt textarea", "Write a Python function that adds two numbers.")
    set_number(page, "max-new-tokens", 12)
    set_number(page, "steps", 4)
    set_number(page, "topk", 3)
    set_number(page, "draft-tokens", 10)
    run_and_wait(page)
    shot(page, "01_after_run_top.png")
    first, first_path = export(page, tmp_path, "first.json")
    assert first["config"]["tree"]["steps"] == 4 and len(first["cycles"]) >= 2
    check_cycle_figures(page, opened(first))
    page.locator("#draft-tree").scroll_into_view_if_needed()
    shot(page, "02_opened_cycle_tree.png")
    shot(page, "03_after_run_full.png", full=True)

    # step to cycle 0, then to the next: the figures follow, without recomputation
    page.click("#first-cycle")
    page.wait_for_function("() => document.querySelector('#cycle-caption').innerText.includes('Cycle 0')",
                           timeout=30_000)
    check_cycle_figures(page, first["cycles"][0])
    page.click("#next")
    page.wait_for_function("() => document.querySelector('#cycle-caption').innerText.includes('Cycle 1')",
                           timeout=30_000)
    page.wait_for_function("() => (document.querySelector('#draft-tree .js-plotly-plot')?.layout?.title?.text || '')"
                           ".includes('Cycle 1')", timeout=30_000)
    check_cycle_figures(page, first["cycles"][1])
    shot(page, "04_cycle1.png")

    # change knobs (a chain: topk 1 forces draft tokens = steps + 1) and run again
    set_number(page, "topk", 1)
    set_number(page, "steps", 3)
    page.wait_for_function("() => document.querySelector('#validity').innerText.includes('Adjusted')",
                           timeout=30_000)
    set_number(page, "temperature", 0.7)
    run_and_wait(page)
    second, _ = export(page, tmp_path, "second.json")
    tree = second["config"]["tree"]
    assert (tree["steps"], tree["topk"], tree["draft_tokens"]) == (3, 1, 4) and tree["adjustments"]
    assert second["config"]["sampling"]["temperature"] == pytest.approx(0.7)
    check_cycle_figures(page, opened(second))
    open_accordion(page, "Losslessness at T > 0: replay the acceptance step")
    replay = figure(page, "replay")
    assert "replays of the acceptance step" in replay["title"]
    shot(page, "05_chain_sampling_full.png", full=True)

    # import the first run: it replaces the second, nothing is computed
    page.locator("#import input[type=file]").set_input_files(str(first_path))
    page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Imported')",
                           timeout=60_000)
    assert f"{len(first['cycles'])} cycles" in page.locator("#status").inner_text()
    check_cycle_figures(page, opened(first))
    assert "sglang.launch_server" in page.locator("#launch-flags").inner_text()
    shot(page, "06_imported.png", full=True)


def test_stop_ends_a_long_run_cleanly(page):
    """A run long enough to be stopped mid-way however fast the machine decodes: SGLang's fixed tree at its
    widest (each cycle verifies 64 tokens) for up to 512 tokens of an essay (the counting preset's answer ends
    after about 50 tokens, before a Stop could reach it)."""
    page.fill("#prompt textarea", "Write a 2000-word essay about the history of Rome, with many sections.")
    set_number(page, "max-new-tokens", 512)
    for knob, value in (("steps", 8), ("topk", 8), ("draft-tokens", 64)):
        set_knob(page, knob, value)
    page.locator("#adaptive input[type=checkbox]").uncheck()
    # red (Gradio's stop variant) only while the status says a run goes; Race is a plain button, as Stop is at rest
    red = ("() => getComputedStyle(document.getElementById('stop')).backgroundColor !== "
           "getComputedStyle(document.getElementById('race')).backgroundColor")
    assert not page.evaluate(red)                                              # idle: nothing to stop, not red
    page.click("#run")
    page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Running\u2026 cycle')",
                           timeout=RUN_TIMEOUT_MS)
    page.wait_for_function(red, timeout=10_000)
    page.click("#stop")
    # the page's own words at the click (unless the run's end came first), said before the server hears of it
    page.wait_for_function(f"() => /^(Stopping after the current cycle|Done: stopped by the user)/"
                           f".test(({PROSE_JS})('status'))", timeout=10_000)
    page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Done: stopped by the user')",
                           timeout=60_000)
    assert "\u03c4 =" in page.locator("#summary").inner_text()
    shot(page, "07_stopped.png")
    done = prose(page, "status")
    page.wait_for_function(f"() => !({red})()", timeout=30_000)                # idle again
    page.click("#stop")           # a Stop after the run's end: nothing to stop, nothing said over "Done"
    page.wait_for_timeout(1000)
    assert prose(page, "status") == done


# ------------------------------------------------------------------ workshop flows: presets, linked
# views, phases, links, the gallery

FOCUS_JS = """([id, colour]) => {
  const gd = document.querySelector('#' + id + ' .js-plotly-plot');
  if (!gd || !gd.data) return -1;
  const traces = gd.data.filter(t => (t.marker && t.marker.color === colour) || (t.line && t.line.color === colour));
  const shapes = (gd.layout.shapes || []).filter(s => s.line && s.line.color === colour);
  return traces.length + shapes.length;
}"""


def focus_marks(page, elem_id: str) -> int:
    from eagleviz.visuals.style import FOCUS

    return page.evaluate(FOCUS_JS, [elem_id, FOCUS])


def test_preset_run_then_one_token_is_followed_through_the_four_views(page):
    for name, start in (("Code", "Write a Python"), ("Counting (high acceptance)", "List the numbers")):
        page.get_by_role("radio", name=name).check()
        page.wait_for_function(f"() => document.querySelector('#prompt textarea').value.startsWith('{start}')",
                               timeout=30_000)
    page.wait_for_function("() => document.querySelector('#prompt textarea').value.startsWith('List the numbers')",
                           timeout=30_000)
    set_number(page, "max-new-tokens", 24)
    run_and_wait(page)
    # the list of the cycle's tokens: pick slot 1, a draft token the target judged
    page.locator("#cycle-tokens .token").nth(1).click()
    page.wait_for_function("() => document.querySelector('#focus-text').innerText.startsWith('Selected slot 1')",
                           timeout=30_000)
    page.wait_for_function("() => (document.querySelector('#draft-tree .js-plotly-plot')?.data || [])"
                           ".some(t => t.name === 'selected token')", timeout=30_000)
    assert focus_marks(page, "draft-tree") == 1
    assert focus_marks(page, "attention-mask") == 2               # its row and its column
    assert focus_marks(page, "kv-rewind") >= 1                    # its slot before (and after, if kept)
    page.locator("#cycle-slider").scroll_into_view_if_needed()
    shot(page, "08_linked_selection.png")


def test_an_output_token_opens_the_cycle_that_committed_it(page):
    set_number(page, "max-new-tokens", 24)
    run_and_wait(page)
    tokens = page.locator("#output-text .token")
    last = tokens.count() - 1
    tokens.nth(last).click()
    page.wait_for_function("() => document.querySelector('#focus-text').innerText.startsWith('Selected')",
                           timeout=30_000)
    caption = page.locator("#cycle-caption").inner_text()
    cycle = int(caption.split()[1])
    assert cycle > 0 and page.locator("#cycle-slider input[type=number]").first.input_value() == str(cycle)
    # the figures are redrawn after the texts: wait for the tree that carries the selection
    page.wait_for_function("() => { const gd = document.querySelector('#draft-tree .js-plotly-plot');"
                           " return gd && gd.data && gd.data.some(t => t.name === 'selected token'); }",
                           timeout=30_000)
    assert focus_marks(page, "draft-tree") == 1


def test_a_cycle_plays_phase_by_phase(page):
    set_number(page, "max-new-tokens", 16)
    run_and_wait(page)
    page.click("#play-phases")
    page.wait_for_function("() => document.querySelector('#phase-text').innerText.startsWith('Draft')",
                           timeout=30_000)
    mask = figure_or_blank(page, "attention-mask")
    assert "has not run yet" in mask       # the target has not verified anything while the tree grows
    page.wait_for_function("() => document.querySelector('#phase-text').innerText.startsWith('Rewind')",
                           timeout=60_000)
    assert "Play phases" in page.locator("#play-phases").inner_text()   # stopped at the end state


def figure_or_blank(page, elem_id: str) -> str:
    """The figure's title, or the message of an empty figure."""
    return page.evaluate("(id) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');"
                         " const a = (gd.layout.annotations || []).map(x => x.text).join(' ');"
                         " return ((gd.layout.title || {}).text || '') + ' ' + a; }", elem_id)


def test_a_shared_link_restores_prompt_and_knobs_and_bad_ones_give_a_note(browser, app_url):
    tab = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        tab.goto(app_url + "?prompt=Name%20three%20fruits.&steps=3&topk=2&draft_tokens=7&temperature=0.3")
        tab.wait_for_selector("#prompt textarea", timeout=60_000)
        tab.wait_for_function("() => document.querySelector('#prompt textarea').value === 'Name three fruits.'",
                              timeout=60_000)
        values = {k: tab.locator(f"#{k} input[type=number]").first.input_value()
                  for k in ("steps", "topk", "draft-tokens", "temperature")}
        assert values == {"steps": "3", "topk": "2", "draft-tokens": "7", "temperature": "0.3"}
        tab.goto(app_url + "?steps=banana&topk=2")
        tab.wait_for_selector("#link-note", timeout=60_000)
        tab.wait_for_function("() => document.querySelector('#link-note').innerText.includes('steps')",
                              timeout=60_000)
        assert tab.locator("#topk input[type=number]").first.input_value() == "2"
        shot(tab, "09_link_with_a_bad_parameter.png")
    finally:
        tab.close()


def test_a_recorded_run_replays_with_no_model_call(browser, app_url, monkeypatch):
    from eagleviz.app import gallery
    from eagleviz.decoding.engine import Engine

    calls = []
    real = Engine.speculate
    monkeypatch.setattr(Engine, "speculate", lambda *a, **k: calls.append(1) or real(*a, **k))
    entry = gallery.entries()[0]
    tab = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        tab.goto(app_url + f"?gallery={entry.id}")
        tab.wait_for_selector("#status", timeout=60_000)
        tab.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Recorded run')",
                              timeout=60_000)
        run = gallery.load(entry.id)
        check_cycle_figures(tab, opened(json.loads(run.to_json())))
        shot(tab, "10_gallery_replay.png")
    finally:
        tab.close()
    assert calls == []


# ------------------------------------------------------------------ the first screen, readable output, sizes

def summary_tau(page) -> float:
    import re

    found = re.search(r"\u03c4 = ([0-9.]+)", prose(page, "summary"))
    assert found, prose(page, "summary")
    return float(found.group(1))


def no_loop(text: str) -> None:
    """No line, and no 6-word phrase, repeated 4 times or more (as tests/test_presets.py)."""
    from collections import Counter

    lines = Counter(line.strip() for line in text.splitlines() if line.strip())
    assert not lines or max(lines.values()) < 4, lines.most_common(1)
    words = text.split()
    phrases = Counter(tuple(words[i:i + 6]) for i in range(len(words) - 5))
    assert not phrases or max(phrases.values()) < 4, phrases.most_common(1)


# The output's text as the tokens carry it (innerText would break the line at every token: they are flex
# items), each newline mark turned back into the newline it stands for.
OUTPUT_TEXT_JS = ("() => document.querySelector('#output-text .textfield').textContent"
                  ".replaceAll('\\u21b5', '\\n')")
LINE_TOPS_JS = ("() => new Set([...document.querySelectorAll('#output-text .token')]"
                ".map(t => Math.round(t.getBoundingClientRect().top))).size")


def test_the_page_opens_on_a_branching_tree_and_a_first_click_shows_it(page):
    """The first screen teaches trees: the opening preset's tree branches (topk >= 2), the first Run commits
    three tokens or more per target forward with no repeated loop, and the draft tree of the first cycle has a
    level with several verified nodes."""
    from eagleviz.app import presets

    first = presets.PRESETS[0]
    knobs = [int(page.locator(f"#{k} input[type=number]").first.input_value()) for k in ("steps", "topk",
                                                                                         "draft-tokens")]
    assert tuple(knobs) == first.tree and knobs[1] >= 2
    assert page.locator("#adaptive input[type=checkbox]").is_checked() is False
    assert f"Tree {first.tree_label}" in prose(page, "preset-note")
    shot(page, "11_first_screen_1280x800.png")
    run_and_wait(page)
    assert summary_tau(page) >= 3.0
    no_loop(page.evaluate(OUTPUT_TEXT_JS))
    tree = figure(page, "draft-tree")
    verified = [y for t in tree["traces"] if t["name"] in ("accepted", "rejected", "verified, not reached")
                for y in t["y"]]
    assert max(verified.count(d) for d in set(verified)) >= 2, verified   # a level with two or more nodes
    shot(page, "12_first_run_1280x800.png")
    page.locator("#draft-tree").scroll_into_view_if_needed()
    shot(page, "13_first_run_tree_1280x800.png")


VIEWS = (*TOUR_VIEWS, "summary-plot")   # the four views and the summary
# Each view's plot element now, kept (a step's update replaces it), then the cycle each kept element and each view's
# element in the page were last drawn for (the title's "Cycle k", the summary's outlined bar).
KEEP_PLOTS_JS = "(ids) => { window.__kept = ids.map(id => document.querySelector('#' + id + ' .js-plotly-plot')); }"
DRAWN_FOR_JS = """([ids, which]) => ids.map((id, i) => {
  const g = which === 'kept' ? window.__kept[i] : document.querySelector('#' + id + ' .js-plotly-plot');
  if (!g || !g.data) return null;
  if (id !== 'summary-plot') return Number(((g.layout.title || {}).text || '').split(' ')[1]);
  const widths = g.data[0].marker.line.width;
  return g.data[0].x[widths.findIndex(w => w > 0)]; })"""


def test_a_step_draws_each_changed_figure_once(page):
    """Gradio's Plot draws a changed figure in its old plot element, then again in the new element it makes for it:
    the page's head leaves out the draw whose element has gone by then (`ui.PLOT_ONCE_HEAD`), so a step to the next
    cycle draws each of the four views once, in the element the page shows. The run's summary is not sent again:
    its element stays, and the page moves its outline to the new cycle's bar (`ui.SUMMARY_OUTLINE_JS`)."""
    shown = int(prose(page, "cycle-caption").split()[1])
    every_view_at = f"(k) => ({DRAWN_FOR_JS})([{json.dumps(VIEWS)}, 'page']).every(c => c === k)"
    page.wait_for_function(every_view_at, arg=shown, timeout=60_000)   # (the arrival's figures all drawn)
    page.evaluate(KEEP_PLOTS_JS, VIEWS)
    page.click("#next")
    page.wait_for_function(every_view_at, arg=shown + 1, timeout=60_000)
    page.wait_for_timeout(1000)   # (a draw in the old element would have come with the same update)
    views = len(VIEWS) - 1
    assert page.evaluate("() => window.__kept.map(g => g.isConnected)") == [False] * views + [True]
    # the views' old elements not drawn again, gone; the summary's own element outlines the new cycle
    assert page.evaluate(DRAWN_FOR_JS, [VIEWS, "kept"]) == [shown] * views + [shown + 1]


def test_a_visitors_runs_are_not_kept_in_the_browser(page):
    """No run history (`ui.PAGE`): Gradio 6 would keep every event's inputs and outputs in localStorage, a visitor's
    prompts on a workshop's shared machine, rewritten (~130 KB) several times a step."""
    shown = int(prose(page, "cycle-caption").split()[1])
    page.click("#next")
    page.wait_for_function("(k) => document.querySelector('#cycle-caption').innerText.includes('Cycle ' + k)",
                           arg=shown + 1, timeout=60_000)
    page.wait_for_timeout(500)
    assert page.evaluate("() => Object.keys(localStorage).filter(k => k.startsWith('gradio:run-history'))") == []


def test_a_code_answer_keeps_its_line_breaks_and_its_tokens_stay_clickable(page):
    page.get_by_role("radio", name="Code").check()
    page.wait_for_function("() => document.querySelector('#prompt textarea').value.startsWith('Write a Python')",
                           timeout=30_000)
    run_and_wait(page)
    text = page.evaluate(OUTPUT_TEXT_JS)
    indented = [line for line in text.splitlines() if line.startswith("    ")]
    assert len(indented) >= 2, text
    assert page.evaluate(LINE_TOPS_JS) >= 4            # the tokens sit on several lines, as the code does
    page.locator("#output-text").scroll_into_view_if_needed()
    shot(page, "14_code_output_1280x800.png")
    tokens = page.locator("#output-text .token")
    tokens.nth(tokens.count() - 2).click()
    page.wait_for_function("() => document.querySelector('#focus-text').innerText.startsWith('Selected')",
                           timeout=30_000)


@pytest.mark.parametrize("width,height", [(1920, 1080), (390, 844)])
def test_the_page_at_other_sizes(browser, app_url, width, height):
    tab = open_page(browser, app_url, width, height)
    try:
        set_number(tab, "max-new-tokens", 24)
        run_and_wait(tab)
        shot(tab, f"15_after_run_{width}x{height}.png")
        tab.locator("#draft-tree").scroll_into_view_if_needed()
        shot(tab, f"16_tree_{width}x{height}.png")
        assert tab.evaluate("() => document.documentElement.scrollWidth") <= width + 1   # no sideways scrolling
    finally:
        tab.close()
