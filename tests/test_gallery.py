"""eagleviz/app/gallery.py and assets/gallery/: every shipped entry loads as a validated trace with no model,
says what its trace measured, and matches the preset and knobs it names; bad ids and a damaged gallery are
refused in one line."""

import datetime
import json
import re
import shutil
import subprocess
import sys
import pytest

from eagleviz.app import gallery, presets
from eagleviz.app.session import read_trace

ENTRIES = gallery.entries()
DESCRIPTION = re.compile(r"tau (\d+\.\d\d): (\d+) new tokens in (\d+) cycles, tree (\d+) / (\d+) / (\d+), "
                         r"T = ([0-9.]+), (\w+(?: \w+)?)")


def test_the_gallery_holds_every_preset_with_its_tree_and_the_fastest_tree():
    assert {e.preset for e in ENTRIES} == {p.name for p in presets.PRESETS}
    for p in presets.PRESETS:
        own = [e for e in ENTRIES if e.preset == p.name and not e.id.endswith("-fastest-tree")]
        assert len(own) == 1 and (own[0].knobs.steps, own[0].knobs.topk, own[0].knobs.draft_tokens) == p.tree
        assert own[0].knobs.adaptive is False
    fastest = [e for e in ENTRIES if e.id.endswith("-fastest-tree")]
    assert [e.preset for e in fastest] == [next(p.name for p in presets.PRESETS if p.shows == "high")]


