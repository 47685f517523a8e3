"""Workshop mode on the page: a link that reproduces a run, recorded runs that replay with no model work (the page
opens on one), the projector layout, and the tour beside its pictures (its panel, and slides: one view at a time,
stepped with the arrow keys).

    trace_imported an uploaded trace, shown with the prompt and knobs it was made with
    open_link      on page load: the link's prompt, knobs, preset, model, layout and gallery entry, validated
                   (`eagleviz.app.share`); a bad parameter gives its default and a visible note, never an error page;
                   a link with no settings (a plain visit, `?projector=1`) opens on the first preset's recorded run
    notices_cleared what a preset, a recorded run or an import makes stale: an old race, a refused request's warning
    gallery_opened a recorded run from assets/gallery (`eagleviz.app.gallery`), shown like an imported trace
    invitation     the line above the views while they show a recorded run: what it is, and Run a screen above
    link_for       the relative link ("?prompt=...") to the page's current prompt and knobs
    picture_link   the relative link ("?gallery=...&cycle=...") to the picture shown of a recorded run
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import fields, replace
from urllib.parse import quote

import gradio as gr

from eagleviz.app import gallery, presets, qr, share
from eagleviz.app.rooms import Rooms
from eagleviz.app.shared import sent_once
from eagleviz.errors import UserFacingError
from eagleviz.app.handlers import Handlers, cycle_slider, knobs_from
from eagleviz.app import navigation as nav
from eagleviz.app.navigation import VIEW_SIZE
from eagleviz.app.session import Knobs, attention_choices, knobs_of
from eagleviz.trace import RunTrace
from eagleviz.visuals import summary_figure
from eagleviz.visuals.output_text import output_tokens
from eagleviz.visuals.phases import frames

LAYOUT_PARAMS = ("projector", "model", "room")   # read here (room: `room_joined`), not by `share`
PROJECTOR_CLASS = "ev-projector"
# Applied in the browser: Gradio has no server-side switch for the page's CSS classes. Gradio's figures follow
# their container's width on a window resize only; the zoom changes that width with no resize, so one is
# announced once the new layout is there (else the figures keep their old width and are cut on the right). The
# zoom moves everything: the box just ticked is kept where it was in the window (a closed accordion's box has
# no place, and nothing moves), not the page's scroll offset.
PROJECTOR_JS = f"""(on) => {{
  const box = document.getElementById('projector'), at = () => box ? box.getBoundingClientRect().top : 0;
  const before = at(), keep = () => {{ if (before) window.scrollBy(0, at() - before); }};
  document.body.classList.toggle('{PROJECTOR_CLASS}', !!on);
  keep();
  requestAnimationFrame(() => {{ window.dispatchEvent(new Event('resize')); requestAnimationFrame(keep); }});
  return [];
}}"""
# Dark: Gradio's own dark theme (its `dark` class on the body, as `?__theme=dark` sets it), and the figures with
# it: their white drawing inverted, hues turned back (accepted blue, rejected orange and the bonus star keep their
# colours; the probability scale's lightness flips, its colour bar with it). For a projector in a dim room.
DARK_JS = "(on) => { document.body.classList.toggle('dark', !!on); return []; }"
DARK_READ_JS = "() => document.body.classList.contains('dark')"
DARK_CSS = "body.dark .js-plotly-plot .main-svg {filter: invert(0.9) hue-rotate(180deg)}"
# The figures' toolbar shows while the pointer is over them, as an instructor's pointer usually is, and would
# print over their titles: a projected figure is looked at, not zoomed.
# Projected, a chip's label Plotly shrank to fit its chip under 9 px would be under 12 px on the wall: hidden
# (its hover still names it), as Plotly hides those under 8 px everywhere (`visuals.style.CHIP_TEXT`).
PROJECTOR_CSS = (f"body.{PROJECTOR_CLASS} .gradio-container {{zoom: 1.35}} "
                 f"body.{PROJECTOR_CLASS} .js-plotly-plot text.bartext[style*='font-size: 8'] {{display: none}} "
                 f"body.{PROJECTOR_CLASS} #output-text {{font-size: 20px}} "
                 f"body.{PROJECTOR_CLASS} .js-plotly-plot .modebar-container {{display: none}}")
RUN_SIZE = 8 + VIEW_SIZE

# The guided tour beside its pictures. Each stop talks about one view, in the order of the tour (draft, verify,
# accept, rewind): stepping brings that view into sight, and in slides mode it is the one view shown, at the
# page's full width, for projecting. The stop is read from the tour's own heading ("Tour 2 \u00b7 Verify ..."):
# the step itself lives in the server's gr.State, which the browser does not see.
TOUR_VIEWS = ("draft-tree", "attention-mask", "accepted-path", "kv-rewind")
SLIDES_CLASS = "ev-slides"
_TOUR_STOP = ("(text) => { const m = /Tour (\\d)/.exec(String(text || '')); "
              f"return {list(TOUR_VIEWS)}[m ? Number(m[1]) - 1 : 0]; }}")
# The open tour stays in view beside or below its picture, so a stop's words and the view they describe share the
# screen. On a wide window (not projecting: TOUR_BESIDE_PX and up) it is a column at the right, the page narrowed
# beside it: the views then go one per row, each whole on the screen. Elsewhere (a projector's zoom, a phone) it
# sticks to the window's bottom while the views above it are looked at, its text scrolling within a fifth of
# the window. The class is set in the browser (Gradio scopes a stylesheet's @media rules inside its container).
_OPEN_TOUR = "#tour-section:has(> .label-wrap.open)"
TOUR_BESIDE_CLASS = "ev-tour-beside"
TOUR_BESIDE_PX = 1000
TOUR_PANEL_PX = 340
TOUR_CSS = (".gradio-container {overflow: clip !important} "   # hidden would make it the panel's scroll box
            f"{_OPEN_TOUR} {{position: sticky; bottom: 0; z-index: 30; box-shadow: 0 -6px 16px rgba(0, 0, 0, 0.18)}} "
            f"{_OPEN_TOUR} #tour {{max-height: 22vh; overflow-y: auto}} "
            # a projector's larger text: the heading and two lines of words (they scroll), the view above them
            # (`_FIT_VIEW`)
            f"body.{PROJECTOR_CLASS} {_OPEN_TOUR} #tour {{max-height: 6em !important}} "
            "#tour-section #tour h3 {margin: 0 0 4px 0} #tour-section #tour {font-size: 14px} "
            f"body.{TOUR_BESIDE_CLASS} .gradio-container {{padding-right: {TOUR_PANEL_PX + 16}px !important}} "
            # !important: Gradio adds a copy of each rule scoped inside its container, which outranks body's class
            f"body.{TOUR_BESIDE_CLASS} {_OPEN_TOUR} {{position: fixed !important; top: 8px !important; "
            f"right: 8px !important; bottom: auto !important; width: {TOUR_PANEL_PX}px !important; "
            "max-height: calc(100vh - 16px) !important; overflow-y: auto !important; "
            "box-shadow: -6px 0 16px rgba(0, 0, 0, 0.18) !important} "
            f"body.{TOUR_BESIDE_CLASS} {_OPEN_TOUR} #tour {{max-height: none !important}} "
            # a phone: a smaller panel, so that a view's drawing fits above it
            f"@media (max-width: 640px) {{{_OPEN_TOUR} #tour {{max-height: 15vh}} "
            f"{_OPEN_TOUR} > .label-wrap {{padding-top: 4px; padding-bottom: 4px}} "
            f"{_OPEN_TOUR} #tour-prev, {_OPEN_TOUR} #tour-next {{min-width: 0 !important}}}}")
# Where the open tour goes (see TOUR_CSS); a closed one goes nowhere.
_PLACE_TOUR = (f"document.body.classList.toggle('{TOUR_BESIDE_CLASS}', "
               "!!document.querySelector('#tour-section > .label-wrap.open') && "
               f"window.innerWidth >= {TOUR_BESIDE_PX} && !document.body.classList.contains('{PROJECTOR_CLASS}'));")
# Projecting with the tour below the views (not beside them), a view taller than the window above the panel is
# drawn smaller (CSS zoom) so that it shows whole above the tour's words; every other view at its own size. Called
# with no view (the tour closed, projecting ended): every view at its own size.
_FIT_VIEW = f"""(view) => {{
  for (const id of {list(TOUR_VIEWS)}) {{
    const v = document.getElementById(id); if (v && v !== view) v.style.zoom = '';
  }}
  if (!view) return;
  view.style.zoom = '';
  const body = document.body, panel = document.getElementById('tour-section');
  const open = panel && panel.querySelector(':scope > .label-wrap.open');
  if (!open || !body.classList.contains('{PROJECTOR_CLASS}')) return;
  if (body.classList.contains('{TOUR_BESIDE_CLASS}')) return;
  const margin = parseFloat(getComputedStyle(view).scrollMarginTop) || 0;   // below a room's follow line
  const room = window.innerHeight - panel.getBoundingClientRect().height - margin - 8;
  const height = view.getBoundingClientRect().height;
  if (height > room && room > 0) view.style.zoom = String(Math.max(0.3, room / height));
}}"""
PLACE_TOUR_JS = ("() => { " + _PLACE_TOUR +
                 " requestAnimationFrame(() => { window.dispatchEvent(new Event('resize')); "
                 f"requestAnimationFrame(() => ({_FIT_VIEW})("
                 "document.getElementById(document.body.dataset.evSlide || ''))); }); return []; }")

# A view taller than the window above the panel stuck to its bottom (a phone's, a projector's): its bottom goes to
# the panel's top, as far as its drawing (Plotly's plot areas) stays whole in the window; its title and legend go
# above first.
_ABOVE_TOUR = f"""(view) => {{
  const panel = document.getElementById('tour-section');
  if (!view || !panel || document.body.classList.contains('{TOUR_BESIDE_CLASS}')) return;
  const top = panel.getBoundingClientRect().top, box = view.getBoundingClientRect();
  const drawn = [...view.querySelectorAll('.nsewdrag')].map(e => e.getBoundingClientRect().top - box.top);
  const by = Math.min(box.bottom - top, drawn.length ? Math.min(...drawn) : 0);
  if (top < window.innerHeight && by > 1) window.scrollBy(0, by);
}}"""
TOUR_CLOSED_JS = (f"() => {{ document.body.classList.remove('{TOUR_BESIDE_CLASS}'); ({_FIT_VIEW})(null); "
                  "requestAnimationFrame(() => window.dispatchEvent(new Event('resize'))); return []; }")
# After a step (`tour`: the tour's text): the view it talks about, in sight above the tour; in slides mode, the
# only one.
TOUR_VIEW_JS = f"""(tour) => {{
  const id = ({_TOUR_STOP})(tour), view = document.getElementById(id);
  delete document.body.evPlacing; delete document.body.dataset.evPlacing;   // the views' placing gives way
  document.body.dataset.evSlide = id;
  {_PLACE_TOUR}
  if (document.body.classList.contains('{SLIDES_CLASS}')) {{
    requestAnimationFrame(() => {{ window.dispatchEvent(new Event('resize'));
                                   requestAnimationFrame(() => {{ ({_FIT_VIEW})(view);
                                                                 if (view) view.scrollIntoView({{block: 'start'}}); }});
                                }});
  }} else if (view) {{   // its top at the window's top: the tour's panel is beside it or below it
    const place = () => {{ ({_FIT_VIEW})(view); view.scrollIntoView({{block: 'start'}}); ({_ABOVE_TOUR})(view); }};
    place();
    requestAnimationFrame(() => {{ window.dispatchEvent(new Event('resize')); requestAnimationFrame(place); }});
  }}
  return [];
}}"""
# A follower's tour moved with the instructor's: the figures come in the same update and are drawn after it, which
# moves what is below them; the stop's view is put in sight once they are drawn, and again once the page settles.
FOLLOW_TOUR_JS = f"""(tour) => {{
  const latest = () => document.querySelector('#follow-tour textarea')?.value || tour;   // a later stop's, if any
  for (const ms of [300, 1200]) setTimeout(() => ({TOUR_VIEW_JS})(latest()), ms);
  return []; }}"""
# Slides on or off: one view at a time (the tour's stop), drawn again to its new width.
SLIDES_JS = f"""(on) => {{
  document.body.classList.toggle('{SLIDES_CLASS}', !!on);
  const tour = document.getElementById('tour');
  ({TOUR_VIEW_JS})(tour ? tour.innerText : '');
  requestAnimationFrame(() => window.dispatchEvent(new Event('resize')));
  return [];
}}"""
SLIDES_CSS = " ".join(
    f"body.{SLIDES_CLASS}[data-ev-slide='{shown}'] :is({', '.join('#' + v for v in TOUR_VIEWS if v != shown)}) "
    "{display: none !important}" for shown in TOUR_VIEWS)
# Left and right arrows step the tour; with the tour closed, the first opens it at the stop it shows (its figures at
# that stop's phase). With Shift they step the cycle (the views' own back and forward buttons), and P plays the
# cycles: a projected page is driven from the keyboard. Not where the focus is where keys type or move something: a
# text box, a slider, a list, a radio group (a ticked checkbox, Slides among them, takes no arrows: they go on).
TOUR_KEYS_JS = """() => {
  document.addEventListener('keydown', (e) => {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    const t = e.target;
    const typing = t && (t.isContentEditable || ['TEXTAREA', 'SELECT'].includes(t.tagName) ||
                         (t.tagName === 'INPUT' && t.type !== 'checkbox'));
    const arrow = ['ArrowLeft', 'ArrowRight'].includes(e.key);
    if (typing || !(arrow || (e.key === 'p' && !e.shiftKey))) return;
    e.preventDefault();
    if (!arrow || e.shiftKey) {   // the cycle: back, forward, play
      document.getElementById(!arrow ? 'play' : e.key === 'ArrowRight' ? 'next' : 'prev')?.click();
      return;
    }
    const b = document.getElementById(e.key === 'ArrowRight' ? 'tour-next' : 'tour-prev');
    if (b && b.offsetParent !== null) b.click();
    else document.querySelector('#tour-section .label-wrap')?.click();
  });
  return [];
}"""


def notices_cleared(status: str | None) -> tuple:
    """After a preset, a recorded run or an import replaced the prompt or the run: no race result (it was about
    the run before) and no warning of a request refused before (a run's own status stays). Outputs: race result,
    status."""
    return "", "" if str(status or "").startswith("\u26a0") else gr.skip()


def gallery_choices() -> list[tuple[str, str]]:
    """(label, id) of the shipped recorded runs; empty when the gallery is missing (the page says so)."""
    try:
        return [(f"{e.title} \u00b7 {e.description}", e.id) for e in gallery.entries()]
    except gallery.GalleryError:
        return []


def _settings(prompt, preset: str | None, knobs: Knobs) -> tuple:
    """Values for prompt, preset, preset note and the knobs in their field order (`gr.skip()` leaves one as
    it is)."""
    note = presets.note(presets.by_name()[preset]) if preset in presets.by_name() else ""
    return (prompt, preset, note, *(getattr(knobs, f.name) for f in fields(Knobs)))


SETTINGS_SIZE = 3 + len(fields(Knobs))


def gallery_opened(h: Handlers, entry_id: str | None, at: share.Picture | None = None) -> tuple:
    """A recorded run, with the prompt and knobs it was made with (so that Run makes it live), at its opening
    cycle or at a link's picture `at`. Outputs: the run outputs (as `Handlers.finished`), then prompt, preset,
    preset note and the knobs."""
    return _recorded(h, entry_id, at)[0]


def _recorded(h: Handlers, entry_id: str | None, at: share.Picture | None) -> tuple[tuple, list[str]]:
    """`gallery_opened`'s outputs, and the notes on what of the picture `at` the run does not have."""
    skip = gr.skip()
    if not entry_id:
        return (skip,) * (RUN_SIZE + SETTINGS_SIZE), []
    try:
        run = gallery.load(entry_id)
        e = gallery.entry(entry_id)
    except UserFacingError as exc:
        return (skip, skip, f"\u26a0 {exc}", *[skip] * (RUN_SIZE - 3 + SETTINGS_SIZE)), []
    i, view, notes = nav.picture(run, at.cycle, at.phase, at.token) if at else (*nav.opening(run), [])
    out = list(h.finished(run, (i, view)))
    out[2] = (f"Recorded run **{e.title}** ({e.description}; recorded {e.recorded} on {e.cpu}). Replayed from "
              "assets/gallery: no model work. Press Run to make it live.")
    return (*out, *_settings(e.prompt, e.preset, e.knobs)), notes


def trace_imported(h: Handlers, path: str | None, attn_impl: str) -> tuple:
    """An uploaded trace, with the prompt and knobs it was made with (as a recorded run) and the preset they
    are, if any. Outputs: the run outputs (as `Handlers.imported`), then prompt, preset, preset note and the
    knobs."""
    out = h.imported(path)
    run = out[0]
    if not isinstance(run, RunTrace):
        return (*out, *[gr.skip()] * SETTINGS_SIZE)
    return (*out, *_run_settings(h, run, attn_impl))


def _run_settings(h: Handlers, run: RunTrace, attn_impl: str = "auto") -> tuple:
    """The prompt and knobs `run` was made with, and the preset they are, if any (`_settings`' outputs)."""
    knobs = knobs_of(run, Knobs(attn_impl=attn_impl), h.limits)
    found = presets.matching(run.prompt, knobs)
    return _settings(run.prompt, found.name if found else None, knobs)


SETTING_PARAMS = {"prompt", "preset", "gallery", *share.PICTURE_PARAMS, *(f.name for f in fields(Knobs))}


def preset_entry(name: str | None) -> str | None:
    """The recorded run of preset `name` in the gallery: the one made with the preset's own tree and temperature
    (a preset may have others, another tree's); None where the gallery has none."""
    preset = presets.by_name().get(name)
    if preset is None:
        return None
    try:
        own = [e for e in gallery.entries() if e.preset == name]
    except gallery.GalleryError:
        return None
    for e in own:
        k = e.knobs
        if (k.steps, k.topk, k.draft_tokens) == preset.tree and k.temperature == preset.temperature:
            return e.id
    return own[0].id if own else None


def arrival_entry() -> str | None:
    """The recorded run a page opens on when its link asks for no settings: the first preset's (the same picture
    for every visitor, no model work); None when the gallery has none."""
    return preset_entry(presets.PRESETS[0].name)


def preset_opened(h: Handlers, name: str | None) -> tuple:
    """A preset picked: its recorded run in the views at its opening cycle, the status line saying so (as on
    arrival), so the picture is never another preset's under the new one's settings (the settings themselves are
    `Handlers.preset_chosen`'s). Outputs: the run outputs, then the recorded run shown (None: the preset has none,
    the views keep what they show and the status line says that Run draws this preset's)."""
    entry = preset_entry(name)
    if entry is None:
        if name not in presets.by_name():
            return (gr.skip(),) * (RUN_SIZE + 1)
        line = "This preset has no recorded run: press **\u25b6 Run** to draw its picture."
        return gr.skip(), gr.skip(), line, *(gr.skip(),) * (RUN_SIZE - 3), None
    shown = _recorded(h, entry, None)[0][:RUN_SIZE]
    return (*shown[:2], arrival_line(entry), *shown[3:], entry)


def arrival_line(entry_id: str) -> str:
    """The status line of the page as it opens: where the picture is, what it is, and the invitation to Run."""
    return (f"\u25bc [The picture below](#cycle-view) is the preset's recorded run "
            f"({gallery.entry(entry_id).description.split(':')[0]}), replayed: no model work. Press **\u25b6 Run** "
            "to decode it live on this server.")


def invitation(entry_id: str | None, room: bool = False) -> str:
    """The line just above the views while they show recorded run `entry_id` (on arrival, from a gallery link or the
    gallery's list): what it is and the invitation to Run, whose button is a screen above. Empty for no entry and on
    a page that joined a room (it shows the instructor's run)."""
    if not entry_id or room:
        return ""
    try:
        e = gallery.entry(entry_id)
    except gallery.GalleryError:
        return ""
    return (f"\u25b2 Shown: the recorded run **{e.title}** ({e.description.split(':')[0]}), replayed with no model "
            "work. [Press \u25b6 Run](#run) above to decode it live, or change the prompt and knobs first.")


def open_link(h: Handlers, defaults: Knobs, request: gr.Request | None) -> tuple:
    """Outputs: the run outputs (a gallery entry named by the link, at the link's picture; with no prompt, preset,
    knob or gallery entry in the link, the first preset's recorded run, `arrival_entry`, unless the link joins a
    room), prompt, preset, preset note, the knobs, then model, projector, the link's notes and the gallery entry
    shown. A gallery entry named by the link brings its own prompt and knobs; the arrival's leaves the page's (the
    same preset's) as they are."""
    params = dict(request.query_params) if request is not None else {}
    shared = share.from_query(list(request.query_params.multi_items()) if request is not None else [], defaults,
                              h.limits, passthrough=LAYOUT_PARAMS)
    notes = list(shared.notes)
    knobs = shared.knobs
    if knobs.attn_impl not in attention_choices():   # Triton's kernel, on a server without a GPU
        notes.append(f"Link parameter attn_impl={knobs.attn_impl} needs a GPU, and this server runs on a CPU; "
                     f"attention {defaults.attn_impl} is used.")
        knobs = replace(knobs, attn_impl=defaults.attn_impl)
    extra = dict(shared.extra)
    model = gr.skip()
    if "model" in extra:
        try:
            model = h.pairs.pair(extra["model"]).name
        except UserFacingError:
            notes.append("The link names a model this server does not offer; the default model is used.")
    projector = extra.get("projector")
    if projector not in (None, "0", "1"):
        notes.append("Link parameter projector must be 0 or 1; the normal layout is used.")
    if shared.gallery:
        shown, missing = _recorded(h, shared.gallery, shared.picture)
        return shown + _tail(model, projector, notes + missing, shared.gallery)
    if not set(params) & SETTING_PARAMS:   # arrival, or a layout only: the first preset's recorded run
        # The page's settings are that preset's already: they are left as they are, never overwritten under a
        # visitor who has started typing. A room's page draws none: its picture is the instructor's, sent by the
        # page's stream (`room_followed`), and another drawn here could land after it.
        entry = None if "room" in params else arrival_entry()
        run = (gr.skip(),) * RUN_SIZE
        if entry is not None:
            shown = _recorded(h, entry, None)[0][:RUN_SIZE]
            run = (*shown[:2], arrival_line(entry), *shown[3:])
        return run + (gr.skip(),) * SETTINGS_SIZE + _tail(model, projector, notes, entry or gr.skip())
    tail = _tail(model, projector, notes, gr.skip())
    run = (gr.skip(),) * RUN_SIZE
    settings = list(_settings(gr.skip() if shared.prompt is None else shared.prompt, shared.preset, knobs))
    return run + tuple(settings) + tail


def _tail(model, projector: str | None, notes: list[str], entry) -> tuple:
    """open_link's last outputs: model, projector, the link's notes, the recorded run shown."""
    return model, projector == "1", "\n\n".join(f"\u26a0 {n}" for n in notes), entry


def link_for(prompt: str, preset: str | None, model: str | None, *values) -> str:
    """A Markdown link to this page with the prompt and knobs in its query (relative: it works on any host)."""
    try:
        knobs = knobs_from(*values)
    except UserFacingError as exc:
        return f"\u26a0 No link: {exc}"
    query = share.to_query(prompt or "", knobs, preset or None)
    if model:
        query += "&model=" + quote(model, safe="")
    return (f"[Link to this prompt and these knobs]({query}) (copy it: opening it restores the prompt and the "
            "knobs; add `&projector=1` for large text)")


def picture_link(entry: str | None, run: RunTrace | None, index: float, frame: float | None,
                 slot: int | None) -> str:
    """A Markdown link to the picture shown (cycle, phase, picked token) when it is recorded run `entry`'s:
    everyone who opens it sees that picture, with no model work. A live run cannot be linked to (it would have
    to be made again); the text says so. Empty when no run is shown."""
    if run is None or not run.cycles:
        return ""
    if not entry:
        return ("A live run's picture cannot be linked to (it would be made again); a **recorded run**'s can: "
                "open one above, pick the cycle, phase and token, and press this button again.\n\n")
    i = max(0, min(int(index or 0), len(run.cycles) - 1))
    cycle = run.cycles[i]
    phase, token = nav.phase_name(cycle, frame), nav.token_item(cycle, slot)
    shown = [f"cycle {i}", "the end state" if phase is None else f"phase {phase}"]
    shown += [] if token is None else [f"token {token} picked"]
    return (f"[Link to this picture]({share.picture_query(entry, i, phase, token)}) of the recorded run: "
            f"{', '.join(shown)}. Everyone who opens it sees this picture, with no model work.\n\n")


# ---------------------------------------------------------------- a room that follows the instructor, live


def room_opened(rooms: Rooms, run: RunTrace | None, cycle: float, frame: float | None, slot: int | None,
                address: str = "") -> tuple:
    """The instructor opens a room: its code, the line that gives it to the class (the link written out in full at
    the page's `address`, `page_address`, where it is known), and the claim this browser keeps (`ROOM_KEPT_JS`: the
    code and its key) to take the room back after a reload. Outputs: the room's code (the instructor's page's
    state), the line, the claim."""
    code = rooms.open()
    rooms.show(code, run, cycle, frame, slot)
    return code, _room_line(code, address=address), f"{code}:{rooms.host_key(code)}"


def page_address(request: gr.Request | None) -> str:
    """The address of the page that sent `request` (its Referer, without query or fragment), to write a room's link
    out in full for a projector; "" where the browser did not say."""
    referer = str(request.headers.get("referer", "")) if request is not None and request.headers else ""
    address = referer.split("#")[0].split("?")[0]
    return address if address.startswith(("http://", "https://")) else ""


def _room_line(code: str, again: bool = False, address: str = "") -> str:
    said = " taken back after a reload: the class follows this page again." if again else ""
    link = (f"[{address}?room={code}](?room={code})" if address else
            f"[this link](?room={code}) (or add `?room={code}` to the page's address)")
    target = f"{address}?room={code}"
    scan = (f"\n\n![A QR code of the room's link: scan it to join room {code}]({qr.data_uri(target)})"
            if address and qr.fits(target) else "")   # (no code for a link without the page's address)
    return (f"Room **{code}**{said}\n\nStudents open {link} and follow this page's run, cycle, phase and picked "
            "token, recorded or live. It ends two hours after this page last moves; reloaded in this browser, this "
            f"page takes it back.{scan}")


def room_reclaimed(h: Handlers, rooms: Rooms, claim: str | None, address: str = "") -> tuple:
    """On load, the claim this browser kept (`room_opened`): the room taken back by the page that opened it (after a
    reload, a closed tab), its picture (the run, cycle, phase and token the class sees) shown here again. A claim
    whose room has ended is dropped. Outputs: the room's code, the room's line, the claim kept, the recorded run
    and the line above the views (the arrival's, replaced: none), the run outputs, then the prompt, preset, preset
    note and knobs the run was made with."""
    code, _, key = str(claim or "").partition(":")
    code, skip = code.strip().upper(), (gr.skip(),) * (RUN_SIZE + 2 + SETTINGS_SIZE)
    room = rooms.reclaim(code, key) if code and key else None
    if room is None:
        return gr.skip(), gr.skip(), "", *skip
    run = room.run
    if run is None or not run.cycles:
        return code, _room_line(code, True, address), claim, *skip
    i = max(0, min(room.cycle, len(run.cycles) - 1))
    shown = list(h.finished(run, (i, tuple(nav.view_at(run, i, room.frame, room.slot)))))
    shown[2] = f"Room **{code}** taken back after a reload: the class follows this page again, from this picture."
    return code, _room_line(code, True, address), claim, None, "", *shown, *_run_settings(h, run)


# The room this browser opened, kept across reloads (`room_reclaimed`); a page that joined a room keeps none.
ROOM_READ_JS = """() => new URLSearchParams(location.search).has('room') ? '' :
  (localStorage.getItem('eagleviz-room') || '')"""
ROOM_KEPT_JS = """(claim) => { if (claim) localStorage.setItem('eagleviz-room', claim);
  else localStorage.removeItem('eagleviz-room'); return []; }"""


def room_shown(rooms: Rooms, code: str | None, run: RunTrace | None, cycle: float, frame: float | None,
               slot: int | None):
    """The instructor's page moved (a cycle, a phase, a token, a run): the room's next picture. Output: the room's
    line, said again only when the room has ended."""
    if not code or rooms.show(code, run, cycle, frame, slot):
        return gr.skip()
    return "\u26a0 This room has ended (no move for two hours); open a new one."


def moved(rooms: Rooms, code: str | None, run: RunTrace | None, cycle: float, frame: float | None, slot: int | None,
          stop: int) -> tuple:
    """The page's picture moved (a step, Play, a phase, a token, the tour, a run, an import): the room's next picture
    (`room_shown`, where the page opened one) and the tour's words for the cycle now shown (`nav.tour_shown`, at stop
    `stop`), one request for both. Outputs: room line, tour text."""
    return room_shown(rooms, code, run, cycle, frame, slot), nav.tour_shown(run, cycle, stop)


def room_told(rooms: Rooms, code: str | None, run: RunTrace | None, index: float, frame: float | None,
              slot: int | None) -> None:
    """The picture the instructor's page is about to show (cycle `index`, phase `frame`, None: the cycle's end state,
    its last frame, as the page's phase slider then reads), told to its room by the server as it answers the move:
    the followers need not wait for the instructor's browser to draw it before its `.change` events tell the room
    (about a second on a busy 2-core machine). Those events then find the same picture: no second version."""
    if code and run is not None and run.cycles:
        i = max(0, min(int(index or 0), len(run.cycles) - 1))
        rooms.show(code, run, i, len(frames(run.cycles[i])) - 1 if frame is None else frame, slot)


def run_streamed(rooms: Rooms, code: str | None, out: tuple) -> None:
    """A part of a run's output as the page is sent it (`Handlers.run`'s: run state, output, status, slider, ...),
    told to the room the page opened: its followers watch the run grow, at the cycle the slider is set to where this
    part sets it, else at the room's. A part before the first cycle, or without the run, tells nothing."""
    run, slider = out[0], out[3]
    if not code or not isinstance(run, RunTrace) or not run.cycles:
        return
    room = rooms.seen(code)
    if room is None:
        return
    args = getattr(slider, "constructor_args", None) or {}
    room_told(rooms, code, run, args["value"] if "value" in args else room.cycle, None, None)


def room_stepped(rooms: Rooms, code: str | None, run: RunTrace | None, index: float, delta: int) -> tuple:
    """The instructor's step between cycles (`nav.step`), told to the room (`room_told`), at the cycle's end state.
    Outputs: nav.step's (slider, summary plot, *view)."""
    room_told(rooms, code, run, int(index or 0) + delta, None, None)
    return nav.step(run, index, delta)


def room_slid(rooms: Rooms, code: str | None, run: RunTrace | None, index: float) -> tuple:
    """The instructor's cycle slider moved by hand (`nav.show`), told to the room at the cycle's end state.
    Outputs: nav.show's (summary plot, *view)."""
    room_told(rooms, code, run, index, None, None)
    return nav.show(run, index)


def room_phased(rooms: Rooms, code: str | None, run: RunTrace | None, index: float, frame: float,
                slot: int | None) -> tuple:
    """The instructor's phase slider released on a frame (`nav.phase_chosen`), told to the room.
    Outputs: *figures."""
    room_told(rooms, code, run, index, frame, slot)
    return nav.phase_chosen(run, index, frame, slot)


def room_picked(rooms: Rooms, code: str | None, run: RunTrace | None, index: float, frame: float,
                evt: gr.SelectData) -> tuple:
    """The instructor picks a token of the cycle (`nav.token_selected`), told to the room once it is known which
    slot that is. Outputs: focus, *figures."""
    out = nav.token_selected(run, index, frame, evt)
    if out[0] != gr.skip():
        room_told(rooms, code, run, index, frame, out[0])
    return out


def room_joined(request: gr.Request | None) -> tuple:
    """On page load: the room a link names (`?room=CODE`), joined, with following on (the page's stream,
    `room_followed`, starts as the joined room's code is set). Outputs: the room joined, the follow row."""
    code = (dict(request.query_params).get("room", "") if request is not None else "").strip().upper()
    if not code:
        return None, gr.Row(visible=False)
    return code, gr.Row(visible=True)


FOLLOW_SIZE = 4 + VIEW_SIZE + 4 + 1
SUMMARY_AT = 3  # in a follower's picture (run state, output, slider, summary plot, *view, ...): the summary plot
TOUR_SIZE = 4   # a follower's tour: its stop, its words, its section (opened), the words again for the scroll


def room_toured(rooms: Rooms, code: str | None, stop: int | None, run: RunTrace | None = None) -> None:
    """The instructor's tour at stop `stop` (None: closed), told to the room (a page that opened none tells
    nothing); a tour over no run's cycles is none."""
    if code:
        rooms.toured(code, stop if run is not None and run.cycles else None)


def toured(run: RunTrace, index: int, stop: int | None) -> tuple:
    """A follower's tour at the instructor's stop `stop` on cycle `index`: its stop, its words, the section opened,
    and the words for the scroll to the stop's view (`FOLLOW_TOUR_JS`); nothing where the instructor's is closed
    (a follower's own tour is left as it is)."""
    if stop is None:
        return (gr.skip(),) * TOUR_SIZE
    words = nav.tour_text(run, index, stop)
    return stop, words, gr.Accordion(open=True), words


def not_followed(components: Sequence[gr.components.Component] | None = None) -> tuple:
    """What a page that joined no open room shows (`room_followed`'s outputs but the line): the arrival's recorded
    run at its opening cycle, or nothing new where the gallery has none."""
    entry = arrival_entry()
    if entry is None:
        return (gr.skip(),) * (FOLLOW_SIZE - 1)
    run = gallery.load(entry)
    i, view = nav.opening(run)
    return (run, *sent_once((output_tokens(run), cycle_slider(run, i), summary_figure(run, i), *view,
                             *(gr.skip(),) * TOUR_SIZE), components))


async def room_followed(rooms: Rooms, code: str | None, follow: bool, page: str,
                        components: Sequence[gr.components.Component] | None = None) -> AsyncIterator[tuple]:
    """A follower page's stream of the room's pictures (`page`: its session), pushed by the server the moment the
    instructor's page moves (`Rooms.followed`): no poll, no wait for one. Each picture is drawn once per move for
    every follower, made as Gradio sends it for `components` (the output, slider, summary plot and view outputs:
    `sent_once`). It ends when the page unticks "follow" (this same event, `follow` off: the page's stream is
    told to end), when the room ends (the page is told so), or when the page has gone (Gradio drops a stream whose
    reader left at its next update: the room's picture again, unchanged, every `rooms.ALIVE_S`). Outputs: run
    state, output, slider, summary plot, *view, the tour (`toured`), the follow line."""
    skip = gr.skip()
    if not follow:
        rooms.unfollow(code, page)
        yield (skip,) * FOLLOW_SIZE
        return
    def draw(shown) -> tuple:   # by the first follower of this version; the others reuse it
        run, i = shown.run, max(0, min(shown.cycle, len(shown.run.cycles) - 1))
        return sent_once((output_tokens(run), cycle_slider(run, i), summary_figure(run, i),
                          *nav.view_at(run, i, shown.frame, shown.slot), *toured(run, i, shown.tour)), components)

    met, sent = False, None   # whether this stream has met its room open; the version of the picture it sent
    last = None               # ... and its values
    async with aclosing(rooms.followed(code, page)) as pushed:   # closed with this stream: the room forgets it
        async for room in pushed:
            if room is None:   # ended: the last picture stays; never there: not left empty, a recorded run shown
                if met:
                    yield (*[skip] * (FOLLOW_SIZE - 1), f"\u26a0 Room {str(code)[:8]} has ended: this page no "
                           "longer follows; the instructor's last picture stays.")
                else:
                    yield (*not_followed(components), f"\u26a0 Room {str(code)[:8]} is not open (ended, or "
                           "mistyped): this page does not follow. Below, a recorded run; ask for the room's code again.")
                return
            met, line = True, following_line(code, rooms.away_s(room))
            if rooms.is_away(code, page):   # the page moved its own picture: where the room is, in words
                yield (*[skip] * (FOLLOW_SIZE - 1), stepped_away_line(code, room))
                continue
            if room.run is None or not room.run.cycles or room.version == sent:   # its line alone: no new picture
                yield (*[skip] * (FOLLOW_SIZE - 1), line)
                continue
            shown = await rooms.drawn(room, draw)
            sent, values = shown.version, (shown.run, *shown.drawn)
            yield (*unchanged_skipped(values, last), line)
            last = values


def unchanged_skipped(values: tuple, last: tuple | None) -> tuple:
    """A follower's next picture without what it shows already (`gr.skip()`): a phase or a token picked within a
    cycle leaves the output, the slider and the summary plot as they were, and each figure sent is redrawn whole by
    the follower's browser. Another cycle of the same run leaves the summary plot too: the page outlines the cycle's
    bar itself (`ui.SUMMARY_OUTLINE_JS`). `values`, `last`: the run, then the picture (`SUMMARY_AT`: the summary
    plot); `last` what this page was sent last (None: nothing yet)."""
    if last is None:
        return values
    kept = tuple(gr.skip() if _same(v, w) else _value_only(v, w) for v, w in zip(values, last, strict=True))
    if values[0] is last[0]:
        kept = kept[:SUMMARY_AT] + (gr.skip(),) + kept[SUMMARY_AT + 1:]
    return kept


def _value_only(value, before):
    """`value` as it goes to a follower who was sent `before` (and shows something else: `_same`): a component update
    that moves only its value (the cycle slider within a run, the phase slider between cycles of as many phases) as
    that value alone, which the page applies as the update would; anything else as it is. A component update costs
    Gradio a component made and its configuration written, per page (~0.6 ms, a tenth of the server's time for a
    push between cycles: `python scripts/follower_costs.py push`, docs/performance.md entry 71)."""
    if not (isinstance(value, gr.blocks.Block) and type(before) is type(value)):
        return value
    args, was = dict(value.constructor_args), dict(before.constructor_args)
    if "value" not in args:
        return value
    moved = args.pop("value")
    was.pop("value", None)
    return moved if args == was else value


def _same(value, before) -> bool:
    """Whether a follower shows `value` already: the same object or an equal value; a component sent as an update,
    made with the same arguments."""
    if value is before:
        return True
    if type(value) is not type(before):
        return False
    if isinstance(value, gr.blocks.Block):
        value, before = getattr(value, "constructor_args", value), getattr(before, "constructor_args", before)
    try:
        return bool(value == before)
    except (TypeError, ValueError):  # a value without a plain equality: sent again
        return False


def following_line(code: str | None, away_s: float) -> str:
    """A follower's line: the room it follows, and whether the instructor's page is away (`Rooms.away_s`)."""
    if away_s:
        quiet = f"{away_s / 60:.0f} min" if away_s >= 120 else f"{away_s:.0f} s"
        return (f"\u26a0 Room **{str(code)[:8]}**: the instructor's page has not been heard for {quiet} (closed, or "
                "its computer asleep). This page keeps its last picture and follows again when it is back.")
    return (f"Following room **{str(code)[:8]}**: this page shows the instructor's picture. Untick to explore on "
            "your own.")


def stepped_away_line(code: str | None, room) -> str:
    """A follower's line once it moved its own picture: where the instructor is now, and how to rejoin."""
    where = f"on cycle {room.cycle}" if room.run is not None and room.run.cycles else "not showing a run yet"
    return (f"You stepped away from room **{str(code)[:8]}**: the instructor is {where}. Tick **Follow the "
            "instructor** to rejoin.")


def stepped_away(rooms: Rooms, code: str | None, following: bool, page: str):
    """A page that follows a room moved its own picture (a step, the slider, a token, a phase, play): it stops
    following, its follow line saying where the instructor is (`Rooms.step_away`). Output: the follow switch,
    unticked (ticking it again rejoins: a new stream, the room's picture at once); nothing for a page that
    follows no room."""
    if code and following and rooms.step_away(code, page):
        return False
    return gr.skip()


def room_heard(rooms: Rooms, code: str | None, said: str | None) -> tuple:
    """The instructor's open page beats (`Rooms.here`, every `rooms.HERE_EVERY_S` while it has a room): its followers
    know it is there, and it hears how many pages follow. Outputs: the class line (skipped when unchanged), the beat
    (stopped once the room has ended)."""
    if not code:
        return gr.skip(), gr.Timer(active=False)
    n = rooms.here(code)
    if n is None:
        return "\u26a0 This room has ended; open a new one.", gr.Timer(active=False)
    line = f"**{n}** page{'s' if n != 1 else ''} follow{'s' if n == 1 else ''} room **{code}** now."
    return (gr.skip() if line == (said or "").strip() else line), gr.skip()
