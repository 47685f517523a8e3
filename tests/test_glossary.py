"""eagleviz/app/glossary.py: each word a learner meets is explained once, and the page's texts link the first use
of each to its entry; the page's own symbols draw with DejaVu Sans (no emoji font needed)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from eagleviz.app import gallery, glossary, navigation, presets, ui
from eagleviz.visuals.explain import summary_text

LINK = re.compile(r"\]\(#(g-[\w-]+)\)")
ASKED = ("tau", "accept length", "alpha", "acceptance rate", "prefill", "KV cache", "bf16", "logit", "residual",
         "frontier", "draft tree", "verification", "bonus token", "rejection sampling", "cost-aware tree", "lookup")


def test_every_term_has_one_entry_with_its_anchor():
    anchors = [t.anchor for t in glossary.TERMS]
    assert len(set(anchors)) == len(anchors) and all(a.startswith(glossary.ANCHOR_PREFIX) for a in anchors)
    text = glossary.markdown()
    assert all(f'<a id="{a}"></a>' in text for a in anchors)
    words = {w.lower() for t in glossary.TERMS for w in t.words}
    assert {w.lower() for w in ASKED} <= words


def test_the_first_use_of_a_term_is_linked_once_outside_code_links_and_headings():
    text = ("### Tour 2 \u00b7 Verify (cycle 0)\n\nThe **draft tree** has tau 2 and a `tau` in code, [a link](#x), "
            "the KV cache, then the draft tree and tau again. 0-\u03b1 0.50")
    linked = glossary.link_terms(text)
    assert linked.startswith("### Tour 2 \u00b7 Verify (cycle 0)\n")               # headings stay as they are
    assert "**[draft tree](#g-draft-tree)**" in linked and "[tau](#g-tau) 2" in linked
    assert "`tau`" in linked and "[a link](#x)" in linked and "[KV cache](#g-kv)" in linked
    assert linked.count("#g-draft-tree") == 1 and linked.count("#g-tau") == 1
    assert "[0-\u03b1](#g-alpha)" in linked
    assert re.sub(r"\[([^\]]*)\]\(#g-[\w-]+\)", r"\1", linked) == text              # only links added
    assert glossary.link_terms(linked) == linked                                     # and never twice
    assert glossary.link_terms("") == ""


def test_the_pages_texts_link_their_terms_to_the_glossary():
    """Across the recorded runs (every preset), the intro, the preset notes, the summary, the tour and the four
    views' explanations reach every entry but two: the frontier, a word of the draft tree's figure, and the
    cost-aware tree, the label of its switch and of a cost-aware run's caption (the recorded runs use fixed
    trees)."""
    texts = [glossary.link_terms(ui.INTRO), *(presets.note(p) for p in presets.PRESETS)]
    for e in gallery.entries():
        run = gallery.load(e.id)
        texts.append(glossary.link_terms(summary_text(run)))
        for i in range(0, len(run.cycles), 4):
            view = navigation.view_values(run, i)
            texts += [view[10], view[11], view[12], view[13], view[15]]
            texts += [navigation.tour_text(run, i, k) for k in range(4)]
    reached = {a for t in texts for a in LINK.findall(t)}
    assert {t.anchor for t in glossary.TERMS} - reached <= {"g-frontier", "g-cost-aware"}, reached


def _page_symbols() -> dict[str, set[str]]:
    """Every character above ASCII in the app's and the figures' string constants, with the files using it."""
    root = Path(__file__).resolve().parents[1] / "eagleviz"
    found: dict[str, set[str]] = {}
    for path in [*root.glob("app/*.py"), *root.glob("visuals/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for c in node.value:
                    if ord(c) > 127:
                        found.setdefault(c, set()).add(path.name)
    return found


@pytest.mark.skipif(shutil.which("fc-list") is None, reason="fontconfig's fc-list is missing")
def test_the_pages_symbols_draw_with_dejavu_sans():
    """A room's laptops may have no emoji font: each icon the page prints must be in DejaVu Sans (the font the
    browser tests install, fonts-dejavu-core)."""
    if "DejaVu Sans" not in subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True).stdout:
        pytest.skip("DejaVu Sans is not installed (apt-get install -y fonts-dejavu-core)")
    missing = {f"U+{ord(c):04X} {c}": sorted(files) for c, files in _page_symbols().items()
               if "DejaVu Sans" not in subprocess.run(["fc-list", f":charset={ord(c):x}", "family"],
                                                      capture_output=True, text=True).stdout}
    assert not missing, missing
