"""End to end in headless Chromium: type a prompt, run, check the four figures against the exported trace,
step to another cycle, change knobs and run again, import an exported trace. Screenshots go to artifacts/.

Needs Debian's chromium (`apt-get install -y chromium fonts-dejavu-core`) and the Python `playwright`
package (never `playwright install`). Runs the embedded SmolLM2 target with the default head.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
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
                                     n: (t.x || []).length, y: t.y || [], zrows: t.z ? t.z.length : 0,
                                     zcols: t.z && t.z.length ? t.z[0].length : 0})),
          arrows: (gd.layout.annotations || []).filter(a => a.showarrow).length};
}"""


@pytest.fixture(scope="module")
def app_url():
    from eagleviz.models.loading import load_engine
    from eagleviz.ui import CSS, build_app
    from servers import serving

    with serving(build_app(load_engine(), model_id="HuggingFaceTB/SmolLM2-135M-Instruct"), css=CSS) as url:
        yield url


@pytest.fixture(scope="module")
def page(app_url):
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        tab = browser.new_page(viewport={"width": 1280, "height": 800}, accept_downloads=True)
        tab.goto(app_url)
        tab.wait_for_selector("#run", timeout=60_000)
        yield tab
        browser.close()


def set_number(page, elem_id: str, value) -> None:
    """Type into the number box of a slider or number component, then commit it."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")
    box.blur()


def run_and_wait(page) -> None:
    page.click("#run")
    page.wait_for_function("() => /^(Done|\\u26a0)/.test(document.querySelector('#status').innerText.trim())",
                           timeout=RUN_TIMEOUT_MS)
    assert page.locator("#status").inner_text().startswith("Done"), page.locator("#status").inner_text()


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
        page.wait_for_function("(b) => b.classList.contains('open')", arg=button.element_handle(), timeout=10_000)


def check_cycle_figures(page, cycle: dict) -> None:
    """The four figures of the selected cycle carry the trace's node, cell and slot counts."""
    tree = figure(page, "draft-tree")
    kept = sum(n["kept"] for n in cycle["nodes"])
    names = {t["name"]: t["n"] for t in tree["traces"] if t["name"]}
    assert f"Cycle {cycle['index']}" in tree["title"]
    assert names.get("pruned by reranking", 0) == len(cycle["nodes"]) - kept
    tried = ("accepted by the target", "rejected by the target", "verified, not reached")
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
    check_cycle_figures(page, first["cycles"][0])
    page.locator("#draft-tree").scroll_into_view_if_needed()
    shot(page, "02_cycle0_tree.png")
    shot(page, "03_after_run_full.png", full=True)

    # step to another cycle: the figures follow, without recomputation
    page.click("#next")
    page.wait_for_function("() => document.querySelector('#cycle-caption').innerText.includes('Cycle 1')",
                           timeout=30_000)
    page.wait_for_function("() => (document.querySelector('#draft-tree .js-plotly-plot').layout.title.text || '')"
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
    check_cycle_figures(page, second["cycles"][0])
    open_accordion(page, "Losslessness at T > 0: replay the acceptance step")
    replay = figure(page, "replay")
    assert "replays of the acceptance step" in replay["title"]
    shot(page, "05_chain_sampling_full.png", full=True)

    # import the first run: it replaces the second, nothing is computed
    page.locator("#import input[type=file]").set_input_files(str(first_path))
    page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Imported')",
                           timeout=60_000)
    assert f"{len(first['cycles'])} cycles" in page.locator("#status").inner_text()
    check_cycle_figures(page, first["cycles"][0])
    assert "sglang.launch_server" in page.locator("#launch-flags").inner_text()
    shot(page, "06_imported.png", full=True)


def test_stop_ends_a_long_run_cleanly(page):
    set_number(page, "max-new-tokens", 256)
    page.click("#run")
    page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Running\u2026 cycle')",
                           timeout=RUN_TIMEOUT_MS)
    page.click("#stop")
    page.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Done: stopped by the user')",
                           timeout=60_000)
    assert "\u03c4 =" in page.locator("#summary").inner_text()
    shot(page, "07_stopped.png")
