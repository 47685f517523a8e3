"""eagleviz/app/workshop.py: a link restores a run's prompt and knobs (bad parameters give defaults and a note),
recorded runs replay with no model work, and the queue says when runs are ahead."""

from __future__ import annotations

import asyncio
import types
from urllib.parse import unquote

import gradio as gr
import pytest
from starlette.datastructures import QueryParams

from eagleviz.app import gallery, workshop
from eagleviz.app.handlers import Handlers, StopRequest
from eagleviz.app.limits import Limits
from eagleviz.app.navigation import VIEW_SIZE
from eagleviz.app.pairs import Pair, PairHub
from eagleviz.app.session import Knobs

DEFAULTS = Knobs(steps=4, topk=1, draft_tokens=5, max_new_tokens=48)
RUN = 8 + VIEW_SIZE   # the run outputs come first, then prompt, preset, note, the knobs, model, projector, notes,
#                       the recorded run shown
SETTINGS = workshop.SETTINGS_SIZE


def settings(out) -> tuple:
    return out[RUN:RUN + SETTINGS]


def tail(out) -> tuple:
    return out[RUN + SETTINGS:]


class NoModel:
    def __getattr__(self, name):
        raise AssertionError("a model was used")


@pytest.fixture
def handlers():
    pairs = PairHub((Pair("small"), Pair("large", "some/model")), load=lambda pair: NoModel())
    return Handlers(pairs, Limits())


def request(query: str):
    return types.SimpleNamespace(query_params=QueryParams(query))


def test_a_link_restores_prompt_knobs_model_and_layout(handlers):
    link = workshop.link_for("Count to 5", None, "large", 6, 3, 12, 0.5, 0.9, 40, 7, "torch", False, "eagle+lookup")
    query = link[link.index("(?") + 1:link.index(")")]
    assert "adaptive=0" in query and "source=eagle%2Blookup" in query
    out = workshop.open_link(handlers, DEFAULTS, request(query[1:] + "&projector=1"))
    assert len(out) == RUN + SETTINGS + 4
    prompt, preset, note, *knobs = settings(out)
    assert prompt == "Count to 5" and preset is None and note == ""
    assert tuple(knobs) == (6, 3, 12, 0.5, 0.9, 40, 7, "torch", False, "eagle+lookup")
    assert tail(out) == ("large", True, "", gr.skip())
    assert all(v == gr.skip() for v in out[:RUN])   # no gallery entry named: the run is left as it is


def test_bad_parameters_give_defaults_and_a_visible_note_never_an_error(handlers):
    out = workshop.open_link(handlers, DEFAULTS,
                             request("steps=banana&topk=99&model=/etc/passwd&projector=yes&temperature=nan&x=1"))
    knobs = settings(out)[3:]
    assert knobs[0] == DEFAULTS.steps and knobs[3] == DEFAULTS.temperature
    assert knobs[1] == 8   # past the page's range: its end, said
    model, projector, notes, _ = tail(out)
    assert model == gr.skip() and projector is False
    for word in ("steps", "topk", "temperature", "model this server does not offer", "projector", "Unknown"):
        assert word in notes
    assert "/etc/passwd" not in notes


@pytest.mark.parametrize("query", ["", "projector=1", "__theme=dark"])
def test_a_plain_visit_opens_on_the_first_presets_recorded_run_and_keeps_the_preset(handlers, query, monkeypatch):
    """No settings in the link (a plain visit, a projector link): the page opens on the first preset's recorded
    run at its opening cycle, with no model work, the preset and its lesson note selected, and one line
    inviting Run."""
    import eagleviz.decoding.load as loading
    from eagleviz.app import navigation, presets

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("a model was loaded"))
    entry = workshop.arrival_entry()
    assert gallery.entry(entry).preset == presets.PRESETS[0].name
    out = workshop.open_link(handlers, DEFAULTS, request(query))
    run = out[0]
    assert run.token_ids == gallery.load(entry).token_ids
    assert out[8 + 1].startswith(f"**Cycle {navigation.instructive_cycle(run)}** of")   # the caption: its telling cycle
    assert "Press **\u25b6 Run**" in out[2] and "no model work" in out[2] and "\n" not in out[2]
    assert all(v == gr.skip() for v in settings(out))    # the page's own: the first preset's, its note included
    first = presets.PRESETS[0]
    assert gallery.entry(entry).prompt == first.prompt and gallery.entry(entry).knobs == presets.knobs(first,
                                                                                                      DEFAULTS)
    assert tail(out) == (gr.skip(), query == "projector=1", "", entry)


