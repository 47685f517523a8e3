"""The figures as drawn in headless Chromium, measured in the page: the accepted path of the Story preset at
T = 0.8 (its rows and labels apart, nothing clipped), a deep and wide draft tree (node labels apart, the
colour scale's labels apart), and a 390 x 844 phone (Run on the first screen; titles clear of Plotly's
toolbar, legends clear of titles and plots, the summary's panels stacked, nothing cut at the edges).

Every check reads boxes from getBoundingClientRect in the page, so it measures what a visitor sees, whatever
the server meant to draw. Uses the page and browser tests/conftest.py starts once (same requirements).
Screenshots go to artifacts/.
"""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import pytest

from test_app_browser import (CHROMIUM, open_page, page, playwright_sync,  # noqa: F401
                              run_and_wait, set_number, shot)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing: apt-get install -y chromium "
                                                           "fonts-dejavu-core"),
]

VIEWS = ("draft-tree", "attention-mask", "accepted-path", "kv-rewind")
TOL = 1.0   # px: boxes that touch do not overlap

# The boxes (left, top, right, bottom, in px of the window) of a figure's parts, each with its text.
PARTS_JS = """(id) => {
  const gd = document.querySelector('#' + id + ' .js-plotly-plot');
  if (!gd || !gd._fullLayout) return null;
  const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const all = sel => [...gd.querySelectorAll(sel)].map(e => [e.textContent, box(e)])
                                                   .filter(([t, b]) => b[2] - b[0] > 0 && b[3] - b[1] > 0);
  const chips = [...gd.querySelectorAll('.point')].filter(p => p.querySelector('.bartext-inside'))
                  .map(p => [p.querySelector('.bartext-inside').textContent, box(p.querySelector('.bartext-inside')),
                             box(p.querySelector('path'))]);
  const markers = [...gd.querySelectorAll('.scatterlayer .trace')].flatMap(t => {
    const trace = t.__data__[0].trace;
    return /markers/.test(trace.mode) ? [...t.querySelectorAll('.points .point')].map(m => [trace.name, box(m)]) : [];
  });
  // tick labels with their angle (Plotly turns crowded ones) and their height before turning
  const ticks = [...gd.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text')].map(e => {
    const turn = /rotate\((-?[0-9.]+)/.exec(e.getAttribute('transform') || '');
    return [e.textContent, box(e), turn ? +turn[1] : 0, e.getBBox().height];
  }).filter(([t, b]) => b[2] - b[0] > 0 && b[3] - b[1] > 0);
  return {figure: box(gd), title: all('.gtitle'), modebar: all('.modebar'), legends: all('.legend'),
          plots: all('.nsewdrag'), notes: all('.annotation-text'), labels: all('.textpoint text'),
          ticks: ticks.map(([t, b]) => [t, b]), turned_ticks: ticks, scale: all('.cbaxis text'),
          colour_bar: all('.colorbar'), bar_text: all('.bartext-inside'),
          axis_titles: all('.infolayer text[class$=title]:not(.gtitle)'),
          chips: chips, markers: markers};
}"""


def parts(page, elem_id: str) -> dict:
    page.wait_for_function("(id) => { const g = document.querySelector('#' + id + ' .js-plotly-plot'); "
                           "return g && g._fullLayout && g.data && g.data.length > 0; }", arg=elem_id, timeout=30_000)
    return page.evaluate(PARTS_JS, elem_id)


def overlap(a, b, tol: float = TOL) -> bool:
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def inside(a, b, tol: float = TOL) -> bool:
    return a[0] >= b[0] - tol and a[1] >= b[1] - tol and a[2] <= b[2] + tol and a[3] <= b[3] + tol


def apart(named: list, what: str) -> None:
    """No two of the (text, box) pairs overlap."""
    for (t1, b1), (t2, b2) in combinations(named, 2):
        assert not overlap(b1, b2), f"{what}: {t1!r} {b1} overlaps {t2!r} {b2}"


def ticks_apart(p: dict) -> None:
    """Level tick labels do not overlap; turned ones (all turned alike on an axis) are one line each, and
    neighbours' lines are at least a line's height apart across them."""
    level = [(t, b) for t, b, angle, _ in p["turned_ticks"] if not angle]
    apart(level, "tick labels")
    turned = sorted((b[2], abs(math.sin(math.radians(angle))), h, t) for t, b, angle, h in p["turned_ticks"] if angle)
    for (x1, sin, h, t1), (x2, _, _, t2) in zip(turned, turned[1:]):
        assert (x2 - x1) * sin >= h - TOL, f"turned tick labels {t1!r} and {t2!r} overlap"


