"""A cycle taken away, end to end in headless Chromium (eagleviz.app.handout): the four views saved as one PNG, the
printable handout, one page on A4 and on Letter, with each view beside this cycle's explanation (where a browser
refuses the new tab, the handout comes as a file), and Play phases as a looping GIF.

Uses the page and browser tests/conftest.py starts once (same requirements: Debian's chromium and the Python
`playwright` package). The pictures go to artifacts/.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from test_app_browser import ARTIFACTS, CHROMIUM, PROSE_JS, open_accordion, open_page, prose, shot
from test_room_browser import open_picture

from eagleviz.app.handout import FRAME_CS, HEADINGS, LAST_FRAME_CS, SCALE, VIEWS

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]
EXPLAIN = "Explain these four views, with this cycle's numbers"
# The print dialog counted instead of opened (it would hold the tab), and whether every picture was drawn by then.
PRINT_STUB = ("window.print = () => { window.__printed = (window.__printed || 0) + 1; window.__drawn = "
              "[...document.images].every((i) => i.complete && i.naturalWidth > 0); };")
# The explanations as the page shows them, one per view (Gradio marks a box and its inner box alike).
WORDS_JS = ("() => [...document.querySelectorAll('#explain .ev-explain')].filter((e) => "
            "!e.parentElement.closest('.ev-explain')).map((e) => e.innerText.replace(/\\s+/g, ' ').trim())")
SIZES_JS = ("(ids) => ids.map((id) => { const l = document.querySelector('#' + id + ' .js-plotly-plot')._fullLayout; "
            "return [Math.round(l.width), Math.round(l.height)]; })")
# every view drawn by Plotly (the status line can show before the last of the four figures is laid out)
DRAWN_JS = ("(ids) => ids.every((id) => { const g = document.querySelector('#' + id + ' .js-plotly-plot'); "
            "return g && g._fullLayout; })")


def view_sizes(tab) -> list:
    """Each view's drawn size, once all four are drawn."""
    ids = [v for v, _ in VIEWS]
    tab.wait_for_function(DRAWN_JS, arg=ids, timeout=30_000)
    return tab.evaluate(SIZES_JS, ids)


def cycle_of(tab) -> str:
    return tab.evaluate("() => document.querySelector('#cycle-slider input[type=range]').value")


def saved(tab, button: str, name: str, path: Path) -> str:
    """Click a button over the explanations, save what it downloads as `path`; its file name must be `name` with
    the page's cycle in place of N. Returns the cycle."""
    open_accordion(tab, EXPLAIN)
    view_sizes(tab)   # the four views drawn first: the page makes the file from them (else it says none is drawn)
    tab.locator("#" + button).scroll_into_view_if_needed()
    with tab.expect_download() as info:
        tab.click("#" + button)
    k = cycle_of(tab)
    assert info.value.suggested_filename == name.replace("N", k)
    path.parent.mkdir(exist_ok=True)
    info.value.save_as(path)
    return k


def pages(pdf: bytes) -> int:
    return len(re.findall(rb"/Type\s*/Page(?!s)", pdf))


def test_the_four_views_are_saved_as_one_picture(browser, app_url):
    from PIL import Image

    tab = open_page(browser, app_url)
    try:
        path = ARTIFACTS / "h01_picture.png"
        k = saved(tab, "picture", "eagleviz-cycle-N.png", path)
        tab.wait_for_function(f"() => ({PROSE_JS})('handout-note').startsWith('Saved')", timeout=30_000)
        assert f"cycle {k}" in prose(tab, "handout-note")
        sizes = view_sizes(tab)
    finally:
        tab.close()
    image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
    pad, cell = 12 * SCALE, max(w for w, _ in sizes) * SCALE
    assert image.width == 2 * cell + 3 * pad
    rows = [max(sizes[0][1], sizes[1][1]) * SCALE, max(sizes[2][1], sizes[3][1]) * SCALE]
    head = image.height - sum(rows) - 3 * pad
    assert 30 * SCALE < head < 200 * SCALE, head   # the caption and the summary, a few lines
    for i, (w, h) in enumerate(sizes):   # each view drawn in its place: many colours, not an empty box
        x, y = pad + (i % 2) * (cell + pad), head + pad + (0 if i < 2 else rows[0] + pad)
        colours = image.crop((x, y, x + w * SCALE, y + h * SCALE)).getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 50, (VIEWS[i], len(colours))
    assert len(image.crop((0, 0, image.width, head)).getcolors(maxcolors=1 << 16) or range(99)) > 2   # words