def test_a_picked_preset_shows_its_own_recorded_run_and_says_whose_it_is(handlers, monkeypatch):
    """Each preset brings its own recording (made with its tree and temperature), whose tau the status line
    quotes, never the last preset's picture under the new one's settings; no model work."""
    import eagleviz.decoding.load as loading
    from eagleviz.app import presets

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("a model was loaded"))
    shown = set()
    for p in presets.PRESETS:
        entry = workshop.preset_entry(p.name)
        e = gallery.entry(entry)
        assert e.preset == p.name and (e.knobs.steps, e.knobs.topk, e.knobs.draft_tokens) == p.tree
        out = workshop.preset_opened(handlers, p.name)
        assert len(out) == RUN + 1 and out[-1] == entry
        assert out[0].token_ids == gallery.load(entry).token_ids and out[0].prompt == p.prompt
        tau = e.description.split(":")[0]
        assert tau in out[2] and "no model work" in out[2]
        shown.add(tau)
    assert len(shown) > 1                                         # the presets' recordings differ
    assert workshop.preset_entry("Counting (high acceptance)") == "counting"   # its own tree, not the fastest
    assert workshop.preset_opened(handlers, None) == (gr.skip(),) * (RUN + 1)
    monkeypatch.setattr(gallery, "entries", lambda: [])
    none = workshop.preset_opened(handlers, presets.PRESETS[1].name)
    assert none[-1] is None and "no recorded run" in none[2] and none[0] == gr.skip()


def test_the_line_above_the_views_invites_run_while_a_recorded_run_is_shown():
    entry = workshop.arrival_entry()
    line = workshop.invitation(entry)
    assert f"**{gallery.entry(entry).title}**" in line and "no model work" in line and "\n" not in line
    assert "[Press \u25b6 Run](#run)" in line                      # the link goes to Run, a screen above
    assert workshop.invitation(entry, room=True) == ""             # a room's page shows the instructor's run
    assert workshop.invitation(None) == "" and workshop.invitation("no-such-entry") == ""


def test_a_rooms_link_paints_no_picture_of_its_own(handlers):
    """A page that joins a room shows the instructor's picture, sent by its stream: the arrival's recorded run,
    drawn by the page's load as well, could land after the room's picture and replace it."""
    out = workshop.open_link(handlers, DEFAULTS, request("room=ABCDE"))
    assert all(v == gr.skip() for v in out[:RUN + SETTINGS]) and tail(out) == (gr.skip(), False, "", gr.skip())
    assert workshop.room_joined(request("room=abcde"))[0] == "ABCDE"


def test_without_a_gallery_a_plain_visit_changes_nothing(handlers, monkeypatch):
    monkeypatch.setattr(workshop, "arrival_entry", lambda: None)
    out = workshop.open_link(handlers, DEFAULTS, request("projector=1"))
    assert all(v == gr.skip() for v in out[:RUN + SETTINGS]) and tail(out) == (gr.skip(), True, "", gr.skip())


def test_a_link_to_a_recorded_run_replays_it_with_its_prompt_and_knobs_and_no_model(handlers, monkeypatch):
    import eagleviz.decoding.load as loading

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: pytest.fail("a model was loaded"))
    first = gallery.entries()[-1]
    out = workshop.open_link(handlers, DEFAULTS, request(f"gallery={first.id}"))
    run = out[0]
    assert run.token_ids == gallery.load(first.id).token_ids
    assert out[2].startswith(f"Recorded run **{first.title}**") and "no model work" in out[2]
    prompt, preset, _, *knobs = settings(out)
    assert prompt == first.prompt == run.prompt and preset == first.preset
    assert Knobs(*knobs) == first.knobs and knobs[3] == run.config["sampling"]["temperature"]
    assert workshop.gallery_opened(handlers, "no-such-entry")[2].startswith("\u26a0")


def test_the_gallery_is_offered_on_the_page():
    choices = workshop.gallery_choices()
    assert [c[1] for c in choices] == [e.id for e in gallery.entries()]
    assert all("tau" in label for label, _ in choices)


def test_a_link_needs_valid_knobs():
    assert workshop.link_for("x", None, None, "many", 1, 5, 0, 1, 48, 0, "auto").startswith("\u26a0")
    link = workshop.link_for("a b&c", "Code", None, 4, 1, 5, 0, 1, 48, 0, "auto")
    assert "prompt=a%20b%26c" in link and "preset=Code" in unquote(link) and "model=" not in link


def test_the_queue_says_when_runs_are_ahead_and_counts_each_tab_once(handlers):
    first, second = StopRequest(), StopRequest()
    assert handlers.announce(first) == ""     # nobody ahead
    skip = type(gr.skip())
    assert isinstance(handlers.announce(first), skip) and len(handlers._pending) == 1   # clicked again: once
    handlers._started(first)                   # that run is now running
    first.running = True
    assert isinstance(handlers.announce(first), skip)   # clicks while it runs count for nothing
    note = handlers.announce(second)           # a second visitor clicks Run
    assert "1 run(s) ahead" in note and "one cycle in turn" in note and "recorded runs" in note
    handlers.announce(second)                  # and again, before the run starts
    assert len(handlers._pending) == 1
    handlers._started(second)
    handlers._ended()
    handlers._ended()
    assert handlers._pending == {} and handlers._running == 0
    first_come = Handlers(handlers.pairs, Limits(active_runs=1))   # the old first-come-first-served server
    first_come._started(StopRequest())
    assert "runs 1 at a time" in first_come.announce(StopRequest())