def check_frame(p: dict, elem_id: str) -> None:
    """What every figure owes a visitor at any width: the title clear of the toolbar, the title, the legends
    and the plots clear of each other, tick labels apart, and no text cut by the figure's left or right edge."""
    fig, modebar = p["figure"], p["modebar"][0][1]
    for text, box in p["title"]:
        assert not overlap(box, modebar), f"{elem_id}: the title {text!r} {box} is under the toolbar {modebar}"
    blocks = ([("title", b) for _, b in p["title"]] + [("legend", b) for _, b in p["legends"]]
              + [("plot", b) for _, b in p["plots"]] + [("colour scale", b) for _, b in p["colour_bar"]])
    apart(blocks, f"{elem_id}: title, legends and plots")
    for text, box in p["ticks"] + p["axis_titles"] + p["notes"] + p["labels"]:
        for kind, block in blocks[:len(p["title"]) + len(p["legends"])]:
            assert not overlap(box, block), f"{elem_id}: {text!r} {box} overlaps the {kind} {block}"
    ticks_apart(p)
    edge = [fig[0], -1e9, fig[2], 1e9]
    for text, box in p["title"] + p["legends"] + p["ticks"] + p["axis_titles"] + p["notes"] + p["scale"]:
        assert inside(box, edge), f"{elem_id}: {text!r} {box} is cut by the figure's edge {fig[0]}..{fig[2]}"


# ------------------------------------------------------------------ the accepted path at T = 0.8

def check_path(p: dict) -> None:
    """The grid's labels (each within its chip) do not overprint each other, the rows are spaced by their
    labels, and the p, q, u panel's token labels are whole and apart."""
    grid = p["plots"][0][1]
    centre = lambda b: ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)  # noqa: E731
    labels = [(t, b) for t, b in p["bar_text"] + p["labels"]
              if grid[0] <= centre(b)[0] <= grid[2] and grid[1] <= centre(b)[1] <= grid[3]]
    assert labels, "no grid labels drawn"
    apart(labels, "grid labels")
    for text, label, chip in p["chips"]:
        assert inside(label, chip), f"chip label {text!r} {label} spills out of its chip {chip}"
    rows = sorted((b for _, b in p["ticks"] if b[2] <= grid[0] + TOL and grid[1] <= b[1] <= grid[3]),
                  key=lambda b: b[1])
    assert len(rows) >= 3, rows
    pitch = min(b2[1] - b1[1] for b1, b2 in zip(rows, rows[1:]))
    tallest = max(b[3] - b[1] for _, b in labels)
    assert pitch >= tallest, f"rows {pitch:.0f} px apart for labels {tallest:.0f} px tall"


def test_the_story_presets_accepted_path_at_t_0_8_is_readable(page):
    page.get_by_role("radio", name="Story, sampled at T = 0.8").click()
    page.wait_for_function("() => document.querySelector('#prompt textarea').value.startsWith('Tell me a short')",
                           timeout=30_000)
    set_number(page, "max-new-tokens", 32)
    run_and_wait(page)
    for step in range(3):
        p = parts(page, "accepted-path")
        names = page.evaluate("() => document.querySelector('#accepted-path .js-plotly-plot').data.map(t => t.name)")
        assert any((n or "").startswith("p(x)") for n in names), names   # sampled: the p, q, u panel is drawn
        check_path(p)
        check_frame(p, "accepted-path")
        if step == 0:
            page.locator("#accepted-path").scroll_into_view_if_needed()
            shot(page, "f01_story_path_t08_1280x800.png")
        title = p["title"][0][0]
        page.click("#next")
        page.wait_for_function("(t) => { const g = document.querySelector('#accepted-path .js-plotly-plot'); "
                               "return g && g.layout.title && g.layout.title.text.replace(/<[^>]+>/g, '') !== t; }",
                               arg=title, timeout=30_000)


# ------------------------------------------------------------------ a deep, wide tree

def check_tree(p: dict) -> None:
    """Node labels apart from each other and from the other nodes; the colour scale's labels apart."""
    labels = p["labels"]
    assert labels, "no node labels drawn"
    apart(labels, "node labels")
    nodes = [(name, box) for name, box in p["markers"] if name in ("accepted", "rejected", "verified, not reached",
                                                                    "root (last committed)", "bonus (target's own)")]
    for text, label in labels:
        hit = [(name, box) for name, box in nodes if overlap(label, box, tol=2)]
        assert len(hit) <= 1, f"node label {text!r} {label} lies on other nodes {hit}"
    assert len(p["scale"]) == 5
    apart(p["scale"], "colour scale labels")


def test_a_deep_wide_tree_keeps_its_labels_apart(page):
    set_number(page, "max-new-tokens", 16)
    for knob, value in (("steps", 8), ("topk", 6), ("draft-tokens", 64)):
        set_number(page, knob, value)
    page.wait_for_function("() => document.querySelector('#draft-tokens input[type=number]').value === '64'",
                           timeout=30_000)
    run_and_wait(page)
    p = parts(page, "draft-tree")
    check_tree(p)
    check_frame(p, "draft-tree")
    depth = page.evaluate("() => document.querySelector('#draft-tree .js-plotly-plot').layout.yaxis.tickvals.length")
    assert depth >= 5
    per_level = (p["plots"][0][1][3] - p["plots"][0][1][1]) / (depth - 1 + 1.2)
    assert per_level >= 40, f"{per_level:.0f} px per level"
    page.locator("#draft-tree").scroll_into_view_if_needed()
    shot(page, "f02_deep_tree_8_6_64_1280x800.png")