def test_the_shipped_gallery_is_small():
    sizes = {e.id: (gallery.GALLERY_DIR / e.file).stat().st_size for e in ENTRIES}
    assert max(sizes.values()) < 500_000 and sum(sizes.values()) < 2_000_000, sizes


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_each_entry_loads_and_its_description_is_what_the_trace_measured(entry):
    run = gallery.load(entry.id)
    assert run.to_json() == read_trace(gallery.GALLERY_DIR / entry.file).to_json()
    tau, tokens, cycles, steps, topk, draft, temperature, dtype = DESCRIPTION.fullmatch(entry.description).groups()
    committed = sum(len(c.committed) for c in run.cycles)
    assert float(tau) == round(committed / len(run.cycles), 2)
    assert (int(tokens), int(cycles), dtype) == (len(run.output), len(run.cycles), run.numerics)
    assert {k: int(v) for k, v in zip(("steps", "topk", "draft_tokens"), (steps, topk, draft))} == {
        k: run.config["tree"][k] for k in ("steps", "topk", "draft_tokens")}
    assert float(temperature) == run.config["sampling"]["temperature"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_each_entry_was_recorded_with_the_prompt_and_knobs_it_names(entry):
    run = gallery.load(entry.id)
    preset = presets.by_name()[entry.preset]
    assert entry.prompt == run.prompt == preset.prompt
    tree, sampling = entry.knobs.configs()
    assert vars(sampling) == run.config["sampling"] and sampling.temperature == preset.temperature
    assert {k: run.config["tree"][k] for k in ("steps", "topk", "draft_tokens")} == {
        "steps": tree.steps, "topk": tree.topk, "draft_tokens": tree.draft_tokens}
    assert entry.head == run.head and not entry.head.startswith("random")
    assert datetime.date.fromisoformat(entry.recorded) and entry.cpu


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_each_entry_was_recorded_in_the_numerics_the_presets_quote(entry):
    """From the model file's weight blocks, as the presets' quotes were measured (the same numbers on every
    CPU): the recorded near-tie run is then EAGLE's exact text, as its note says a race shows."""
    run = gallery.load(entry.id)
    assert run.weights == presets.MEASURED_WEIGHTS, (entry.id, run.weights)
    if not entry.id.endswith("-fastest-tree"):  # each preset's own tree: the tau its note quotes
        tau = sum(len(c.committed) for c in run.cycles) / len(run.cycles)
        assert abs(tau - presets.MEASURED_TAU[presets.by_name()[entry.preset].shows]) <= 0.05, entry.id


def test_loading_the_gallery_runs_no_model(monkeypatch):
    """Replaying must cost nothing on a busy CPU: no target or head is built, and in a fresh interpreter
    loading every entry never imports transformers."""
    from eagleviz.decoding import load as loading
    from eagleviz.models import draft

    def refuse(*args, **kwargs):
        raise AssertionError("the gallery loaded a model")

    for module, name in ((loading, "load_target"), (loading, "load_engine"), (draft, "load_head")):
        monkeypatch.setattr(module, name, refuse)
    for e in ENTRIES:
        gallery.load(e.id)
    code = ("import sys; from eagleviz.app import gallery; [gallery.load(e.id) for e in gallery.entries()]; "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_each_load_returns_a_new_run():
    first = gallery.load(ENTRIES[0].id)
    first.cycles.clear()
    assert gallery.load(ENTRIES[0].id).cycles


@pytest.mark.parametrize("bad", ["nope", "", "Counting", "counting.json", "../index", "../../etc/passwd"])
def test_unknown_ids_are_refused(bad):
    with pytest.raises(gallery.GalleryError, match="no gallery entry") as info:
        gallery.load(bad)
    assert ENTRIES[0].id in str(info.value) and "/" not in str(info.value).split(";")[0]


@pytest.fixture
def copy(tmp_path):
    """A copy of the shipped gallery to damage."""
    folder = tmp_path / "gallery"
    shutil.copytree(gallery.GALLERY_DIR, folder)
    return folder


def test_a_missing_gallery_says_so(tmp_path):
    with pytest.raises(gallery.GalleryError, match="missing"):
        gallery.entries(tmp_path)


def _rewrite_index(folder, change):
    path = folder / gallery.INDEX_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(version=2), "not a version-1 index"),
    (lambda d: d.pop("entries"), "not a version-1 index"),
    (lambda d: d["entries"][0].update(id="Bad Id"), "lowercase"),
    (lambda d: d["entries"][0].update(file="../../escape.json"), "inside the gallery"),
    (lambda d: d["entries"][0].update(file="index.txt"), "inside the gallery"),
    (lambda d: d["entries"][0].pop("cpu"), "exactly the fields"),
    (lambda d: d["entries"][0].update(title=3), "wrong type"),
    (lambda d: d["entries"][0]["knobs"].update(steps=0), "steps"),
    (lambda d: d["entries"][0]["knobs"].update(colour="red"), "knobs must have"),
    (lambda d: d["entries"][0]["knobs"].update(steps="4"), "knob steps has the wrong type"),
    (lambda d: d["entries"][0]["knobs"].update(seed=True), "knob seed has the wrong type"),
    (lambda d: d["entries"].append(d["entries"][0]), "twice"),
])
def test_a_damaged_index_is_refused(copy, change, message):
    _rewrite_index(copy, change)
    with pytest.raises(gallery.GalleryError, match=re.escape(message)):
        gallery.entries(copy)


def test_an_index_that_is_not_json_is_refused(copy):
    (copy / gallery.INDEX_FILE).write_text("{not json")
    with pytest.raises(gallery.GalleryError, match="cannot be read"):
        gallery.entries(copy)


@pytest.mark.parametrize("damage", [lambda t: t[: len(t) // 2], lambda t: "",
                                    lambda t: re.sub(r'"accept_length":(\d+)', r'"accept_length":"\1"', t, count=1)])
def test_a_damaged_trace_is_refused_with_its_entry_named(copy, damage):
    entry = ENTRIES[0]
    path = copy / entry.file
    path.write_text(damage(path.read_text()))
    with pytest.raises(gallery.GalleryError, match=f"gallery entry '{entry.id}'"):
        gallery.load(entry.id, copy)


def test_a_missing_trace_file_is_refused(copy):
    (copy / ENTRIES[0].file).unlink()
    with pytest.raises(gallery.GalleryError, match="could not be read"):
        gallery.load(ENTRIES[0].id, copy)


def test_an_entry_round_trips_through_its_index_row():
    for e in ENTRIES:
        assert gallery.GalleryEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e