def test_an_edited_preset_lets_go_and_an_imported_trace_brings_its_settings(handlers):
    from dataclasses import fields, replace

    from eagleviz.app import presets

    story = next(p for p in presets.PRESETS if p.temperature > 0)
    knobs = presets.knobs(story, Knobs(max_new_tokens=24, seed=3))     # knobs a preset does not set stay free
    values = [getattr(knobs, f.name) for f in fields(Knobs)]
    kept = Handlers.preset_kept(story.name, story.prompt, *values)
    assert all(isinstance(v, type(gr.skip())) for v in kept)
    assert Handlers.preset_kept(story.name, story.prompt + "!", *values) == (None, presets.edited_note(story.name))
    hotter = [getattr(replace(knobs, temperature=0.85), f.name) for f in fields(Knobs)]
    assert Handlers.preset_kept(story.name, story.prompt, *hotter)[0] is None
    assert Handlers.preset_kept(None, story.prompt, *values) == (story.name, presets.note(story))   # edited back
    entry = next(e for e in gallery.entries() if e.preset == story.name)
    out = workshop.trace_imported(handlers, str(gallery.GALLERY_DIR / entry.file), "torch")
    prompt, preset, note, *knobs = settings(out)
    assert out[2].startswith("Imported") and (prompt, preset) == (entry.prompt, story.name) and "tau" in note
    assert Knobs(*knobs) == replace(entry.knobs, attn_impl="torch")     # the page's attention is kept


def test_a_link_to_a_picture_opens_that_cycle_phase_and_token_of_a_recorded_run(handlers):
    from eagleviz.app import navigation as nav
    from eagleviz.visuals.phases import frames

    run = gallery.load("story")
    i = next(k for k, c in enumerate(run.cycles) if k != nav.instructive_cycle(run) and c.num_tree_tokens > 2)
    cycle = run.cycles[i]
    verify = nav.tour_frame(cycle, 1)
    link = workshop.picture_link("story", run, i, verify, 2)
    query = link[link.index("(?") + 1:link.index(")")]
    assert query == f"?gallery=story&cycle={i}&phase=verify&token=2"
    out = workshop.open_link(handlers, DEFAULTS, request(query[1:]))
    assert out[3].value == i and out[8] == 2                      # the slider, the picked token's slot
    assert out[8 + 3].value == verify and out[8 + 3].maximum == len(frames(cycle)) - 1
    assert out[8 + 4].startswith("**Verify") and "Selected" in out[8 + 5]   # phase text, focus text
    assert f"cycle {i})" in out[7]                                   # the tour names the cycle shown
    assert tail(out)[2] == "" and tail(out)[3] == "story"
    # the bonus is the token list's last item; the end state is named by leaving the phase out
    bonus = workshop.picture_link("story", run, i, None, -1)
    assert f"cycle={i}&token={cycle.num_tree_tokens})" in bonus and "phase" not in bonus.split(")")[0]
    assert workshop.open_link(handlers, DEFAULTS, request(f"gallery=story&cycle={i}&token={cycle.num_tree_tokens}"))[8] == -1
    # a live run cannot be linked to; nothing is said when no run is shown
    assert "cannot be linked" in workshop.picture_link(None, run, i, None, None)
    assert workshop.picture_link(None, None, 0, None, None) == ""


def test_a_picture_the_recorded_run_lacks_is_said_and_the_rest_is_shown(handlers):
    from eagleviz.app import navigation as nav

    run = gallery.load("story")
    n = len(run.cycles)
    out = workshop.open_link(handlers, DEFAULTS, request(f"gallery=story&cycle={n}&phase=99&token=999"))
    notes = tail(out)[2].split("\n\n")
    assert len(notes) == 3 and all(note.startswith("\u26a0 Link parameter") for note in notes), notes
    said = "\n".join(notes)
    assert f"cycles 0 .. {n - 1}" in said and "the end state is shown" in said and "none is picked" in said
    assert out[3].value == nav.instructive_cycle(run) and out[8] is None
    assert out[2].startswith("Recorded run")


def test_each_tour_stop_has_its_view_and_slides_show_it_alone():
    from eagleviz.visuals.explain import TOUR

    assert len(workshop.TOUR_VIEWS) == len(TOUR)
    for shown in workshop.TOUR_VIEWS:
        rule = next(r for r in workshop.SLIDES_CSS.split("} ") if f"'{shown}'" in r)
        hidden = {v for v in workshop.TOUR_VIEWS if f"#{v}" in rule}
        assert hidden == set(workshop.TOUR_VIEWS) - {shown}


# ------------------------------------------------------------------ a room that follows the instructor

def _room(**kw):
    from eagleviz.app.rooms import Rooms

    rooms = Rooms(**kw)
    run = gallery.load("story")
    code, line, claim = workshop.room_opened(rooms, run, 2, None, None)
    assert claim == f"{code}:{rooms.host_key(code)}" and rooms.host_key(code) not in line   # never projected
    return rooms, run, code, line