# ------------------------------------------------------------------ a phone

def test_on_a_phone_run_is_on_the_first_screen_and_the_figures_keep_apart(browser, app_url):
    tab = open_page(browser, app_url, 390, 844)
    try:
        # the page's own style sheet arrives a moment after its components: the first screen as it settles
        try:
            tab.wait_for_function("() => document.querySelector('#run').getBoundingClientRect().bottom <= 844",
                                  timeout=60_000)
        except playwright_sync.TimeoutError:
            run = tab.evaluate("() => document.querySelector('#run').getBoundingClientRect().bottom")
            pytest.fail(f"Run ends {run:.0f} px down, below a 844-px screen")
        shot(tab, "f03_phone_first_screen_390x844.png")
        set_number(tab, "max-new-tokens", 24)
        run_and_wait(tab)
        for elem_id in VIEWS + ("summary-plot",):
            p = parts(tab, elem_id)
            check_frame(p, elem_id)
            tab.locator(f"#{elem_id}").scroll_into_view_if_needed()
            shot(tab, f"f04_phone_{elem_id}_390x844.png")
        summary = parts(tab, "summary-plot")
        plots = sorted((b for _, b in summary["plots"]), key=lambda b: b[1])
        assert len(plots) == 3
        for upper, lower in zip(plots, plots[1:]):
            assert upper[3] <= lower[1], f"summary panels {upper} and {lower} are not one above the other"
        apart(summary["notes"] + summary["legends"] + summary["axis_titles"], "summary names, legends, axis titles")
        tree = parts(tab, "draft-tree")
        check_tree(tree)
        assert tab.evaluate("() => document.documentElement.scrollWidth") <= 391   # no sideways scrolling
    finally:
        tab.close()


# ------------------------------------------------------------------ margins Plotly keeps: each figure laid out once

# The views' widths at the page's three sizes: 1280 x 800, 1024 x 768 with ?projector=1, a 390-px phone.
VIEW_WIDTHS = (598, 693, 324)

DRAW_JS = """async ([figures, width]) => {
  const div = document.createElement('div'); div.style.width = width + 'px'; document.body.appendChild(div);
  const moved = [];
  for (const [name, fig] of figures) {
    Plotly.purge(div);
    await Plotly.newPlot(div, fig.data, fig.layout);
    const asked = fig.layout.margin, got = div._fullLayout._size;
    for (const side of ['l', 'r', 't', 'b'])
      if (Math.abs(got[side] - asked[side]) > 0.01) moved.push([name, side, asked[side], got[side]]);
  }
  div.remove();
  return moved;
}"""


def test_plotly_keeps_each_views_margins_so_it_lays_each_figure_out_once(page):
    """Plotly widens a margin a legend or an axis's labels need and then lays the figure out again (half of a
    step's drawing, docs/performance.md entry 62): the four views of recorded cycles, greedy and sampled, short
    and long token labels, and each run's summary, drawn by the page's Plotly at each size's width, keep the
    margins the server gave."""
    import json

    from eagleviz.app import gallery
    from eagleviz.visuals.summary import summary_figure
    from eagleviz.visuals.views import cycle_figures

    figures = []
    for entry in gallery.entries():
        run = gallery.load(entry.id)
        figures.append((f"{entry.id} summary", json.loads(summary_figure(run).to_json())))
        for cycle in run.cycles[:: max(1, len(run.cycles) // 2)]:  # the first, a middle one and (in some) a late one
            views = cycle_figures(run, cycle.index)
            figures += [(f"{entry.id} cycle {cycle.index} {name}", json.loads(getattr(views, name).to_json()))
                        for name in ("tree", "mask", "path", "kv")]
    assert len(figures) > 70
    page.wait_for_function("() => window.Plotly", timeout=60_000)
    for width in VIEW_WIDTHS:
        moved = page.evaluate(DRAW_JS, [figures, width])
        assert not moved, f"at {width} px Plotly moved margins (figure, side, asked, kept): {moved[:8]}"


def test_the_glyph_widths_margins_are_sized_from_are_the_pages_font(page):
    """`fit.label_px`'s table is DejaVu Sans as Chromium's canvas measures it (regular and bold)."""
    from eagleviz.visuals.fit import _BOLD, _GLYPHS, _REGULAR

    if not page.evaluate("() => document.fonts.check('14px \"DejaVu Sans\"')"):
        pytest.skip("DejaVu Sans is not installed (apt-get install -y fonts-dejavu-core)")
    measured = page.evaluate("""(chars) => { const c = document.createElement('canvas').getContext('2d');
      return ['normal', 'bold'].map(w => { c.font = w + ' 1000px "DejaVu Sans"';
                                          return [...chars].map(ch => c.measureText(ch).width); }); }""", _GLYPHS)
    for table, widths in zip((_REGULAR, _BOLD), measured):
        off = [(ch, want, round(got)) for ch, want, got in zip(_GLYPHS, table, widths) if abs(got - want) > 1]
        assert not off, off
