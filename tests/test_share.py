"""eagleviz/app/share.py: a link round-trips a run's prompt and knobs; every bad parameter falls back to its
default with a one-line note, never an error, and the rest of the link still applies."""

from dataclasses import fields, replace
from urllib.parse import parse_qsl

import pytest

from eagleviz.app import presets, share
from eagleviz.app.limits import Limits
from eagleviz.app.session import Knobs

DEFAULTS = Knobs(steps=4, topk=1, draft_tokens=5, max_new_tokens=48)
LIMITS = Limits()
IDS = ("counting", "code")


def read(query, limits=LIMITS, **kw):
    return share.from_query(query, DEFAULTS, limits, gallery_ids=kw.pop("gallery_ids", IDS), **kw)


@pytest.mark.parametrize("prompt,knobs,preset", [
    ("List the numbers from 1 to 15, one per line.", DEFAULTS, None),
    ("Ünïcödé & = ? # % + spaces\nand a second line", Knobs(6, 8, 64, 0.8, 0.95, 200, 12345, "torch"), None),
    ("a fixed tree drafting from the prompt", Knobs(5, 2, 10, adaptive=False, source="eagle+lookup"), None),
    ("lookup only", Knobs(4, 3, 10, adaptive=True, source="lookup"), None),
    (presets.PRESETS[3].prompt, replace(DEFAULTS, temperature=0.8, top_p=0.123456789, seed=2**63 - 1),
     presets.PRESETS[3].name),
])
def test_a_link_round_trips(prompt, knobs, preset):
    query = share.to_query(prompt, knobs, preset)
    assert query.startswith("?prompt=")
    shared = read(query)
    assert shared == share.Shared(prompt=prompt, knobs=knobs, preset=preset)


def test_every_knob_is_written_and_read():
    """A knob added to Knobs must reach the link, or a shared run silently loses it."""
    names = [k for k, _ in parse_qsl(share.to_query("hi", DEFAULTS)[1:])]
    assert names == ["prompt", *(f.name for f in fields(Knobs))]


def test_a_blank_prompt_is_left_out_of_the_link():
    query = share.to_query(" ", DEFAULTS)
    assert "prompt" not in query and read(query) == share.Shared(prompt=None, knobs=DEFAULTS)


def test_a_mapping_and_pairs_read_like_a_query_string():
    query = share.to_query("hi", replace(DEFAULTS, steps=3))
    pairs = parse_qsl(query[1:])
    assert read(dict(pairs)) == read(pairs) == read(query)


def test_missing_parameters_keep_the_defaults():
    shared = read("")
    assert shared == share.Shared(prompt=None, knobs=DEFAULTS)
    assert read("?steps=6").knobs == replace(DEFAULTS, steps=6)


@pytest.mark.parametrize("name,value,why", [
    ("steps", "four", "whole number"),
    ("steps", "4.5", "whole number"),
    ("steps", "", "whole number"),
    ("steps", "-3", "negative"),
    ("steps", "0", "[1, 8]"),
    ("seed", "9" * 30, "whole number"),
    ("seed", str(2**63), "[0,"),
    ("temperature", "nan", "finite"),
    ("temperature", "NaN", "finite"),
    ("temperature", "inf", "finite"),
    ("temperature", "-inf", "finite"),
    ("temperature", "1e999", "finite"),
    ("temperature", "-0.5", "negative"),
    ("temperature", "0x1p-2", "a number"),
    ("temperature", "1_0", "a number"),
    ("top_p", "0", "[0.05, 1]"),
    ("attn_impl", "flash", "auto, torch, triton"),
    ("max_new_tokens", "0", "[1, 512]"),
    ("max_new_tokens", "513", "[1, 512] (this server's limit)"),
    ("draft_tokens", "65", "[2, 64] (this server's limit)"),
    ("adaptive", "yes", "0 or 1"),
    ("adaptive", "True", "0 or 1"),
    ("source", "medusa", "eagle, lookup, eagle+lookup"),
    ("source", "<b>x</b>", "eagle, lookup"),
])
def test_a_bad_parameter_falls_back_to_its_default_and_the_rest_applies(name, value, why):
    shared = read([("prompt", "hello"), ("seed", "7"), (name, value)] if name != "seed"
                  else [("prompt", "hello"), ("steps", "3"), (name, value)])
    assert getattr(shared.knobs, name) == getattr(DEFAULTS, name)
    assert shared.prompt == "hello"
    assert (shared.knobs.seed == 7) if name != "seed" else (shared.knobs.steps == 3)
    assert len(shared.notes) == 1 and why in shared.notes[0] and name in shared.notes[0]
    assert "\n" not in shared.notes[0]