def test_a_moved_picture_tells_the_room_and_names_the_cycle_in_the_tours_words():
    """`moved`, when a page's picture moves: the room's next picture and the tour's words for the cycle, in one
    answer; a page with no room of its own (a follower) tells none, and a page with no run says nothing."""
    from eagleviz.app import navigation as nav

    rooms, run, code, _ = _room()
    room = rooms.seen(code)
    version = room.version
    line, words = workshop.moved(rooms, code, run, 3, None, None, 1)
    assert line == gr.skip() and room.cycle == 3 and room.version == version + 1
    assert words == nav.tour_text(run, 3, 1) and "(cycle 3)" in words
    assert workshop.moved(rooms, None, run, 4, None, None, 0)[1] == nav.tour_text(run, 4, 0)
    assert room.cycle == 3                                                     # no room of its own: nothing told
    assert workshop.moved(rooms, None, None, 0, None, None, 0) == (gr.skip(), gr.skip())


def test_a_streaming_run_is_told_to_the_room_as_the_page_is_sent_it(handlers):
    """`run_streamed`, after each part of a run's output: a part with cycles tells the room the run at the cycle the
    part sets the slider to, else at the room's cycle; a part before the first cycle, or a page with no room of its
    own, tells nothing."""
    from eagleviz.app.handlers import cycle_slider

    rooms, run, code, _ = _room()
    room = rooms.seen(code)
    other = gallery.load(next(e.id for e in gallery.entries() if e.id != "story"))
    version = room.version
    workshop.run_streamed(rooms, code, (gr.skip(), None, "Loading", gr.skip()))
    workshop.run_streamed(rooms, None, (other, None, "Running", cycle_slider(other)))
    assert room.version == version and room.run is run
    workshop.run_streamed(rooms, code, (other, None, "Running", cycle_slider(other)))   # its first cycle: value 0
    assert room.run is other and room.cycle == 0 and room.version == version + 1
    workshop.run_streamed(rooms, code, (other, None, "Running", cycle_slider(other, None)))   # the slider left as is
    assert room.cycle == 0 and room.version == version + 1
    workshop.run_streamed(rooms, code, (other, None, "Done", cycle_slider(other, 2)))
    assert room.cycle == 2 and room.version == version + 2


def test_a_rooms_line_shows_a_qr_code_of_its_full_link_where_the_pages_address_is_known():
    """For a projector: the link written out in full and drawn as a QR code that reads back as that link
    (`eagleviz.app.qr`); a page whose address the browser did not send gets the relative link and no code."""
    import base64
    import re

    from eagleviz.app import qr
    from eagleviz.app.rooms import Rooms

    rooms = Rooms()
    code, line, _ = workshop.room_opened(rooms, gallery.load("story"), 0, None, None, address="http://10.0.0.7:7860/")
    link = f"http://10.0.0.7:7860/?room={code}"
    assert f"[{link}](?room={code})" in line
    (uri,) = re.findall(r"!\[A QR code of the room's link: scan it to join room \w+\]\((data:image/svg\+xml;base64,[^)]+)\)",
                        line)
    assert uri == qr.data_uri(link) and base64.b64decode(uri.split(",")[1]).startswith(b"<svg")
    _, bare, _ = workshop.room_opened(rooms, gallery.load("story"), 0, None, None)
    assert "data:image" not in bare and "(?room=" in bare


def test_the_instructors_page_reloaded_takes_its_room_back_with_its_picture(handlers):
    """The claim the opening browser keeps takes the room back after a reload: the room's code in the page's state,
    the room's picture (its run, cycle, phase and token) shown again; a wrong key, a code alone or an ended room
    takes nothing, and the stale claim is dropped."""
    now = [0.0]
    rooms, run, code, _ = _room(ttl_s=60, clock=lambda: now[0])
    rooms.show(code, run, 3, 1, 2)
    claim = f"{code}:{rooms.host_key(code)}"
    out = workshop.room_reclaimed(handlers, rooms, claim)
    assert out[:2] == (code, out[1]) and "taken back" in out[1] and out[2] == claim
    assert out[3:5] == (None, "")                                            # not the arrival's recording
    shown, (prompt, *_) = out[5:5 + RUN], out[5 + RUN:]
    assert prompt == run.prompt and len(out) == 5 + RUN + SETTINGS                # the run's own settings
    assert len(shown) == RUN and shown[0] is run and shown[3].value == 3     # the run, at the room's cycle
    assert shown[8 + 3].value == 1                                           # its phase
    assert shown[2].startswith(f"Room **{code}** taken back")                # said where the page is looked at
    assert workshop.room_reclaimed(handlers, rooms, f" {code.lower()}:{rooms.host_key(code)}")[0] == code
    for bad in (f"{code}:wrong", code, "", None, f"ZZZZZ:{rooms.host_key(code)}"):
        assert workshop.room_reclaimed(handlers, rooms, bad) == (gr.skip(), gr.skip(), "", *(gr.skip(),) * (RUN + 2 + SETTINGS))
    now[0] = 61.0   # no move for the room's life: it has ended, the claim goes
    assert workshop.room_reclaimed(handlers, rooms, claim)[2] == ""


