"""Moving through a recorded run on the page: cycles, phases and the selected token. No model is touched:
every handler redraws from the run kept in the tab's gr.State.

A cycle's view (`view_values`) is what the page shows when a cycle is chosen: its caption, the list of its
tokens, the phase control at the end state, the four figures and their explanations, the replay. Picking a
token or a phase redraws the four figures only (`figure_values`), in about 10 ms of server time.

A finished run opens on its most instructive cycle (`instructive_cycle`): the first with the longest accepted
path, where the draft guessed several tokens the target kept. Cycle 0 is often "0 accepted + 1 bonus" (the
head's first guess, from the prompt alone), three red crosses that teach little; it stays one click away.
"""

from __future__ import annotations

import json

import gradio as gr

from eagleviz.app import glossary
from eagleviz.trace import CycleTrace, RunTrace
from eagleviz.visuals import cycle_view, empty_view
from eagleviz.visuals.explain import TOUR, tour_step
from eagleviz.visuals.phases import PHASES, frame_at, frames, label
from eagleviz.visuals.selection import BONUS, output_origin, slot_of_item
from eagleviz.visuals.views import cycle_figures

TOKEN_COLOURS = {"root": "#BBBBBB", "accepted": "#9CC3E0", "rejected": "#F0A986", "verified": "#E4E4E4",
                 "bonus": "#F5CD80"}
TOKEN_HELP = "Pick a token of this cycle (or click one in the output above) to follow it through the four views."


def phase_slider(n: int = 1, value: int | None = None) -> gr.Slider:
    """The phase control over a cycle's `n` frames at frame `value` (None: the end state)."""
    value = n - 1 if value is None else value
    return gr.Slider(minimum=0, maximum=max(n - 1, 1), value=value, step=1, interactive=n > 1,
                     label=f"phase (0 .. {n - 1}): draft levels, verify, accept, rewind")


def view_values(run: RunTrace | None, index: int, slot: int | None = None) -> tuple:
    """Outputs of a cycle change: focus, caption, tokens, phase, phase text, focus text, the four figures,
    their four texts, the replay and its text."""
    view = cycle_view(run, int(index or 0), slot=slot) if run is not None else empty_view()
    help_ = view.focus_text or (TOKEN_HELP if run is not None and run.cycles else "")
    words = glossary.link_terms   # the explanations' first uses of a term link to the glossary
    return (slot, view.caption, view.tokens, phase_slider(view.frames), view.phase_text, help_,
            view.tree, view.mask, view.path, view.kv, words(view.tree_text), words(view.mask_text),
            words(view.path_text), words(view.kv_text), view.replay, words(view.replay_text))


VIEW_SIZE = len(view_values(None, 0))


def instructive_cycle(run: RunTrace | None) -> int:
    """The cycle a finished run opens on: the first with the longest accepted path (0 for no cycles)."""
    if run is None or not run.cycles:
        return 0
    longest = max(c.accept_length for c in run.cycles)
    return next(i for i, c in enumerate(run.cycles) if c.accept_length == longest)


def opening(run: RunTrace | None) -> tuple[int, tuple]:
    """The cycle a finished run opens on and its view, the focus line saying why it was chosen."""
    i = instructive_cycle(run)
    view = list(view_values(run, i))
    if run is not None and run.cycles and i > 0:
        view[5] = (f"Opened on cycle {i}, the first with the longest accepted path ({run.cycles[i].accept_length} "
                   f"accepted); \u21e4 goes to cycle 0. {view[5]}")
    return i, tuple(view)


def frame_of(cycle: CycleTrace, phase: str | int | None) -> int | None:
    """The frame a link's phase names: a phase's last frame (the whole draft tree for "draft"), a frame number,
    or None (the end state). A number past the cycle's frames is None too."""
    if phase is None:
        return None
    if isinstance(phase, str):
        return tour_frame(cycle, PHASES.index(phase))
    return phase if phase < len(frames(cycle)) else None


def phase_name(cycle: CycleTrace, frame: float | None) -> str | int | None:
    """How a link names frame `frame`: its phase's name where it is that phase's last frame, else its number;
    None for the end state."""
    n = len(frames(cycle))
    f = n - 1 if frame is None else max(0, min(int(frame), n - 1))
    if f == n - 1:
        return None
    name = frame_at(cycle, f).phase
    return name if tour_frame(cycle, PHASES.index(name)) == f else f


def token_item(cycle: CycleTrace, slot: int | None) -> int | None:
    """The item of the cycle's token list that slot `slot` is (the bonus is the last): how a link names it."""
    if slot is None:
        return None
    return cycle.num_tree_tokens if slot == BONUS else int(slot)