@pytest.mark.parametrize("name,value,used", [("steps", "9", 8), ("topk", "17", 8), ("temperature", "2.5", 1.5),
                                             ("top_p", "1.5", 1.0), ("top_p", "0.01", 0.05)])
def test_a_value_past_the_pages_range_takes_the_sliders_end_and_says_so(name, value, used):
    """A link's knob is held to the page's slider, whose range is the one its note quotes (never the engine's wider
    one): past an end, that end is used."""
    shared = read([("prompt", "hello"), (name, value)])
    assert getattr(shared.knobs, name) == used
    assert len(shared.notes) == 1 and f"{used:g} is used" in shared.notes[0] and "range" in shared.notes[0]


def test_the_server_limits_decide_the_ranges():
    small = Limits(max_new_tokens=32, max_draft_tokens=8, max_prompt_chars=10)
    shared = read("?max_new_tokens=33&draft_tokens=9&steps=5&topk=4&prompt=" + "x" * 11, small)
    assert shared.knobs == replace(DEFAULTS, steps=5, topk=4) and shared.prompt is None
    assert len(shared.notes) == 3
    assert [any(limit in n for n in shared.notes) for limit in ("limit of 10;",
            "[2, 8] (this server's limit)", "[1, 32] (this server's limit)")] == [True] * 3
    assert read("?max_new_tokens=32&draft_tokens=8&prompt=" + "x" * 10, small).notes == ()


@pytest.mark.parametrize("prompt,why", [("%20%0A", "empty"), ("a%00b", "NUL")])
def test_an_unusable_prompt_keeps_the_pages(prompt, why):
    shared = read(f"?prompt={prompt}&steps=6")
    assert shared.prompt is None and shared.knobs.steps == 6 and why in shared.notes[0]


def test_unknown_and_repeated_parameters_are_noted_and_ignored():
    shared = read("?steps=6&steps=7&topk=2&colour=red&prompt=a&prompt=b&__theme=dark")
    assert shared.knobs == replace(DEFAULTS, topk=2) and shared.prompt is None
    assert shared.notes == ("Link parameter steps is given 2 times; its default is used.",
                            "Unknown link parameter 'colour' ignored.",
                            "Link parameter prompt is given 2 times; its default is used.")


def test_a_starlette_style_multi_mapping_shows_its_repeats():
    class MultiDict(dict):
        def __init__(self, pairs):
            super().__init__(pairs)
            self._pairs = pairs

        def multi_items(self):
            return list(self._pairs)

    shared = read(MultiDict([("steps", "6"), ("steps", "7")]))
    assert shared.knobs == DEFAULTS and "2 times" in shared.notes[0]


def test_notes_never_repeat_markup_from_the_link():
    shared = read("?%5Bclick%5D(http%3A%2F%2Fx)=1&steps=%3Cimg%20src%3Dx%3E")
    text = " ".join(shared.notes)
    assert "<" not in text and "[" not in text.replace("[1, 8]", "") and "http" not in text
    assert "(a 17-character value)" in text


def test_too_many_parameters_are_cut():
    shared = read("&".join(f"x{i}=1" for i in range(100)))
    assert len(shared.notes) == 1 + share.MAX_PARAMS and "100 parameters" in shared.notes[0]


def test_a_preset_brings_its_fixed_tree_unless_the_link_sets_the_knobs():
    code = presets.by_name()["Code"]
    shared = read([("preset", code.name)])
    k = shared.knobs
    assert (k.steps, k.topk, k.draft_tokens, k.adaptive) == (*code.tree, False) and shared.notes == ()
    shared = read([("preset", code.name), ("steps", "2"), ("adaptive", "1")])
    assert (shared.knobs.steps, shared.knobs.topk, shared.knobs.adaptive) == (2, code.tree[1], True)