async def _next(stream, within_s: float = 30.0):
    """The stream's next item; the default bound only catches a hang (a first picture drawn under the suite's load
    took over 5 s once); waits that must not see an item pass their own short bound."""
    return await asyncio.wait_for(stream.__anext__(), within_s)


def test_a_room_gives_each_follower_the_instructors_picture_once_per_move_and_ends_by_itself(handlers):
    from eagleviz.app.rooms import CODE_CHARS

    now = [0.0]
    rooms, run, code, line = _room(ttl_s=60, clock=lambda: now[0])
    assert len(code) == CODE_CHARS and f"?room={code}" in line

    async def follow():
        a = workshop.room_followed(rooms, code.lower(), True, "a")   # typed in lower case: the same room
        b = workshop.room_followed(rooms, code, True, "b")
        first = await _next(a)
        assert len(first) == workshop.FOLLOW_SIZE and first[0] is run and first[5].startswith("**Cycle 2**")
        assert (await _next(b))[5] == first[5]
        assert workshop.room_shown(rooms, code, run, 3, 1, 2) == gr.skip()                # cycle 3, phase 1, slot 2
        moved = await _next(a)
        assert moved[5].startswith("**Cycle 3**") and isinstance(first[7], gr.Slider)
        assert moved[7] == 1 and not isinstance(moved[7], gr.blocks.Block)   # the phase slider's value alone: cycles
        #                                                                      2 and 3 both have seven phases
        again = await _next(b)
        assert again[4 + 6] is moved[4 + 6]               # drawn once, by the first follower, for all of them
        now[0] = 61.0                                     # the instructor gone for longer than the room lives
        assert workshop.room_shown(rooms, code, run, 0, None, None).startswith("\u26a0") and len(rooms) == 0
        ended = await _next(a)
        assert "has ended" in ended[-1] and all(v == gr.skip() for v in ended[:-1])   # the last picture stays
        with pytest.raises(StopAsyncIteration):          # and the stream ends
            await _next(a)
        await b.aclose()

    asyncio.run(follow())


def test_a_follower_is_sent_only_what_changed_in_its_picture(handlers):
    """A phase picked within a cycle leaves the run, the output, the slider and the summary plot as they were: the
    follower is sent the views that changed and skips the rest (a figure sent is redrawn whole by its browser); a
    cycle moved sends the slider's value alone (a component update costs the server a component made per page), not
    the summary (the page outlines the cycle's bar itself); another run sends both, the slider's new range with it."""
    from eagleviz.app.navigation import VIEW_SIZE

    rooms, run, code, _ = _room()
    skip = gr.skip()

    async def follow():
        a = workshop.room_followed(rooms, code, True, "a")
        first = await _next(a)
        assert all(v != skip for v in first[:4])
        workshop.room_shown(rooms, code, run, 2, 0, None)   # the same cycle, its first phase
        phase = await _next(a)
        assert phase[:4] == (skip, skip, skip, skip)
        assert any(v != skip for v in phase[4:4 + VIEW_SIZE])
        workshop.room_shown(rooms, code, run, 3, 0, None)   # another cycle
        cycle = await _next(a)
        assert cycle[0] == skip and cycle[3] == skip        # the same run: no summary
        assert cycle[2] == 3 and not isinstance(cycle[2], gr.blocks.Block)   # the slider's value alone: its range kept
        other = gallery.load(next(e.id for e in gallery.entries() if e.id != "story"))
        workshop.room_shown(rooms, code, other, 1, None, None)   # another run: its summary, outlined at its cycle
        ran = await _next(a)
        assert ran[0] is other and ran[3] != skip and '"width":[0,3,' in ran[3].plot.replace(" ", "")
        assert isinstance(ran[2], gr.Slider) and ran[2].maximum == len(other.cycles) - 1   # another range: an update
        await a.aclose()

    asyncio.run(follow())


def test_the_instructor_hears_how_many_follow_and_followers_hear_when_its_page_is_away_and_back(handlers):
    """The instructor's page beats (`room_heard`): it is told how many pages follow (said again only when that
    changes); unheard for longer than `AWAY_S`, its followers' line says so at their stream's next beat, with the
    picture left as it is; its next beat tells them at once that it is back."""
    now = [0.0]
    rooms, run, code, line = _room(clock=lambda: now[0], alive_s=0.05)
    AWAY_S = rooms.away_after_s
    assert line.startswith(f"Room **{code}**\n\n")                  # the code first, alone: drawn large
    said, beat = workshop.room_heard(rooms, code, "")
    assert said == f"**0** pages follow room **{code}** now." and beat == gr.skip()

    async def follow():
        a = workshop.room_followed(rooms, code, True, "a")
        b = workshop.room_followed(rooms, code, True, "b")
        first = await _next(a)
        await _next(b)
        assert first[-1].startswith(f"Following room **{code}**")
        assert workshop.room_heard(rooms, code, said)[0] == f"**2** pages follow room **{code}** now."
        assert workshop.room_heard(rooms, code, f"**2** pages follow room **{code}** now.")[0] == gr.skip()
        await b.aclose()
        assert workshop.room_heard(rooms, code, "")[0] == f"**1** page follows room **{code}** now."
        now[0] += AWAY_S + 15                                         # the instructor's page unheard
        away = await _next(a)
        while away[-1].startswith("Following"):                       # a beat that came before the clock moved
            away = await _next(a)
        assert away[-1].startswith("\u26a0") and f"not been heard for {AWAY_S + 15:.0f} s" in away[-1]
        assert all(v == gr.skip() for v in away[:-1])                  # the last picture stays as it is
        waiting = asyncio.ensure_future(_next(a, 1.0))
        await asyncio.sleep(0.01)
        workshop.room_heard(rooms, code, "")                           # back: said at once, not at the next beat
        back = await waiting
        assert back[-1].startswith(f"Following room **{code}**") and all(v == gr.skip() for v in back[:-1])
        await a.aclose()

    asyncio.run(follow())
    now[0] += 3 * 3600                                                  # no move for the room's life: it ends
    said, beat = workshop.room_heard(rooms, code, "")
    assert "has ended" in said and beat.active is False
    assert workshop.room_heard(rooms, None, "")[0] == gr.skip()


