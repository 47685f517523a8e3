"""The Gradio app: layout first, events second, nothing else. Handlers live in `handlers` (model runs, files),
`navigation` (cycles, phases, the selected token) and `workshop` (links, recorded runs, projector); the
model pairs in `pairs`; the figures in `visuals`. Per-user data (the recorded run, the selected token, the
tour step, autoplay) lives in gr.State; the model is shared read-only by every tab.

The page reads top to bottom: the prompt and knobs (the run's status, the race's result and the output under
the buttons), then one cycle on one screen (the cycle and phase controls, the cycle's tokens to pick from, the
four linked views with one-line titles, the guided tour; their long explanations one click away), then the
run's summary and the deeper sections. What a click changes comes into sight: a finished run and a click in
the output scroll the cycle's views into the window. The page opens on the first preset's recorded run
(`workshop.open_link`): every view has its picture before anyone presses Run, and a window wider than a phone
opens scrolled to it, under a line inviting Run. The open tour stays on screen beside
(or below) the view it talks about. Typed knob values are taken into the knobs' ranges (`typed.Knob`). A room
(`rooms.Rooms`, one per app) lets a class follow the instructor's page live.

A shared server (a public Space, a workshop) is protected by `Limits` (eagleviz.app.limits, read from EAGLEVIZ_*
variables): stated on the page, enforced in the handlers (the API bypasses the page's sliders), and setting
the queue: `limits.active_runs` runs in progress at once, taking turns at the model cycle by cycle
(`eagleviz.app.scheduler`, `limits.concurrency` steps at a time), `limits.queue_size` waiting.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import aclosing

import gradio as gr

from eagleviz.app import glossary
from eagleviz.app import handout
from eagleviz.app import navigation as nav
from eagleviz.app import presets
from eagleviz.app import workshop
from eagleviz.app.typed import RANGES, Knob, WholeNumber
from eagleviz.app.rooms import Rooms
from eagleviz.decoding.engine import Engine
from eagleviz.app.handlers import Handlers, StopRequest
from eagleviz.app.limits import Limits
from eagleviz.measured import latest_bench, latest_ceiling, latest_verify_cost
from eagleviz.app.pairs import Pair, PairHub
from eagleviz.app.session import EngineHub, Knobs, attention_choices, fastest_tree, why_small_trees
from eagleviz.visuals import SpeedView, speed_view
from eagleviz.visuals.summary import CYCLE_BARS, OUTLINE_PX
from eagleviz.visuals.output_text import COLOURS as OUTPUT_COLOURS

INTRO = ("# eagleviz: EAGLE speculative decoding, cycle by cycle\n"
         "A small **draft** head guesses a *tree* of next tokens; the big **target** model checks the whole tree "
         "in one forward, keeps the longest agreeing path, adds one **bonus** token of its own, and rewinds its "
         "KV cache. Every figure is drawn from the recorded run, nothing is simulated. A linked word opens the "
         "glossary at the bottom of the page.")
AUTOPLAY_EVERY_S = 1.5
PHASE_EVERY_S = 0.9
# The output keeps the text's layout (line breaks, indentation): tokens sit edge to edge in a monospace font.
OUTPUT_CSS = ("#output-text .textfield {font-family: var(--font-mono); font-size: 14px; line-height: 1.7} "
              "#output-text .token.highlighted {margin: 0 1px 0 0; padding: 0 1px} "
              "#output-text .text {white-space: pre-wrap}")
# While the page's status says a run goes (or loads its model, or stops), Stop is marked so (`data-ev-running`)
# and drawn red; otherwise as a plain button. (On the button: Gradio copies a stylesheet's rules inside its
# container, where a rule that starts at body matches nothing.)
RUNNING_JS = ("(status) => { const on = /^(Running|Loading|Stopping)/.test(String(status || '')), "
              "stop = document.getElementById('stop'); "
              "if (stop) { if (on) stop.dataset.evRunning = '1'; else delete stop.dataset.evRunning; } return []; }")
IDLE_STOP_CSS = ("#stop:not([data-ev-running]) {background: var(--button-secondary-background-fill) !important; "
                 "color: var(--button-secondary-text-color) !important; "
                 "border-color: var(--button-secondary-border-color) !important} ")
CSS = (OUTPUT_CSS + IDLE_STOP_CSS + " #output-text {min-height: 4em} .ev-explain {font-size: 15px} "
       ".ev-limits {font-size: 12px; opacity: 0.8} "
       ".ev-bench th, .ev-bench td {white-space: nowrap; padding: 4px 12px} "
       # never "token s", "speedu p", "3.0 / 0": only the row names wrap
       "#race-result th, #compare-result th, #race-result td:not(:first-child) {white-space: nowrap} "
       # ... and the row names keep a readable width: a table wider than its column scrolls within it
       "#race-result table, #compare-result table {display: block; overflow-x: auto} "
       "#race-result td:first-child {min-width: 11em} "
       ".ev-line p {margin: 0; font-size: 14px} "
       # A room's code, large enough to read off a projector at the back of a room
       "#room-text p:first-child strong:first-child {font-family: var(--font-mono); font-size: 2.4em; "
       "letter-spacing: 0.12em} "
       # A page in a room says so wherever it is scrolled: the follow line stays at the window's top.
       "#follow-row {position: sticky; top: 0; z-index: 1000; padding: 4px 0; "
       "background: var(--body-background-fill, white) !important; "
       "border-bottom: 1px solid var(--border-color-primary)} "
       "@media (max-width: 640px) {#follow-row {flex-wrap: wrap; gap: 2px} #follow-row > * {flex-basis: 100%} "
       "#follow-text p {font-size: 13px}} "
       # ... and a view scrolled to (the tour's) starts below it
       "body:has(#follow-row) :is(#cycle-view, #draft-tree, #attention-mask, #accepted-path, #kv-rewind) "
       "{scroll-margin-top: 96px} "
       # On a phone, Run follows the prompt on the first screen: the presets and their note move below the output.
       "@media (max-width: 640px) {.column:has(> #preset-note) > .form:has(#preset), "
       ".column:has(> #preset-note) > #preset-note {order: 1}} "
       + workshop.PROJECTOR_CSS + " " + workshop.DARK_CSS + " " + workshop.SLIDES_CSS + " " + workshop.TOUR_CSS + " " + glossary.CSS)
# Gradio's Plot draws a changed figure twice: its plot element reacts to the new figure, then the component is made
# again around a new element that draws it once more (a keyed block). Each `Plotly.react` here waits for the rest of
# the update to be applied (a microtask: still before the page's next frame and its scripts, which measure what
# was drawn): one whose element has left the page by then is not drawn. Plotly is loaded with the first figure and
# set on `window`; the wrapper is put on it then.
PLOT_ONCE_HEAD = """<script>(() => {
  let plotly;
  const once = (react) => function (gd, ...rest) {
    return new Promise((done, failed) => queueMicrotask(() => {
      if (gd && gd.isConnected === false) { done(gd); return; }
      Promise.resolve(react.call(this, gd, ...rest)).then(done, failed); })); };
  Object.defineProperty(window, 'Plotly', {configurable: true, get() { return plotly; }, set(value) {
    plotly = value;
    if (value && value.react && !value.react.evOnce) { value.react = once(value.react); value.react.evOnce = true; }
  }});
})();</script>"""
# What `launch` takes for the page: its style, its head, and no run history. Gradio 6 keeps every event's inputs and
# outputs in the browser's localStorage by default (a visitor's prompts and outputs on a workshop's shared machine);
# it rewrote ~130 KB there several times a step, ~50 ms of the stepping page's main thread (docs/performance.md
# entry 63; a follower's drawing time did not change measurably).
PAGE = {"css": CSS, "head": PLOT_ONCE_HEAD, "run_history": False}
VIEW_CONCURRENCY = 4      # light events (stepping, knobs, import) of different users served side by side
CACHE_TTL_S = 3600        # Gradio deletes its cached files (uploads, downloads) after this long
KNOB_DEFAULTS = Knobs(max_new_tokens=presets.PRESET_TOKENS)
SOURCE_CHOICES = [("EAGLE head", "eagle"), ("prompt lookup", "lookup"), ("both", "eagle+lookup")]
TEXTBOOK = (5, 4, 16)
VIEW_MIN_WIDTH = 580      # px: the narrowest a view is drawn; two side by side only where both get this width
B_FOLLOWS = "B follows A."                                   # Compare's B: what its knobs are now
B_OWN = "B keeps its own settings; **B = A** follows A again."
B_KNOBS = 6  # steps, top-k, draft tokens, temperature, adaptive, source: A's and B's in the same order
B_OWN_JS = f"() => {json.dumps(B_OWN)}"
B_COPY_JS = f"(note, ...knobs) => note === {json.dumps(B_OWN)} ? knobs.slice({B_KNOBS}) : knobs.slice(0, {B_KNOBS})"
B_FROM_A_JS = f"(...a) => [{json.dumps(B_FOLLOWS)}, ...a]"
RACING = ("Racing: plain decoding, then the cost-aware and the fastest trees, on this run's prompt, each timed "
          "alone\u2026")
# Brings the cycle's controls, caption and first views into sight (unless the draft tree already is): after a
# run, an import or a recorded run (status given: only once it is there, not after a warning), and after a
# click in the output, which sits a screen above the views. A smooth scroll aims where the view was when it
# began, and what sits above may still change height as the last outputs are drawn (the cleared arrival line);
# on a busy machine the scroll itself stalls, and a correction made in flight overshoots. So the page waits
# until it has stopped scrolling, then aligns the view's top again, until it has stayed there for
# VIEWS_STILL_CHECKS checks or VIEWS_PLACE_MS have passed; a visitor who scrolls, clicks or types meanwhile is
# left alone. `body[data-ev-placing]` is set while it does so.
VIEWS_CHECK_MS = 150     # ms between two looks at the scroll position
VIEWS_STILL_CHECKS = 3   # looks in a row with the view in place and the page still: placed
VIEWS_PLACE_MS = 6000    # ms after which the page stops placing the views, placed or not
SHOW_VIEWS_JS = """(status) => {
  const tree = document.getElementById('draft-tree'), at = tree && tree.getBoundingClientRect();
  const ok = status === undefined || status === null || !String(status).startsWith('\u26a0');
  if (!ok || !at || (at.top >= 0 && at.bottom <= window.innerHeight)) return [];
  const view = document.getElementById('cycle-view'), body = document.body;
  const token = {}, moves = ['wheel', 'touchstart', 'keydown', 'mousedown'];
  const done = () => { moves.forEach(e => window.removeEventListener(e, done));
                       if (body.evPlacing === token) { delete body.evPlacing; delete body.dataset.evPlacing; } };
  body.evPlacing = token;   // a later call takes over: this one's checks end
  body.dataset.evPlacing = '1';
  moves.forEach(e => window.addEventListener(e, done, {passive: true}));
  view.scrollIntoView({behavior: 'smooth', block: 'start'});
  let y = NaN, still = 0, looks = Math.ceil(PLACE_MS / CHECK_MS);
  const look = () => {
    if (body.evPlacing !== token) return;
    if (looks-- <= 0) return done();
    if (window.scrollY === y) {              // the page is still: the view's top at the window's top?
      const margin = parseFloat(getComputedStyle(view).scrollMarginTop) || 0;   // below a room's follow line
      if (Math.abs(view.getBoundingClientRect().top - margin) > 4) { view.scrollIntoView({block: 'start'}); still = 0; }
      else if (++still >= STILL_CHECKS) return done();
    } else still = 0;
    y = window.scrollY;
    setTimeout(look, CHECK_MS);
  };
  setTimeout(look, CHECK_MS);
  return [];
}""".replace("CHECK_MS", str(VIEWS_CHECK_MS)).replace("STILL_CHECKS", str(VIEWS_STILL_CHECKS)).replace(
    "PLACE_MS", str(VIEWS_PLACE_MS))
# Stop's words, said by the page at the click and only over a status that says a run is going or loading: a
# server's answer could arrive after the run's "Done" and cover it. The run's own updates replace them.
STOPPING_JS = """(status) => /^(Running|Loading)/.test(String(status || '')) ?
  'Stopping after the current cycle\u2026' : status"""
ARRIVAL_MIN_PX = 640   # px: a narrower window (a phone) opens at the top, Run on its first screen
# On load: a link to a recorded run's picture or a room brings the views into sight (SHOW_VIEWS_JS); a plain
# visit, the line inviting Run above the views and the picture under it, unless the visitor has moved already.
ARRIVAL_JS = """(status) => {
  if (['gallery', 'room'].some(k => new URLSearchParams(location.search).has(k))) return (%s)(status);
  const note = document.getElementById('arrival-note'), focused = document.activeElement;
  const idle = window.scrollY < 8 && (!focused || focused === document.body);
  if (idle && note && note.innerText.trim() && window.innerWidth >= %d)
    requestAnimationFrame(() => note.scrollIntoView({block: 'start'}));
  return [];
}""" % (SHOW_VIEWS_JS, ARRIVAL_MIN_PX)

# The run summary outlines the bar of the cycle shown. A step to another cycle of the same run does not send the summary
# again (`nav.show`): the page moves the outline itself, a restyle of one attribute where a new summary (the largest
# of the five figures, ~85 ms to draw here) would be drawn whole on every page at every step. A summary that is sent
# (a new run, a follower's first picture of a run) comes outlined at its cycle.
SUMMARY_OUTLINE_JS = f"""(k) => {{
  const gd = document.querySelector('#summary-plot .js-plotly-plot');
  const at = gd && gd.data && window.Plotly ? gd.data.findIndex(t => t.meta === '{CYCLE_BARS}') : -1;
  if (at >= 0) window.Plotly.restyle(gd, {{'marker.line.width': [Array.from(gd.data[at].x,
    c => c === Number(k) ? {OUTLINE_PX} : 0)]}}, [at]);
  return [];
}}"""

# Pointing at a node of the draft tree picks its token, as a click in the cycle's token list does: its mask row,
# path chips and KV slot are outlined (Plotly's hover event; each node carries its item of the list). A pause of
# HOVER_PICK_MS first, so that a pointer crossing the tree does not pick every node it passes; the same node of
# the same cycle is picked once. Attached again whenever Gradio draws a new plot element.
HOVER_PICK_MS = 250
HOVER_PICKS_JS = """() => {
  let picked = null, timer = null;
  const attach = () => {
    const gd = document.querySelector('#draft-tree .js-plotly-plot');
    // a redraw that purges Plotly's listeners (newPlot) leaves the element: ask its emitter, not a flag
    if (!gd || !gd.on || (gd._ev && gd._ev.listeners && gd._ev.listeners('plotly_hover').length)) return;
    gd.on('plotly_hover', (ev) => {
      const item = ev.points && ev.points.length ? ev.points[0].customdata : null;
      const caption = document.getElementById('cycle-caption'), key = (caption ? caption.innerText.slice(0, 24) : '')
        + ':' + item;
      clearTimeout(timer);
      if (item === null || item === undefined || key === picked) return;
      timer = setTimeout(() => {
        const token = document.querySelectorAll('#cycle-tokens .token')[item];
        if (token) { picked = key; token.click(); }
      }, %d);
    });
    gd.on('plotly_unhover', () => clearTimeout(timer));
  };
  new MutationObserver(attach).observe(document.body, {childList: true, subtree: true});
  attach();
  return [];
}""" % HOVER_PICK_MS


def measured_speed() -> SpeedView:
    """The measured-speed section: the latest bench at T = 0 and T = 1, the verification cost curve and the
    ceiling, this machine's where measured, else the shipped ones. Read once when the page is built; no model is
    needed."""
    return speed_view([latest_bench(0), latest_bench(1)], latest_verify_cost(), latest_ceiling())


def tree_origin(fastest) -> str:
    """The line under the tree buttons: each preset brings its tree; the fastest one, where it comes from, and
    why it is small on a CPU."""
    where = ("`python -m eagleviz tune` finds this CPU's fastest tree." if not fastest else
             f"The fastest tree on this CPU, {fastest.label}, is the one `tune` found ({fastest.origin}); the race "
             "times it." if not fastest.shipped else
             f"The fastest tree {fastest.label} is the one `tune` found on the shipped benchmark's machine "
             f"({fastest.origin}); `python -m eagleviz tune` finds this CPU's own, and the race times it here.")
    return f"Each preset brings the tree that shows its lesson. {where} {why_small_trees()}"


def as_pairs(engine: Engine | Callable[[], Engine] | EngineHub | PairHub, model_id: str = "",
             head_path: str | None = None) -> PairHub:
    """A PairHub for what `build_app` was given: one ready pair unless it is a PairHub already."""
    if isinstance(engine, PairHub):
        return engine
    hub = engine if isinstance(engine, EngineHub) else EngineHub(engine, model_id, head_path)
    pairs = PairHub((Pair(model_id or "default"),), load=lambda pair: hub, release=lambda: None)
    with pairs.use():  # resident at once (a factory still runs on first use only)
        pass
    return pairs


def build_app(engine: Engine | Callable[[], Engine] | EngineHub | PairHub, model_id: str = "",
              head_path: str | None = None, note: str = "", gpu: Callable[[Callable], Callable] = lambda fn: fn,
              limits: Limits | None = None, rooms: Rooms | None = None) -> gr.Blocks:
    """The app, with its queue configured. `engine` is an Engine, a factory called once on first use, a ready
    EngineHub, or a PairHub of the operator's model/head pairs. `gpu` wraps the handlers that run the model (on
    ZeroGPU Spaces: `spaces.GPU`). `limits` defaults to the EAGLEVIZ_* environment (Limits.from_env); `rooms` to
    rooms with their default timings (`eagleviz.app.rooms`)."""
    limits = limits or Limits.from_env()
    pairs = as_pairs(engine, model_id, head_path)
    h = Handlers(pairs, limits)
    rooms = Rooms() if rooms is None else rooms   # the rooms a class follows on this server (`eagleviz.app.rooms`)
    run_fn, race_fn, api_fn = gpu(h.run), gpu(h.race), gpu(h.api_generate)
    first = presets.PRESETS[0]
    d = presets.knobs(first, KNOB_DEFAULTS)   # the page opens on the first preset, with its branching tree
    fastest = fastest_tree()
    with gr.Blocks(title="eagleviz: EAGLE speculative decoding", delete_cache=(CACHE_TTL_S, CACHE_TTL_S)) as demo:
        run_state, tour_state, stop = gr.State(None), gr.State(0), gr.State(StopRequest())
        playing, phase_playing, focus = gr.State(False), gr.State(False), gr.State(None)
        room_code, joined = gr.State(None), gr.State(None)   # the room this page opened, the room it joined
        gr.Markdown(glossary.link_terms(INTRO) + (f"\n\n{note}" if note else ""), elem_id="intro")
        link_note = gr.Markdown(elem_id="link-note")  # what a shared link could not restore, at the top
        with gr.Row(visible=len(pairs.names) > 1):
            pair = gr.Dropdown(pairs.names, value=pairs.default, label="model and draft head", elem_id="pair",
                               scale=2)
            pair_note = gr.Markdown(h.pair_note(pairs.default), elem_id="pair-note")
        with gr.Row():
            with gr.Column(scale=3):
                # No max_length: the browser would cut a long paste short without a word; the note says it.
                prompt = gr.Textbox(first.prompt, label="Prompt", lines=2, elem_id="prompt")
                prompt_note = gr.Markdown(elem_id="prompt-note", elem_classes="ev-line")
                preset = gr.Radio([p.name for p in presets.PRESETS], value=first.name, label="Presets that teach",
                                  elem_id="preset", info=presets.RESTORE)
                preset_note = gr.Markdown(presets.note(first), elem_id="preset-note", elem_classes="ev-line")
                with gr.Row():
                    run_btn = gr.Button("\u25b6 Run", variant="primary", elem_id="run")
                    stop_btn = gr.Button("\u25a0 Stop", variant="stop", elem_id="stop")   # red while a run goes (CSS)
                    race_btn = gr.Button("Race plain decoding", elem_id="race")
                queue_note = gr.Markdown(elem_id="queue-note")
                status = gr.Markdown(elem_id="status")
                race_md = gr.Markdown(elem_id="race-result")   # beside its button: a race is seen where it starts
                output = gr.HighlightedText([], label="Output: click a token to open the cycle that committed it",
                                            color_map=OUTPUT_COLOURS, show_legend=True, combine_adjacent=False,
                                            elem_id="output-text", interactive=False)
            with gr.Column(scale=2):
                steps = Knob(*RANGES["steps"], d.steps, step=1, label="steps \u00b7 speculative_num_steps",
                             elem_id="steps")
                topk = Knob(*RANGES["topk"], d.topk, step=1, label="topk \u00b7 speculative_eagle_topk", elem_id="topk")
                draft_tokens = Knob(2, limits.max_draft_tokens, min(d.draft_tokens, limits.max_draft_tokens),
                                    step=1, elem_id="draft-tokens",
                                    label="draft tokens \u00b7 speculative_num_draft_tokens")
                with gr.Row():
                    textbook = gr.Button(f"Textbook tree {' / '.join(map(str, TEXTBOOK))}", size="sm",
                                         elem_id="textbook-tree")
                    fast_btn = gr.Button(("Fastest tree, shipped benchmark: " if fastest.shipped
                                          else "Fastest on this CPU: ") + fastest.label if fastest else
                                         "Fastest tree: not measured",
                                         size="sm", elem_id="fastest-tree", interactive=fastest is not None)
                gr.Markdown(tree_origin(fastest), elem_id="default-tree", elem_classes="ev-limits")
                with gr.Row():
                    adaptive = gr.Checkbox(d.adaptive, label="Cost-aware tree", elem_id="adaptive", scale=1,
                                           info="on: the three knobs become upper bounds, each cycle drafts and "
                                                "verifies what pays here; off: SGLang's fixed tree")
                    source = gr.Radio(SOURCE_CHOICES, value=d.source, label="Draft source", elem_id="draft-source",
                                      scale=2)
                validity = gr.Markdown(d.validity(), elem_id="validity", elem_classes="ev-limits")
                typed_md = gr.Markdown(elem_id="typed-note", elem_classes="ev-limits")   # a typed value not used as typed
                with gr.Row():
                    temperature = Knob(*RANGES["temperature"], d.temperature, step=0.05, label="temperature",
                                       elem_id="temperature")
                    top_p = Knob(*RANGES["top_p"], d.top_p, step=0.05, label="top-p", elem_id="top-p")
                with gr.Row():
                    max_new = Knob(1, limits.max_new_tokens, min(d.max_new_tokens, limits.max_new_tokens),
                                   step=1, label="max new tokens", elem_id="max-new-tokens")
                    seed = WholeNumber(d.seed, precision=0, minimum=0, label="seed", elem_id="seed")
                attn = gr.Dropdown(list(attention_choices()), value=d.attn_impl, label="attention implementation",
                                   elem_id="attn-impl")
        with gr.Accordion("Workshop: recorded runs, a link to these settings, projector", open=False,
                          elem_id="workshop"):
            with gr.Row():
                recorded = gr.Dropdown(workshop.gallery_choices(), value=None, elem_id="gallery", scale=3,
                                       label="Recorded runs: replay instantly, no model work (no queue)")
                with gr.Column(scale=1, min_width=160):
                    projector = gr.Checkbox(False, label="Projector: large text", elem_id="projector")
                    dark = gr.Checkbox(False, label="Dark, figures too", elem_id="dark")
            with gr.Row():
                link_btn = gr.Button("Link to what is shown: these settings, a recorded run's picture", size="sm",
                                     elem_id="link")
                link_md = gr.Markdown(elem_id="link-text")
            with gr.Row():
                room_btn = gr.Button("Open a room: the class follows this page live", size="sm", elem_id="open-room")
                room_md = gr.Markdown(elem_id="room-text")
                room_class = gr.Markdown(elem_id="room-class")   # how many pages follow the room now
                beat = gr.Timer(rooms.here_every_s, active=False)   # a page with a room says it is there
                room_claim = gr.Textbox(visible=False, elem_id="room-claim")   # the room this browser opened
            gr.Markdown(limits.describe(), elem_id="limits", elem_classes="ev-limits")
        with gr.Accordion("Compare two settings on this prompt: tokens per cycle, acceptance per position, speed",
                          open=False, elem_id="compare-section"):
            gr.Markdown("**A** is the knobs above; **B** starts as A and follows it until one of B's knobs is moved "
                        "(**B = A** copies A again). Compare runs both on the prompt, one after the other, and "
                        "counts what each cycle accepted.", elem_classes="ev-line")
            with gr.Row():
                b_steps = Knob(*RANGES["steps"], d.steps, step=1, label="B steps", elem_id="b-steps", min_width=160)
                b_topk = Knob(*RANGES["topk"], d.topk, step=1, label="B topk", elem_id="b-topk", min_width=160)
                b_draft = Knob(2, limits.max_draft_tokens, min(d.draft_tokens, limits.max_draft_tokens), step=1,
                               label="B draft tokens", elem_id="b-draft-tokens", min_width=160)
                b_temperature = Knob(*RANGES["temperature"], d.temperature, step=0.05, label="B temperature",
                                     elem_id="b-temperature", min_width=160)
            with gr.Row():
                b_adaptive = gr.Checkbox(d.adaptive, label="B cost-aware tree", elem_id="b-adaptive", scale=1)
                b_source = gr.Radio(SOURCE_CHOICES, value=d.source, label="B draft source", elem_id="b-source",
                                    scale=2)
                with gr.Column(scale=1, min_width=160):
                    compare_btn = gr.Button("Compare A and B", elem_id="compare")
                    b_from_a = gr.Button("B = A", elem_id="b-from-a", size="sm")
                    b_note = gr.Markdown(B_FOLLOWS, elem_id="b-follows", elem_classes="ev-line")
            compare_md = gr.Markdown(elem_id="compare-result")
            with gr.Row():
                compare_hist = gr.Plot(label="Acceptance histogram", elem_id="compare-histogram", show_label=False,
                                       min_width=340)
                compare_pos = gr.Plot(label="Acceptance rate per position", elem_id="compare-positions",
                                      show_label=False, min_width=340)

        # ------------------------------------------------------------ one cycle, one screen
        arrival_md = gr.Markdown(elem_id="arrival-note", elem_classes="ev-line")   # a recorded run shown: Run, above
        with gr.Row(visible=False, elem_id="follow-row") as follow_row:   # on a page that joined a room
            follow = gr.Checkbox(True, label="Follow the instructor", elem_id="follow", scale=1, min_width=200)
            follow_md = gr.Markdown(elem_id="follow-text", elem_classes="ev-line", min_width=300)   # below on a phone
        with gr.Row(equal_height=True, elem_id="cycle-view"):
            slider = Knob(0, 1, 0, step=1, label="cycle", elem_id="cycle-slider", interactive=False, scale=4)
            phase = Knob(0, 1, 1, step=1, label="phase", elem_id="phase-slider", interactive=False, scale=4)
            with gr.Column(scale=3, min_width=260):
                with gr.Row():
                    first_btn = gr.Button("\u21e4 cycle 0", elem_id="first-cycle", size="sm", min_width=40)
                    prev_btn = gr.Button("\u25c0", elem_id="prev", size="sm", min_width=40)
                    next_btn = gr.Button("\u25b6", elem_id="next", size="sm", min_width=40)
                    play_btn = gr.Button("\u25b6 Play cycles", elem_id="play", size="sm")
                phase_btn = gr.Button("\u25b6 Play phases", elem_id="play-phases", size="sm")
        with gr.Row():
            tokens = gr.HighlightedText([], label="tokens of this cycle", color_map=nav.TOKEN_COLOURS,
                                        show_legend=True, elem_id="cycle-tokens", interactive=False, scale=2,
                                        show_label=False)
            with gr.Column(scale=3):
                caption = gr.Markdown(elem_id="cycle-caption", elem_classes="ev-line")
                phase_md = gr.Markdown(elem_id="phase-text", elem_classes="ev-line")
                focus_md = gr.Markdown(nav.TOKEN_HELP, elem_id="focus-text", elem_classes="ev-line")
        # Two views side by side where each gets VIEW_MIN_WIDTH, else one per row (a 1024 px screen, projector mode)
        with gr.Row():
            tree_plot = gr.Plot(label="Draft tree", elem_id="draft-tree", show_label=False, min_width=VIEW_MIN_WIDTH)
            mask_plot = gr.Plot(label="Attention mask", elem_id="attention-mask", show_label=False,
                                min_width=VIEW_MIN_WIDTH)
        with gr.Row():
            path_plot = gr.Plot(label="Accepted path", elem_id="accepted-path", show_label=False,
                                min_width=VIEW_MIN_WIDTH)
            kv_plot = gr.Plot(label="KV rewind", elem_id="kv-rewind", show_label=False, min_width=VIEW_MIN_WIDTH)
        with gr.Accordion("Guided tour: one cycle in four steps (the \u2190 \u2192 keys step it)", open=False,
                          elem_id="tour-section") as tour_section:
            tour_md = gr.Markdown("Run a prompt, then step through draft, verify, accept and rewind.", elem_id="tour")
            with gr.Row():
                tour_prev = gr.Button("\u25c0 Tour back", elem_id="tour-prev", size="sm", min_width=120)
                tour_next = gr.Button("Tour next \u25b6", elem_id="tour-next", size="sm", min_width=120)
                slides = gr.Checkbox(False, label="Slides: one view, full width", elem_id="slides", min_width=160)
        with gr.Accordion("Explain these four views, with this cycle's numbers", open=False, elem_id="explain"):
            with gr.Row(equal_height=True):
                picture_btn = gr.Button("Save the four views as a picture (PNG)", elem_id="picture", size="sm",
                                        min_width=200)
                handout_btn = gr.Button("Print a one-page handout", elem_id="handout", size="sm", min_width=200)
                gif_btn = gr.Button("Save Play phases as a GIF", elem_id="phases-gif", size="sm", min_width=200)
                phases_data = gr.Textbox(visible=False, elem_id="phases-data")   # the frames, for the GIF's JS
            handout_md = gr.Markdown(elem_id="handout-note", elem_classes="ev-line")
            with gr.Row():
                tree_md = gr.Markdown(elem_classes="ev-explain")
                mask_md = gr.Markdown(elem_classes="ev-explain")
            with gr.Row():
                path_md = gr.Markdown(elem_classes="ev-explain")
                kv_md = gr.Markdown(elem_classes="ev-explain")

        # ------------------------------------------------------------ the run as a whole, and deeper
        summary = gr.Markdown(elem_id="summary")
        summary_plot = gr.Plot(label="Run summary", elem_id="summary-plot", show_label=False)
        with gr.Accordion("Losslessness at T > 0: replay the acceptance step", open=False):
            replay_plot = gr.Plot(label="Acceptance replay", elem_id="replay", show_label=False)
            replay_md = gr.Markdown(elem_classes="ev-explain")
        with gr.Accordion("Measured speed: EAGLE vs plain decoding vs peers", open=False, elem_id="measured-speed"):
            speed = measured_speed()
            for i, panel in enumerate(speed.benches):
                gr.Markdown(panel.text, elem_id=f"bench-table-{i}", elem_classes="ev-bench")
                gr.Plot(panel.figure, label="Measured tokens/s", elem_id=f"bench-plot-{i}", show_label=False)
            gr.Markdown(speed.curve_text, elem_id="verify-cost-text")
            gr.Plot(speed.curve, label="Verification cost", elem_id="verify-cost", show_label=False)
            gr.Markdown(speed.ceiling_text, elem_id="ceiling-text")
            gr.Plot(speed.ceiling, label="Ceiling", elem_id="ceiling", show_label=False)
        with gr.Accordion("Save, load, deploy", open=False):
            with gr.Row():
                export_btn = gr.DownloadButton("Export trace (JSON)", value=None, elem_id="export")
                import_file = gr.File(label="Import a trace (JSON)", file_types=[".json"], type="filepath",
                                      elem_id="import")
            flags = gr.Code(language="shell", label="Launch flags for these knobs", elem_id="launch-flags")
        with gr.Accordion("Glossary: the words this page uses", open=False, elem_id="glossary"):
            gr.Markdown(glossary.markdown(), elem_id="glossary-text")
        timer = gr.Timer(AUTOPLAY_EVERY_S, active=False)
        phase_timer = gr.Timer(PHASE_EVERY_S, active=False)

        # ------------------------------------------------------------ events
        knobs = [steps, topk, draft_tokens, temperature, top_p, max_new, seed, attn, adaptive, source]
        view = [focus, caption, tokens, phase, phase_md, focus_md, tree_plot, mask_plot, path_plot, kv_plot,
                tree_md, mask_md, path_md, kv_md, replay_plot, replay_md]
        figures = [phase_md, focus_md, tree_plot, mask_plot, path_plot, kv_plot]
        run_outputs = [run_state, output, status, slider, summary, summary_plot, export_btn, tour_md] + view
        cycle_outputs = [slider, summary_plot, *view]
        # Up to `active_runs` runs in progress at once; they take turns at the model cycle by cycle (h.turns).
        model = dict(concurrency_id="model", concurrency_limit=limits.active_runs)
        quiet = dict(show_progress="hidden")
        preset.input(h.preset_chosen, preset, [prompt, preset_note, temperature, steps, topk, draft_tokens, adaptive,
                                               source])
        textbook.click(lambda: TEXTBOOK, None, [steps, topk, draft_tokens], queue=False)
        if fastest is not None:
            t = fastest.tree   # as `tune` measured it: fixed, with its draft source
            fast_btn.click(lambda: (t.steps, t.topk, t.draft_tokens, t.adaptive, t.source), None,
                           [steps, topk, draft_tokens, adaptive, source], queue=False)
        # On load too: the launch flags are there before any knob moves.
        gr.on([demo.load, *[k.change for k in knobs], pair.change], h.knobs_changed, knobs + [pair], [validity, flags],
              **quiet)
        prompt.change(limits.prompt_note, prompt, prompt_note, queue=False, **quiet)
        for knob in (steps, topk, draft_tokens, temperature, top_p, max_new, seed):   # what was typed, unprocessed:
            knob.input(knob.noted, knob, [knob, typed_md], preprocess=False, queue=False, **quiet)  # set, and why
        # An edited preset lets go (its note would describe settings no longer there); clicking it restores it.
        gr.on([prompt.change, *[k.change for k in knobs]], h.preset_kept, [preset, prompt, *knobs],
              [preset, preset_note], queue=False, **quiet)
        pair.change(h.pair_note, pair, pair_note, **quiet)
        def opened(request: gr.Request):  # Gradio passes the page's request (its query) by this annotation
            return workshop.open_link(h, d, request)

        settings = [prompt, preset, preset_note, *knobs]
        def invited(entry, request: gr.Request):   # by this annotation, as `opened`
            return workshop.invitation(entry, "room" in request.query_params)

        # The page opens with a picture in sight (`ARRIVAL_JS`), not the knobs: on arrival, the line inviting Run above
        # the views; from a link to a recorded run's picture (a room's link), the views.
        # Then the room this browser opened, if it is still there: taken back, its picture shown again (after the
        # arrival's picture, which it replaces).
        def reclaimed(claim, request: gr.Request):   # the room this browser opened, written out at this page's address
            return workshop.room_reclaimed(h, rooms, claim, workshop.page_address(request))

        def room_opened(run, index, frame, slot, request: gr.Request):
            return workshop.room_opened(rooms, run, index, frame, slot, workshop.page_address(request))

        def heard(code, said):
            return workshop.room_heard(rooms, code, said)

        taken_back = demo.load(opened, None, [*run_outputs, *settings, pair, projector, link_note, recorded]).then(
            invited, recorded, arrival_md, queue=False, **quiet).then(None, status, None, js=ARRIVAL_JS).then(
            None, None, room_claim, js=workshop.ROOM_READ_JS).then(
            reclaimed, room_claim, [room_code, room_md, room_claim, recorded, arrival_md, *run_outputs, *settings],
            queue=False, **quiet)
        taken_back.then(None, room_claim, None, js=workshop.ROOM_KEPT_JS)
        # A room: the instructor's page shows, every page that joined it follows (no model work on theirs).
        # While this page has a room (opened, or taken back), it beats: its followers know it is there, it hears how
        # many follow.
        beating = dict(fn=lambda c: gr.Timer(active=bool(c)), inputs=room_code, outputs=beat, queue=False, **quiet)
        beaten = dict(fn=heard, inputs=[room_code, room_class], outputs=[room_class, beat], queue=False, **quiet)
        room_btn.click(room_opened, [run_state, slider, phase, focus], [room_code, room_md, room_claim],
                       queue=False).then(None, room_claim, None, js=workshop.ROOM_KEPT_JS).then(**beating).then(**beaten)
        taken_back.then(**beating).then(**beaten)
        beat.tick(**beaten)
        # A move of the page's own (a step, Play, a phase, an output click, the tour, a recorded run, a preset, an
        # import), once shown: the room's next picture and the tour's words for the cycle, one answer
        # (`workshop.moved`), chained after the move's event. Not on the views' `.change`: a follower's views change
        # with every picture pushed to it, and each event there was a request and rounds of Gradio's status updates
        # (docs/performance.md, entries 64-65). A run tells the room from its own output (`ran_told`), to its end.
        moved = dict(fn=lambda c, r, i, f, s, t: workshop.moved(rooms, c, r, i, f, s, t),
                     inputs=[room_code, run_state, slider, phase, focus, tour_state], outputs=[room_md, tour_md],
                     queue=False, **quiet)
        def room_joined(request: gr.Request):   # by this annotation, as `opened`
            return workshop.room_joined(request)

        # The picture is pushed to each follower by its page's one long-lived stream, woken by the room's moves; it is
        # made as Gradio sends it once per move, for every follower (`shared.sent_once`). The stream waits, it does
        # not work: no limit on how many run at once, and none holds a worker of the queue.
        follow_tour = gr.Textbox(visible="hidden", elem_id="follow-tour")   # the instructor's tour words: the scroll
        pictured = [output, slider, summary_plot, *view, tour_state, tour_md, tour_section, follow_tour]
        follow_tour.change(None, follow_tour, None, js=workshop.FOLLOW_TOUR_JS)   # a follower: the stop's view shown

        async def room_followed(code, on, request: gr.Request):   # an async generator: Gradio streams its updates
            async with aclosing(workshop.room_followed(rooms, code, on, request.session_hash, pictured)) as stream:
                async for out in stream:   # closed with Gradio's: a page that leaves or unticks is forgotten at once
                    yield out

        demo.load(room_joined, None, [joined, follow_row])
        followed = dict(fn=room_followed, inputs=[joined, follow], outputs=[run_state, *pictured, follow_md],
                        postprocess=False, concurrency_limit=None, concurrency_id="room", trigger_mode="multiple",
                        **quiet)
        joined.change(**followed)
        # Unticked: this page's stream ends; ticked again: a new one starts with the room's picture at once. Heard
        # while the page's stream runs ("multiple"): it runs as long as the page follows.
        follow.input(**followed)
        dark.input(None, dark, None, js=workshop.DARK_JS)   # a page opened dark (`?__theme=dark`) says so below
        demo.load(None, None, dark, js=workshop.DARK_READ_JS)
        projector.change(None, projector, None, js=workshop.PROJECTOR_JS).then(None, None, None,
                                                                              js=workshop.PLACE_TOUR_JS)
        run_btn.click(h.announce, stop, queue_note, queue=False, **quiet)
        run_btn.click(lambda: "", None, race_md, queue=False, **quiet)   # a race result is about the previous run
        # A preset, a recorded run or an import replaces what an old race or a refused request spoke of.
        gr.on([preset.input, recorded.input, import_file.upload], workshop.notices_cleared, status, [race_md, status],
              queue=False, **quiet)
        preset.input(lambda name: limits.prompt_note(presets.by_name()[name].prompt) if name in presets.by_name()
                     else gr.skip(), preset, prompt_note, queue=False, **quiet)   # a preset's prompt, said now
        def ran_told(code, *args):   # a run's output, told to the room this page opened as each part is sent
            outs = run_fn(*args)
            try:
                for out in outs:
                    yield out
                    workshop.run_streamed(rooms, code, out)
            finally:   # a page that left closes this generator: the run's own closes with it, at once
                getattr(outs, "close", lambda: None)()

        ran = run_btn.click(ran_told, [room_code, stop, pair, prompt, *knobs], run_outputs, show_progress="minimal",
                            api_name="run", **model)
        ran.then(lambda: "", None, queue_note, queue=False, **quiet)   # no queue now
        status.change(None, status, None, js=RUNNING_JS)   # Stop red while there is a run to stop, not when idle
        ran.then(None, status, None, js=SHOW_VIEWS_JS)                  # done: the views, in sight
        # Stop skips the queue: it must reach the running generator even when the queue is full. Its words are the
        # page's (STOPPING_JS), so that no answer of the server's can arrive after "Done" and cover it.
        stop_btn.click(None, status, status, js=STOPPING_JS, queue=False, **quiet)

        def stop_asked(request: StopRequest) -> None:   # an event with no outputs returns nothing
            h.request_stop(request)
        stop_btn.click(stop_asked, stop, None, queue=False, **quiet)
        # The slider moved by hand (typed, clicked, dragged): the views follow; the slider itself is not an output.
        # A move (a step, a token, a phase too) is told to the instructor's room as the server answers it
        # (`workshop.room_told`), not once the page has drawn it.
        gr.on([slider.input, slider.release], lambda r, i, c: workshop.room_slid(rooms, c, r, i),
              [run_state, slider, room_code], [summary_plot, *view], trigger_mode="always_last", **quiet).then(**moved)
        first_btn.click(lambda r, c: workshop.room_stepped(rooms, c, r, 0, 0), [run_state, room_code], cycle_outputs,
                        **quiet).then(**moved)
        prev_btn.click(lambda r, i, c: workshop.room_stepped(rooms, c, r, i, -1), [run_state, slider, room_code],
                       cycle_outputs, **quiet).then(**moved)
        next_btn.click(lambda r, i, c: workshop.room_stepped(rooms, c, r, i, +1), [run_state, slider, room_code],
                       cycle_outputs, **quiet).then(**moved)
        play_btn.click(nav.play, [run_state, playing], [playing, timer, play_btn])
        timer.tick(nav.tick, [run_state, slider], [*cycle_outputs, playing, timer, play_btn], **quiet).then(**moved)
        output.select(nav.output_selected, run_state, cycle_outputs, **quiet).then(**moved)
        output.select(None, None, None, js=SHOW_VIEWS_JS)   # the output sits above the views, out of their sight
        def picked(run, index, frame, code, evt: gr.SelectData):   # Gradio passes the click by this annotation
            return workshop.room_picked(rooms, code, run, index, frame, evt)

        tokens.select(picked, [run_state, slider, phase, room_code], [focus, *figures], **quiet)

        def stepped_away(code, on, request: gr.Request):   # a follower's own move: it stops following, and says so
            return workshop.stepped_away(rooms, code, on, request.session_hash)

        gr.on([slider.input, first_btn.click, prev_btn.click, next_btn.click, play_btn.click, output.select,
               tokens.select, phase.release, phase_btn.click], stepped_away, [joined, follow], follow, queue=False,
              **quiet)
        phase.release(lambda r, i, f, s, c: workshop.room_phased(rooms, c, r, i, f, s),
                      [run_state, slider, phase, focus, room_code], figures, **quiet)
        phase_btn.click(nav.phase_play, [run_state, slider, phase, phase_playing],
                        [phase_playing, phase_timer, phase_btn, phase], **quiet).then(**moved)
        phase_timer.tick(nav.phase_tick, [run_state, slider, phase, focus],
                         [phase, *figures, phase_playing, phase_timer, phase_btn], **quiet).then(**moved)
        tour_outputs = [tour_state, tour_md, slider, summary_plot, *view]   # past rewind: on into the next cycle
        # Each step brings the view it talks about into sight (in slides mode, the one view shown), and is told to
        # the room this page opened, if any: its followers' tours open at the same stop, with its words.
        told = dict(fn=lambda c, s, r: workshop.room_toured(rooms, c, s, r), inputs=[room_code, tour_state, run_state],
                    outputs=None, queue=False, **quiet)
        for button, delta in ((tour_prev, -1), (tour_next, +1)):
            stepped = button.click(lambda r, i, s, f, d=delta: nav.tour(r, i, s, d, f),
                                   [run_state, slider, tour_state, focus], tour_outputs, **quiet)
            stepped.then(None, tour_md, None, js=workshop.TOUR_VIEW_JS)
            stepped.then(**told)
            stepped.then(**moved)
        slides.change(None, slides, None, js=workshop.SLIDES_JS)
        # opened: the figures at the phase its stop talks about (not the finished cycle), its view in sight
        opened_tour = tour_section.expand(lambda r, i, s, f: nav.tour(r, i, s, 0, f),
                                          [run_state, slider, tour_state, focus], tour_outputs, **quiet)
        opened_tour.then(None, tour_md, None, js=workshop.TOUR_VIEW_JS)
        opened_tour.then(**told)
        opened_tour.then(**moved)
        tour_section.collapse(None, None, None, js=workshop.TOUR_CLOSED_JS)   # closed: the page's full width again
        tour_section.collapse(lambda c: workshop.room_toured(rooms, c, None), room_code, None, queue=False, **quiet)
        demo.load(None, None, None, js=workshop.TOUR_KEYS_JS)
        demo.load(None, None, None, js=glossary.LINKS_JS)
        picture_btn.click(None, None, handout_md, js=handout.PICTURE_JS)   # made in the browser: no request
        handout_btn.click(None, None, handout_md, js=handout.HANDOUT_JS)
        gif_btn.click(nav.phase_frames, [run_state, slider, focus], phases_data, **quiet).then(
            None, phases_data, handout_md, js=handout.GIF_JS)   # the server's figures, drawn and encoded in the page
        demo.load(None, None, None, js=HOVER_PICKS_JS)   # a tree node pointed at is picked, as a click would
        slider.change(None, slider, None, js=SUMMARY_OUTLINE_JS)   # the summary outlines the cycle shown, in the page
        # The tour's text names the cycle shown: a run (an import, a recorded run) opens on the tour's first step,
        # and a cycle moved to keeps the tour's step (its words from `moved`, once the move is shown).
        gr.on([run_btn.click, import_file.upload, recorded.input, preset.input], lambda: 0, None, tour_state,
              queue=False, **quiet)
        # Said at once, beside the button: the race itself waits for the model and takes seconds.
        race_btn.click(lambda: RACING, None, race_md, queue=False, **quiet).then(
            race_fn, [run_state, attn, pair, stop], race_md, **model)
        imported = import_file.upload(lambda path, a: workshop.trace_imported(h, path, a), [import_file, attn],
                                      [*run_outputs, *settings])
        imported.then(None, status, None, js=SHOW_VIEWS_JS)
        imported.then(**moved)
        opened_run = recorded.input(lambda e: workshop.gallery_opened(h, e), recorded, [*run_outputs, *settings])
        opened_run.then(None, status, None, js=SHOW_VIEWS_JS)
        opened_run.then(**moved)
        # A preset brings its own recorded run: never the last preset's picture under this one's settings.
        preset_run = preset.input(lambda name: workshop.preset_opened(h, name), preset, [*run_outputs, recorded],
                                  **quiet)
        preset_run.then(invited, recorded, arrival_md, queue=False, **quiet)
        preset_run.then(**moved)
        # The recorded run shown is the gallery's choice until a run or an import replaces it.
        gr.on([run_btn.click, import_file.upload], lambda: None, None, recorded, queue=False, **quiet)
        gr.on([run_btn.click, import_file.upload], lambda: "", None, arrival_md, queue=False, **quiet)
        recorded.input(invited, recorded, arrival_md, queue=False, **quiet)
        link_btn.click(lambda p, s, m, e, r, i, f, t, *k: workshop.picture_link(e, r, i, f, t) + workshop.link_for(
            p, s, m if len(pairs.names) > 1 else None, *k), [prompt, preset, pair, recorded, run_state, slider, phase,
                                                            focus, *knobs], link_md, queue=False)
        # Said at once; the two runs wait for their turns at the model like any run.
        b_knobs = [b_steps, b_topk, b_draft, b_temperature, b_adaptive, b_source]
        # B follows A's tree and temperature until one of B's own knobs is moved; B = A makes it follow again.
        a_knobs = [steps, topk, draft_tokens, temperature, adaptive, source]
        # All in the page, no request: a copy answered by a busy server could land over a value typed into B since.
        gr.on([b.input for b in b_knobs], None, None, b_note, js=B_OWN_JS)
        gr.on([a.change for a in a_knobs], None, [b_note, *a_knobs, *b_knobs], b_knobs, js=B_COPY_JS)
        b_from_a.click(None, a_knobs, [b_note, *b_knobs], js=B_FROM_A_JS)
        compare_btn.click(lambda: "Comparing: setting A, then setting B, on this prompt\u2026", None, compare_md,
                          queue=False, **quiet).then(gpu(h.compare), [stop, pair, prompt, *knobs, *b_knobs],
                                                     [compare_md, compare_hist, compare_pos], **model)
        gr.api(api_fn, api_name="generate", **model)
    return demo.queue(max_size=limits.queue_size, default_concurrency_limit=VIEW_CONCURRENCY)