def test_a_preset_sets_its_prompt_and_temperature_unless_the_link_overrides_them():
    story = presets.PRESETS[3]
    shared = read(share.to_query(story.prompt, DEFAULTS, story.name).replace("temperature=0", "temperature=0.5")
                  .replace("&prompt=", "&x="))
    assert shared.preset == story.name and shared.knobs.temperature == 0.5
    shared = read([("preset", story.name)])
    assert (shared.prompt, shared.knobs.temperature, shared.notes) == (story.prompt, story.temperature, ())
    shared = read([("preset", story.name), ("prompt", " "), ("temperature", "hot")])
    assert (shared.prompt, shared.knobs.temperature, len(shared.notes)) == (story.prompt, story.temperature, 2)


def test_unknown_presets_and_gallery_entries_are_refused():
    shared = read("?preset=Nope&gallery=..%2F..%2Fetc%2Fpasswd&steps=6")
    assert shared.preset is None and shared.gallery is None and shared.knobs.steps == 6
    assert len(shared.notes) == 2 and "presets" in shared.notes[0] and "gallery entries" in shared.notes[1]
    assert read("?gallery=code").gallery == "code"


def test_the_gallery_ids_default_to_the_shipped_gallery():
    from eagleviz.app import gallery

    first = gallery.entries()[0].id
    assert share.from_query({"gallery": first}, DEFAULTS, LIMITS).gallery == first


def test_a_tree_the_knobs_cannot_make_is_adjusted_as_on_the_page():
    """draft_tokens above the tree's cap is SGLang's adjustment, shown by Knobs.validity(), not a bad link."""
    shared = read("?steps=2&topk=2&draft_tokens=40")
    assert shared.notes == () and "Adjusted" in shared.knobs.validity()


def test_passthrough_parameters_are_returned_to_the_caller():
    shared = read("?layout=projector&steps=6", passthrough=("layout",))
    assert shared.extra == (("layout", "projector"),) and shared.notes == ()


def test_a_link_names_a_recorded_runs_picture():
    shared = read("?gallery=code&cycle=3&phase=Verify&token=2")
    assert shared.picture == share.Picture(3, "verify", 2) and shared.notes == ()
    assert read("?gallery=code&phase=4").picture == share.Picture(phase=4)
    assert read("?gallery=code").picture is None
    query = share.picture_query("code", 3, "verify", 2)
    assert query == "?gallery=code&cycle=3&phase=verify&token=2" and read(query).picture == share.Picture(3, "verify", 2)
    assert share.picture_query("code", 0) == "?gallery=code&cycle=0"


@pytest.mark.parametrize("query,why", [
    ("cycle=-1", "cycle='-1' must be a whole number from 0"),
    ("cycle=1.5", "cycle='1.5' must be a whole number from 0"),
    ("token=99999999", "token='99999999' must be a whole number from 0"),
    ("phase=commit", "phase='commit' must be one of draft, verify, accept, rewind or a frame number"),
    ("phase=%3Cb%3E", "phase=(a 3-character value) must be"),
])
def test_a_bad_picture_parameter_is_noted_and_ignored(query, why):
    shared = read(f"?gallery=code&{query}&steps=6")
    assert len(shared.notes) == 1 and why in shared.notes[0] and shared.notes[0].endswith("ignored.")
    assert shared.picture == share.Picture() and shared.knobs.steps == 6


def test_a_picture_without_a_recorded_run_is_noted_and_ignored():
    shared = read("?cycle=3&token=1&steps=6")
    assert shared.picture is None and shared.knobs.steps == 6
    assert shared.notes == ("Link parameter cycle and token: a picture needs a recorded run to show (gallery=...); "
                            "ignored.",)


@pytest.mark.parametrize("name,value,used", [("topk", "16", 8), ("steps", "12", 8), ("temperature", "2", 1.5),
                                             ("temperature", "1.7", 1.5)])
def test_a_value_past_the_pages_slider_is_held_to_the_sliders_end_with_a_note(name, value, used):
    """The engine takes topk 16 and T = 2, the page's sliders stop at 8 and 1.5: a link gets the slider's end,
    so the page shows the knob that will run, and says so in one line."""
    shared = read([("prompt", "hello"), (name, value)])
    assert getattr(shared.knobs, name) == used and shared.prompt == "hello"
    assert len(shared.notes) == 1 and "page's range" in shared.notes[0] and f"{used:g} is used" in shared.notes[0]
