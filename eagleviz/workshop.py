"""Workshop mode on the page: a link that reproduces a run, recorded runs that replay with no model work,
and the projector layout.

    open_link      on page load: the link's prompt, knobs, preset, model, layout and gallery entry, validated
                   (`eagleviz.share`); a bad parameter gives its default and a visible note, never an error page
    gallery_opened a recorded run from assets/gallery (`eagleviz.gallery`), shown like an imported trace
    link_for       the relative link ("?prompt=...") to the page's current prompt and knobs
"""

from __future__ import annotations

from urllib.parse import quote

import gradio as gr

from eagleviz import gallery, presets, share
from eagleviz.errors import UserFacingError
from eagleviz.handlers import Handlers, knobs_from
from eagleviz.navigation import VIEW_SIZE
from eagleviz.session import Knobs

LAYOUT_PARAMS = ("projector", "model")
PROJECTOR_CLASS = "ev-projector"
# Applied in the browser: Gradio has no server-side switch for the page's CSS classes.
PROJECTOR_JS = f"(on) => {{ document.body.classList.toggle('{PROJECTOR_CLASS}', !!on); return []; }}"
PROJECTOR_CSS = (f"body.{PROJECTOR_CLASS} .gradio-container {{zoom: 1.35}} "
                 f"body.{PROJECTOR_CLASS} #output-text {{font-size: 20px}}")
RUN_SIZE = 8 + VIEW_SIZE


def gallery_choices() -> list[tuple[str, str]]:
    """(label, id) of the shipped recorded runs; empty when the gallery is missing (the page says so)."""
    try:
        return [(f"{e.title} \u00b7 {e.description}", e.id) for e in gallery.entries()]
    except gallery.GalleryError:
        return []


def gallery_opened(h: Handlers, entry_id: str | None) -> tuple:
    """Outputs: the run outputs (as `Handlers.finished`)."""
    if not entry_id:
        return (gr.skip(),) * RUN_SIZE
    try:
        run = gallery.load(entry_id)
        e = gallery.entry(entry_id)
    except UserFacingError as exc:
        return (gr.skip(), gr.skip(), f"\u26a0 {exc}", *[gr.skip()] * (RUN_SIZE - 3))
    out = list(h.finished(run))
    out[2] = (f"Recorded run **{e.title}** ({e.description}; recorded {e.recorded} on {e.cpu}). Replayed from "
              "assets/gallery: no model work. Press Run to make it live.")
    return tuple(out)


def open_link(h: Handlers, defaults: Knobs, request: gr.Request | None) -> tuple:
    """Outputs: prompt, preset, preset note, the eight knobs, model, projector, link note, then the run outputs
    (a gallery entry named by the link, else all skipped)."""
    params = dict(request.query_params) if request is not None else {}
    shared = share.from_query(list(request.query_params.multi_items()) if request is not None else [], defaults,
                              h.limits, passthrough=LAYOUT_PARAMS)
    notes = list(shared.notes)
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
    k = shared.knobs
    preset = shared.preset if shared.preset else (gr.skip() if not params else None)
    note = presets.note(presets.by_name()[shared.preset]) if shared.preset else ("" if params else gr.skip())
    head = (shared.prompt if shared.prompt is not None else gr.skip(), preset, note,
            k.steps, k.topk, k.draft_tokens, k.temperature, k.top_p, k.max_new_tokens, k.seed, k.attn_impl,
            model, projector == "1", "\n\n".join(f"\u26a0 {n}" for n in notes))
    run = gallery_opened(h, shared.gallery) if shared.gallery else (gr.skip(),) * RUN_SIZE
    return head + run


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