def test_a_follower_that_moves_its_own_picture_is_told_where_the_instructor_is_and_rejoins(handlers):
    """A following page steps, slides or picks on its own: its switch is unticked, its picture left to it, and its
    line says where the instructor is, again at each of the instructor's moves; ticked again, the room's picture
    comes back at once. A page that follows nothing is left alone."""
    rooms, run, code, _ = _room()

    async def follow():
        stream = workshop.room_followed(rooms, code, True, "page")
        await _next(stream)
        assert workshop.stepped_away(rooms, code, True, "page") is False          # the switch, unticked
        away = await _next(stream)
        assert away[-1].startswith(f"You stepped away from room **{code}**: the instructor is on cycle 2")
        assert all(v == gr.skip() for v in away[:-1])                            # the page's own picture stays
        workshop.room_stepped(rooms, code, run, 2, +1)
        moved = await _next(stream)
        assert "on cycle 3" in moved[-1] and all(v == gr.skip() for v in moved[:-1])
        again = workshop.room_followed(rooms, code, True, "page")               # ticked again: a new stream
        assert (await _next(again))[5].startswith("**Cycle 3**") and not rooms.is_away(code, "page")
        await again.aclose()
        await stream.aclose()

    asyncio.run(follow())
    assert workshop.stepped_away(rooms, code, False, "page") == gr.skip()         # not following: nothing
    assert workshop.stepped_away(rooms, None, True, "page") == gr.skip()
    assert workshop.stepped_away(rooms, code, True, "never-joined") == gr.skip()


def test_a_rooms_link_is_written_out_at_the_pages_address_for_a_projector():
    import types

    from eagleviz.app.rooms import Rooms

    def request(referer):
        return types.SimpleNamespace(headers={"referer": referer} if referer else {})

    assert workshop.page_address(request("https://x.hf.space/?gallery=story#cycle")) == "https://x.hf.space/"
    assert workshop.page_address(request("")) == "" == workshop.page_address(None)
    assert workshop.page_address(request("javascript:alert(1)")) == ""
    code, line, _ = workshop.room_opened(Rooms(), None, 0, None, None, "http://10.0.0.2:7860/")
    assert f"[http://10.0.0.2:7860/?room={code}](?room={code})" in line


def test_the_instructors_tour_reaches_the_followers_with_its_words(handlers):
    """The instructor opens the tour and steps it: each follower's tour opens at the same stop with its words (and
    the words for the scroll to its view); closed, a follower's own tour is left as it is."""
    rooms, run, code, _ = _room()
    tour = 4 + VIEW_SIZE   # the tour's outputs, after run state, output, slider, summary plot and the view

    async def follow():
        stream = workshop.room_followed(rooms, code, True, "a")
        first = await _next(stream)
        assert len(first) == workshop.FOLLOW_SIZE and all(v == gr.skip() for v in first[tour:tour + 4])
        workshop.room_toured(rooms, code, 1, run)
        stop, words, section, scroll = (await _next(stream))[tour:tour + 4]
        assert stop == 1 and words.startswith("### Tour 2") and "Verify (cycle 2)" in words and scroll == words
        assert isinstance(section, gr.Accordion) and section.open is True
        workshop.room_toured(rooms, code, None)
        assert all(v == gr.skip() for v in (await _next(stream))[tour:tour + 4])
        workshop.room_toured(rooms, code, 2, None)   # no run shown: no tour to follow
        assert rooms.seen(code).tour is None
        await stream.aclose()

    asyncio.run(follow())


def test_a_mistyped_room_shows_a_recorded_run_and_says_so():
    """A code no room has: the page is not left with four empty views; the arrival's recorded run is shown, the
    line says the room is not open, and the stream ends."""
    from eagleviz.app.rooms import Rooms

    async def follow():
        stream = workshop.room_followed(Rooms(), "QQQQQ", True, "a")
        out = await _next(stream)
        assert len(out) == workshop.FOLLOW_SIZE and "is not open" in out[-1] and "recorded run" in out[-1]
        assert out[0].token_ids == gallery.load(workshop.arrival_entry()).token_ids
        assert out[5].startswith("**Cycle")
        with pytest.raises(StopAsyncIteration):
            await _next(stream)

    asyncio.run(follow())