def picture(run: RunTrace, cycle: int | None, phase: str | int | None, token: int | None) -> tuple[int, tuple, list]:
    """A link's picture of a recorded run: (the cycle shown, its view values at that phase with that token
    picked, a note for each part the run does not have). A missing cycle gives the opening cycle, a missing
    phase the end state, a missing token none picked."""
    notes = []
    if not run.cycles:
        return 0, view_values(run, 0), notes
    if cycle is not None and not 0 <= cycle < len(run.cycles):
        notes.append(f"Link parameter cycle={cycle}: this recorded run has cycles 0 .. {len(run.cycles) - 1}; "
                     "its opening cycle is shown.")
        cycle = None
    i = instructive_cycle(run) if cycle is None else cycle
    c = run.cycles[i]
    slot = None
    if token is not None:
        if token <= c.num_tree_tokens:
            slot = slot_of_item(c, token)
        else:
            notes.append(f"Link parameter token={token}: cycle {i} has tokens 0 .. {c.num_tree_tokens}; "
                         "none is picked.")
    frame = frame_of(c, phase)
    if isinstance(phase, int) and frame is None:
        notes.append(f"Link parameter phase={phase}: cycle {i} has phases 0 .. {len(frames(c)) - 1}; "
                     "the end state is shown.")
    if cycle is None and slot is None and frame is None:
        return i, opening(run)[1], notes
    return i, view_at(run, i, frame, slot), notes


def view_at(run: RunTrace, index: int, frame: int | None, slot: int | None) -> tuple:
    """A cycle's view values at phase frame `frame` (None: the end state) with slot `slot` picked: what a link's
    picture or a room's shows."""
    view = list(view_values(run, index, slot))
    if frame is not None and run.cycles and frame != len(frames(run.cycles[index])) - 1:   # the last is the end state
        view[3] = phase_slider(len(frames(run.cycles[index])), frame)
        view[4:10] = figure_values(run, index, frame, slot)
    return tuple(view)


def figure_values(run: RunTrace | None, index: float, frame: float | None, slot: int | None) -> tuple:
    """Outputs of a phase or token change: the phase text, the focus text and the four figures."""
    f = cycle_figures(run, int(index or 0), None if frame is None else int(frame), slot)
    return f.phase_text, f.focus_text or TOKEN_HELP, f.tree, f.mask, f.path, f.kv


def phase_frames(run: RunTrace | None, index: float, slot: int | None) -> str:
    """Play phases of the cycle shown, for the GIF the page makes of them (`handout.GIF_JS`): JSON of the cycle and,
    frame by frame, the phase control's label and the four figures (Plotly's JSON, the views' order) with the picked
    token followed through them; "" without a cycle."""
    if run is None or not run.cycles:
        return ""
    i = _clamp(run, index)
    shown = []
    for f, frame in enumerate(frames(run.cycles[i])):
        figures = cycle_figures(run, i, f, slot)
        shown.append({"label": label(frame), "figures": [json.loads(x.to_json()) for x in (
            figures.tree, figures.mask, figures.path, figures.kv)]})
    return json.dumps({"cycle": i, "frames": shown})


def _clamp(run: RunTrace | None, index: float) -> int:
    n = len(run.cycles) if run is not None else 0
    return max(0, min(int(index or 0), n - 1)) if n else 0


def show(run: RunTrace | None, index: float) -> tuple:
    """Outputs: summary plot, *view. The run's summary is on the page already: it is not sent again for another
    of its cycles (the page outlines the cycle's bar itself, `ui.SUMMARY_OUTLINE_JS`: the summary, the largest of
    the five figures, is not redrawn at each step)."""
    i = _clamp(run, index)
    return (gr.skip() if run is not None else None, *view_values(run, i))


def step(run: RunTrace | None, index: float, delta: int) -> tuple:
    """Outputs: slider, summary plot, *view."""
    i = _clamp(run, int(index or 0) + delta)
    return (gr.Slider(value=i), *show(run, i))


def play(run: RunTrace | None, playing: bool) -> tuple:
    """Outputs: playing, timer, play button."""
    playing = bool(run is not None and len(run.cycles) > 1 and not playing)
    return playing, gr.Timer(active=playing), gr.Button("\u275a\u275a Pause" if playing else "\u25b6 Play cycles")


def tick(run: RunTrace | None, index: float) -> tuple:
    """Outputs: slider, summary plot, *view, playing, timer, play button. Stops at the last cycle."""
    n = len(run.cycles) if run is not None else 0
    i = int(index or 0) + 1
    if i >= n:
        return (gr.skip(), gr.skip(), *[gr.skip()] * VIEW_SIZE, False, gr.Timer(active=False),
                gr.Button("\u25b6 Play cycles"))
    return (*step(run, i, 0), True, gr.skip(), gr.skip())


def output_selected(run: RunTrace | None, evt: gr.SelectData) -> tuple:
    """A click on output token i: jump to the cycle that committed it, with that token selected.
    Outputs: slider, summary plot, *view."""
    where = output_origin(run, int(evt.index)) if run is not None and isinstance(evt.index, int) else None
    if where is None:
        return (gr.skip(), gr.skip(), *[gr.skip()] * VIEW_SIZE)
    cycle, slot = where
    return (gr.Slider(value=cycle), gr.skip(), *view_values(run, cycle, slot))   # the summary: as `show`'s