@pytest.mark.parametrize("query, width", [("", 1280), ("?gallery=near-tie&cycle=1", 390)])
def test_the_handout_is_one_printed_page_of_the_four_views_and_their_explanations(browser, app_url, query, width):
    tab = open_picture(browser, app_url, query, width, 844) if query else open_page(browser, app_url)
    try:
        tab.context.add_init_script(PRINT_STUB)
        open_accordion(tab, EXPLAIN)
        words = tab.evaluate(WORDS_JS)
        caption = prose(tab, "cycle-caption")
        assert len(words) == 4 and all(words), words
        tab.locator("#handout").scroll_into_view_if_needed()
        with tab.expect_popup() as info:
            tab.click("#handout")
        sheet = info.value
        tab.wait_for_function(f"() => ({PROSE_JS})('handout-note').includes('handout')", timeout=30_000)
        k = cycle_of(tab)
        assert f"cycle {k}" in prose(tab, "handout-note")
        assert sheet.evaluate("() => [window.__printed, window.__drawn]") == [1, True]   # printed once, when drawn
        got = sheet.evaluate("() => ({title: document.title, caption: document.querySelector('.caption').innerText,"
                             " headings: [...document.querySelectorAll('.view h2')].map((h) => h.innerText),"
                             " words: [...document.querySelectorAll('.words')].map((w) => "
                             "w.innerText.replace(/\\s+/g, ' ').trim()), images: document.images.length, "
                             " links: document.querySelectorAll('a').length})")
        assert got["title"].endswith(f"(cycle {k})")
        assert got["headings"] == HEADINGS and got["images"] == 4 and got["links"] == 0
        assert got["words"] == words   # each view beside its own explanation, this cycle's numbers
        assert " ".join(got["caption"].split()) == " ".join(caption.split())
        for paper in ("A4", "Letter"):
            assert pages(sheet.pdf(format=paper)) == 1, paper
        sheet.set_viewport_size({"width": 900, "height": 1200})
        shot(sheet, f"h02_handout_{width}.png", full=True)
        sheet.close()
    finally:
        tab.close()


def test_a_browser_that_refuses_a_new_tab_gets_the_handout_as_a_file(browser, app_url, tmp_path):
    tab = open_page(browser, app_url)
    try:
        tab.evaluate("() => { window.open = () => null; }")
        saved(tab, "handout", "eagleviz-handout-cycle-N.html", tmp_path / "handout.html")
        tab.wait_for_function(f"() => ({PROSE_JS})('handout-note').includes('refused')", timeout=30_000)
    finally:
        tab.close()
    page = (tmp_path / "handout.html").read_text(encoding="utf-8")
    assert page.count("<img src=\"data:image/png;base64,") == 4 and all(h in page for h in HEADINGS)


def test_play_phases_are_saved_as_a_looping_gif_of_the_four_views(browser, app_url):
    from PIL import Image, ImageSequence

    tab = open_page(browser, app_url)
    try:
        open_accordion(tab, EXPLAIN)
        n = int(tab.evaluate("() => document.querySelector('#phase-slider input[type=range]').max")) + 1
        sizes = view_sizes(tab)
        tab.locator("#phases-gif").scroll_into_view_if_needed()
        with tab.expect_download(timeout=120_000) as info:
            tab.click("#phases-gif")
        k = cycle_of(tab)
        assert info.value.suggested_filename == f"eagleviz-cycle-{k}-phases.gif"
        path = ARTIFACTS / "h03_phases.gif"
        path.parent.mkdir(exist_ok=True)
        info.value.save_as(path)
        tab.wait_for_function(f"() => ({PROSE_JS})('handout-note').includes('phases of cycle')", timeout=30_000)
        assert f"the {n} phases of cycle {k}" in prose(tab, "handout-note")
    finally:
        tab.close()
    gif = Image.open(path)
    pad, head, cell = 12, 34, max(w for w, _ in sizes)
    rows = [max(sizes[0][1], sizes[1][1]), max(sizes[2][1], sizes[3][1])]
    assert gif.size == (2 * cell + 3 * pad, head + sum(rows) + 2 * pad) and gif.n_frames == n and gif.info["loop"] == 0
    frames = [(f.convert("RGB"), f.info["duration"]) for f in ImageSequence.Iterator(gif)]
    assert [d for _, d in frames] == [FRAME_CS * 10] * (n - 1) + [LAST_FRAME_CS * 10]
    assert len({f.tobytes() for f, _ in frames}) == n   # every phase draws something new
    for i, (w, h) in enumerate(sizes):   # each view drawn in its place in the end state
        x, y = pad + (i % 2) * (cell + pad), head + (0 if i < 2 else rows[0] + pad)
        assert len(frames[-1][0].crop((x, y, x + w, y + h)).getcolors(maxcolors=1 << 16)) > 20, VIEWS[i]