def test_a_followers_stream_is_pushed_each_move_at_once_with_no_poll(handlers):
    """The follower's page hears of the instructor's step the moment the server answers it: no poll interval to wait
    for (a poll every half second made the median follower wait a quarter of a second for nothing). The step is
    told from one of Gradio's worker threads, the stream waits in its event loop."""
    import threading
    import time

    rooms, run, code, _ = _room()

    async def follow() -> list[float]:
        stream, delays = workshop.room_followed(rooms, code, True, "page"), []
        await _next(stream)
        for k in (3, 4, 5):
            await asyncio.sleep(0.05)
            start = time.perf_counter()
            threading.Thread(target=workshop.room_stepped, args=(rooms, code, run, k - 1, +1)).start()
            shown = await _next(stream)
            delays.append(time.perf_counter() - start)
            assert shown[5].startswith(f"**Cycle {k}**")
        await stream.aclose()
        return delays

    delays = asyncio.run(follow())
    assert max(delays) < 0.45, delays   # the picture drawn (~0.1 s here), no poll's wait on top


def test_a_followers_stream_ends_when_it_unticks_follow_and_a_page_that_follows_again_takes_over(handlers):
    rooms, run, code, _ = _room()

    async def follow():
        stream = workshop.room_followed(rooms, code, True, "page")
        await _next(stream)
        waiting = asyncio.ensure_future(_next(stream))
        await asyncio.sleep(0.05)
        stopped = [out async for out in workshop.room_followed(rooms, code, False, "page")]   # unticked
        assert len(stopped) == 1 and all(v == gr.skip() for v in stopped[0])
        with pytest.raises(StopAsyncIteration):          # the page's stream ended, with no move of the room
            await asyncio.wait_for(waiting, 1.0)
        again = workshop.room_followed(rooms, code, True, "page")          # ticked again: the picture at once
        assert (await _next(again))[5].startswith("**Cycle 2**")
        newer = workshop.room_followed(rooms, code, True, "page")          # the page follows anew (a second load)
        await _next(newer)
        with pytest.raises(StopAsyncIteration):          # its older stream gives way
            await _next(again, 1.0)
        other = workshop.room_followed(rooms, code, True, "other")
        await _next(other)
        workshop.room_stepped(rooms, code, run, 2, +1)
        assert (await _next(newer))[5].startswith("**Cycle 3**") and (await _next(other))[5].startswith("**Cycle 3**")
        for s in (newer, other):
            await s.aclose()
        assert not rooms._streams and not rooms._asleep   # nothing left behind by the streams that ended

    asyncio.run(follow())


def test_a_stream_with_nothing_new_says_the_same_picture_again_so_gradio_can_drop_a_page_that_left():
    """Gradio ends a stream whose reader has gone only at the stream's next update: with the room still, a stream
    gives the same picture again every `alive_s`, the same objects (Gradio's diff against the last update is
    empty: nothing is sent again but the update's envelope)."""
    from eagleviz.app.rooms import Rooms

    rooms = Rooms()
    code = rooms.open()
    rooms.show(code, gallery.load("story"), 1, None, None)

    async def follow():
        stream = rooms.followed(code, "page", alive_s=0.05)
        first = await _next(stream)
        assert (await _next(stream, 1.0)) is first and first.version == rooms.seen(code).version
        await stream.aclose()

    asyncio.run(follow())


def test_followers_woken_at_once_draw_a_rooms_picture_once():
    """Thirty followers are woken by the same move: the first starts drawing the picture (in a worker thread), the
    others await that drawing, none draws it beside it."""
    import time

    from eagleviz.app.rooms import Rooms

    rooms = Rooms()
    code = rooms.open()
    rooms.show(code, gallery.load("story"), 1, None, None)
    room, drawings = rooms.seen(code), []

    def draw(shown) -> tuple:
        drawings.append(shown.version)
        time.sleep(0.05)
        return (shown.cycle,)

    async def followers():
        return await asyncio.gather(*[rooms.drawn(room, draw) for _ in range(30)])

    shown = asyncio.run(followers())
    assert drawings == [room.version] and all(s.drawn == (1,) and s.version == room.version for s in shown)