def token_selected(run: RunTrace | None, index: float, frame: float, evt: gr.SelectData) -> tuple:
    """A click on item k of the cycle's token list selects that token. Outputs: focus, *figures."""
    if run is None or not run.cycles or not isinstance(evt.index, int):
        return (gr.skip(),) * 7
    slot = slot_of_item(run.cycles[_clamp(run, index)], int(evt.index))
    return (slot, *figure_values(run, index, frame, slot))


def phase_chosen(run: RunTrace | None, index: float, frame: float, slot: int | None) -> tuple:
    """Outputs: *figures."""
    return figure_values(run, index, frame, slot)


def phase_play(run: RunTrace | None, index: float, frame: float, playing: bool) -> tuple:
    """Start (from the first frame when at the end) or pause the cycle in motion.
    Outputs: playing, timer, button, phase slider."""
    if playing or run is None or not run.cycles:
        return False, gr.Timer(active=False), gr.Button("\u25b6 Play phases"), gr.skip()
    cycle = run.cycles[_clamp(run, index)]
    last = len(frames(cycle)) - 1
    start = 0 if int(frame or 0) >= last else int(frame or 0)
    return True, gr.Timer(active=True), gr.Button("\u275a\u275a Pause phases"), gr.Slider(value=start)


def phase_tick(run: RunTrace | None, index: float, frame: float, slot: int | None) -> tuple:
    """The next frame, until the end state. Outputs: phase slider, *figures, playing, timer, button."""
    stop = (False, gr.Timer(active=False), gr.Button("\u25b6 Play phases"))
    if run is None or not run.cycles:
        return (gr.skip(),) * 7 + stop
    cycle = run.cycles[_clamp(run, index)]
    nxt = int(frame or 0) + 1
    if nxt >= len(frames(cycle)):
        return (gr.skip(),) * 7 + stop
    done = nxt == len(frames(cycle)) - 1
    return (gr.Slider(value=nxt, label=f"phase {nxt}: {label(frame_at(cycle, nxt))}"),
            *figure_values(run, index, nxt, slot), *(stop if done else (True, gr.skip(), gr.skip())))


def tour_frame(cycle: CycleTrace, step_: int) -> int:
    """The phase frame tour stop `step_` talks about: the whole draft tree (its last draft level), verify, accept,
    rewind (the end state). The stops follow the engine's phases in order (TOUR and PHASES)."""
    phase = PHASES[step_ % len(PHASES)]
    return max(i for i, f in enumerate(frames(cycle)) if f.phase == phase)


def tour(run: RunTrace | None, index: float, step_: int, delta: int, slot: int | None = None) -> tuple:
    """The tour's next (delta +1) or previous (-1) stop, with the four figures at the phase it talks about. Past
    the last stop (rewind) the tour goes on into the next cycle, at its first stop (draft); before the first, back
    to the previous cycle's last; at the run's ends it wraps round the cycle shown.
    Outputs: tour step, tour text, slider, summary plot, *view (only the phase and figures where the cycle
    stays)."""
    skip = gr.skip()
    if run is None or not run.cycles:
        return (step_, "Run a prompt first: the tour walks through one recorded cycle.", *[skip] * (2 + VIEW_SIZE))
    i, moved = _clamp(run, index), step_ + delta
    cycle_delta = -1 if moved < 0 else 1 if moved >= len(TOUR) else 0
    nxt = _clamp(run, i + cycle_delta)
    step_ = moved % len(TOUR)
    frame = tour_frame(run.cycles[nxt], step_)
    if nxt == i:   # the same cycle: the phase and the figures only, the picked token kept
        view = [skip] * VIEW_SIZE
        view[3] = gr.Slider(value=frame)
        view[4:10] = figure_values(run, i, frame, slot)
        return (step_, tour_text(run, i, step_), skip, skip, *view)
    view = list(view_values(run, nxt))
    view[3] = phase_slider(len(frames(run.cycles[nxt])), frame)
    view[4:10] = figure_values(run, nxt, frame, None)
    return (step_, tour_text(run, nxt, step_), gr.Slider(value=nxt), gr.skip(), *view)   # the summary: as `show`'s


def tour_shown(run: RunTrace | None, index: float, step_: int):
    """The tour's text for the cycle now shown (a run opened, a cycle stepped to): it names that cycle.
    Output: tour text."""
    if run is None or not run.cycles:
        return gr.skip()
    return tour_text(run, _clamp(run, index), step_)


def tour_text(run: RunTrace, index: int, step_: int) -> str:
    """The tour's stop `step_` on cycle `index`, its first uses of a term linked to the glossary."""
    return glossary.link_terms(tour_step(run, run.cycles[index], step_))