def test_the_follower_page_streams_the_room_with_no_timer_and_no_limit(handlers, monkeypatch):
    """On the page: the follow stream is one async generator event, started when the joined room's code is set and
    again by the follow switch (either way while one runs), with no concurrency limit (thirty followers waiting
    hold no worker of the queue), its picture sent as made once (`postprocess=False`); no timer asks the room."""
    import inspect

    from eagleviz.app import ui
    from eagleviz.app.rooms import Rooms

    made = []
    monkeypatch.setattr(ui, "Rooms", lambda: made.append(Rooms()) or made[-1])
    demo = ui.build_app(lambda: None)   # a factory never called: no model
    rooms = made[0]
    elem = {b._id: getattr(b, "elem_id", None) for b in demo.blocks.values()}
    streams = [f for f in demo.fns.values() if "follow-text" in [elem[o._id] for o in f.outputs]]
    assert {e for f in streams for _, e in f.targets} == {"change", "input"}
    for f in streams:
        assert inspect.isasyncgenfunction(f.fn) and f.queue and f.concurrency_limit is None and not f.postprocess
        assert f.trigger_mode == "multiple"   # the follow switch is heard while the stream it ends still runs
    timers = [f for f in demo.fns.values() if any(e == "tick" for _, e in f.targets)]
    assert not any("follow" in [elem[i._id] for i in f.inputs] for f in timers)

    run = gallery.load("story")
    code, _, _ = workshop.room_opened(rooms, run, 2, None, None)
    request = types.SimpleNamespace(session_hash="page")

    async def follow():
        stream = streams[0].fn(code, True, request)
        first = await _next(stream)
        assert first[0] is run and isinstance(first[3], dict) and first[3]["type"] == "plotly"   # sent as made
        workshop.room_stepped(rooms, code, run, 2, +1)
        assert (await _next(stream))[5].startswith("**Cycle 3**")
        await stream.aclose()

    asyncio.run(follow())


def test_a_step_is_told_to_the_room_as_it_is_answered_and_the_pages_own_change_adds_no_version(handlers):
    """Next on the instructor's page moves the room in the same server call (followers do not wait for the
    instructor's browser to draw it); the `.change` events the page then sends carry the same picture."""
    from eagleviz.app import navigation as nav
    from eagleviz.visuals.phases import frames

    rooms, run, code, _ = _room()
    version = rooms.seen(code).version
    stepped = workshop.room_stepped(rooms, code, run, 2, +1)
    assert stepped[1:3] == nav.step(run, 2, +1)[1:3]   # the step's own outputs: the summary and the focus
    room = rooms.seen(code)
    last = len(frames(run.cycles[3])) - 1                # a step shows the cycle's end state: its last phase frame
    assert (room.version, room.cycle, room.frame, room.slot) == (version + 1, 3, last, None)
    assert workshop.room_shown(rooms, code, run, 3, last, None) == gr.skip() and room.version == version + 1
    workshop.room_stepped(rooms, code, run, len(run.cycles) - 1, +1)   # past the last cycle: it stays there
    assert rooms.seen(code).cycle == len(run.cycles) - 1
    workshop.room_stepped(rooms, None, run, 0, +1)       # a page with no room of its own tells none
    assert rooms.seen(code).cycle == len(run.cycles) - 1


def test_a_picked_token_a_phase_and_the_cycle_slider_are_told_to_the_room_as_they_are_answered(handlers):
    """Like a step: the instructor's pick, phase and slider moves reach the room in the server call that answers
    them, and the page's `.change` events that follow find the same picture (no second version)."""
    from eagleviz.app import navigation as nav
    from eagleviz.visuals.phases import frames

    rooms, run, code, _ = _room()
    version = rooms.seen(code).version
    slid = workshop.room_slid(rooms, code, run, 4)
    assert len(slid) == len(nav.show(run, 4)) and slid[2] == nav.show(run, 4)[2]
    last = len(frames(run.cycles[4])) - 1
    room = rooms.seen(code)
    assert (room.version, room.cycle, room.frame, room.slot) == (version + 1, 4, last, None)
    picked = workshop.room_picked(rooms, code, run, 4, last, gr.SelectData(None, {"index": 1, "value": ""}))
    slot = picked[0]
    assert slot is not None and (room.version, room.slot) == (version + 2, slot)
    phased = workshop.room_phased(rooms, code, run, 4, 1, slot)
    assert phased[0] == nav.phase_chosen(run, 4, 1, slot)[0] and (room.version, room.frame) == (version + 3, 1)
    assert workshop.room_shown(rooms, code, run, 4, 1, slot) == gr.skip() and room.version == version + 3
    workshop.room_picked(rooms, code, run, 4, 1, gr.SelectData(None, {"index": None, "value": ""}))  # no token
    assert room.version == version + 3


def test_a_room_follows_a_live_run_as_its_cycles_arrive(handlers):
    """The instructor's run still streaming: each new cycle (the status line changes) is a new picture for the
    room, so the followers' text and cycle slider grow with it."""
    from eagleviz.app.rooms import Rooms

    rooms = Rooms()
    run = gallery.load("counting")
    recorded, run.cycles = run.cycles, run.cycles[:3]
    code, _, _ = workshop.room_opened(rooms, run, 0, None, None)

    async def follow():
        stream = workshop.room_followed(rooms, code, True, "page")
        assert (await _next(stream))[2].maximum == 2
        run.cycles = recorded[:5]                      # two more cycles, the same trace object, cycle 0 still shown
        workshop.room_shown(rooms, code, run, 0, None, None)
        assert (await _next(stream))[2].maximum == 4
        await stream.aclose()

    asyncio.run(follow())
