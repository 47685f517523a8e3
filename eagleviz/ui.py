"""The Gradio app: layout first, events second. Handlers are thin; the work lives in `session` (engine side)
and `visuals` (trace -> figures). Per-user data (the recorded run, the tour step, autoplay) lives in
gr.State; the model is loaded once and shared read-only by every tab through an `EngineHub`.

A shared server (a public Space, a workshop) is protected by `Limits` (eagleviz.limits, read from EAGLEVIZ_*
variables): they are stated on the page, enforced in the handlers (the API bypasses the page's sliders), and
set the queue: `limits.concurrency` model runs at a time, `limits.queue_size` waiting, beyond which Gradio
refuses a request with its "Queue is full" message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import gradio as gr

from eagleviz import presets
from eagleviz import race as race_mod
from eagleviz.engine import Engine
from eagleviz.errors import UserFacingError
from eagleviz.limits import Limits
from eagleviz.measured import latest_bench, latest_verify_cost
from eagleviz.session import (RANDOM_HEAD_NOTE, EngineHub, Knobs, default_knobs, generate, race_run, read_trace,
                              stream_run, write_trace)
from eagleviz.trace import RunTrace
from eagleviz.visuals import CycleView, SpeedView, cycle_view, empty_view, speed_view, summary_figure
from eagleviz.visuals.explain import TOUR, summary_text, tour_step
from eagleviz.visuals.output_text import output_html
from kernels.tree_attention import IMPLS

INTRO = ("# eagleviz: EAGLE speculative decoding, cycle by cycle\n"
         "A small **draft** head guesses a *tree* of next tokens; the big **target** model checks the whole tree "
         "in one forward, keeps the longest agreeing path, adds one **bonus** token of its own, and rewinds its "
         "KV cache. Every figure below is drawn from the recorded run, nothing is simulated.")
STREAM_EVERY_S = 0.3      # minimum time between two streamed text updates
AUTOPLAY_EVERY_S = 1.5
CSS = ("#output-text {min-height: 6em} .ev-explain {font-size: 15px} .ev-limits {font-size: 12px; opacity: 0.8} "
       ".ev-bench th, .ev-bench td {white-space: nowrap; padding: 4px 12px}")
VIEW_CONCURRENCY = 4      # light events (stepping, knobs, import) of different users served side by side
CACHE_TTL_S = 3600        # Gradio deletes its cached files (uploads, downloads) after this long
KNOB_DEFAULTS = Knobs(max_new_tokens=48)


def measured_speed() -> SpeedView:
    """The measured-speed section: the latest bench at T = 0 and T = 1 and the verification cost curve, this
    machine's where measured, else the shipped ones. Read once when the page is built; no model is needed."""
    return speed_view([latest_bench(0), latest_bench(1)], latest_verify_cost())


def _number(name: str, value, kind: type):
    """One knob from the page or the API: an int stays exact; a float or numeric string is converted, an
    integral float to int; anything else is refused with the knob's name."""
    if isinstance(value, int) and not isinstance(value, bool):
        return kind(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserFacingError(f"{name} must be a number, got {str(value)[:40]!r}") from None
    return int(number) if kind is int and number.is_integer() else number


def _knobs(steps, topk, draft_tokens, temperature, top_p, max_new_tokens, seed, attn_impl="auto") -> Knobs:
    return Knobs(_number("steps", steps, int), _number("topk", topk, int),
                 _number("draft_tokens", draft_tokens, int), _number("temperature", temperature, float),
                 _number("top_p", top_p, float), _number("max_new_tokens", max_new_tokens, int),
                 _number("seed", 0 if seed is None else seed, int), str(attn_impl))


def _view_values(view: CycleView) -> tuple:
    return (view.caption, view.tree, view.tree_text, view.mask, view.mask_text, view.path, view.path_text, view.kv,
            view.kv_text, view.replay, view.replay_text)


VIEW_SIZE = len(_view_values(empty_view()))


def _slider(run: RunTrace | None, value: int = 0):
    n = len(run.cycles) if run is not None else 0
    return gr.Slider(minimum=0, maximum=max(n - 1, 1), value=min(value, max(n - 1, 0)), step=1,
                     label=f"cycle (0 .. {max(n - 1, 0)})", interactive=n > 1)


@dataclass
class StopRequest:
    """Per-tab flags shared by the Run and Stop events: gr.State hands both events the same object, so the
    running generator sees the request between two cycles and finishes cleanly (summary and export included)."""

    requested: bool = False
    running: bool = False


class Handlers:
    """Event handlers. Each returns values in the order of the outputs it is wired to in `build_app`."""

    def __init__(self, hub: EngineHub, limits: Limits | None = None):
        self.hub, self.limits = hub, limits or Limits()

    # ---------------------------------------------------------------- knobs and presets
    def knobs_changed(self, *values) -> tuple[str, str]:
        try:
            knobs = _knobs(*values)
        except UserFacingError as exc:
            return f"**Invalid:** {exc}", f"# invalid knobs: {exc}"
        return knobs.validity(), knobs.flags(self.hub)

    @staticmethod
    def preset_chosen(name: str | None) -> tuple:
        """The preset's prompt, its note and its temperature."""
        preset = presets.by_name().get(name)
        if preset is None:
            return gr.skip(), "", gr.skip()
        return preset.prompt, presets.note(preset), preset.temperature

    # ---------------------------------------------------------------- run, stop, finish
    def run(self, stop: StopRequest, prompt: str, *values) -> Iterator[tuple]:
        """Outputs: run_state, output, status, slider, summary, summary plot, export, tour, *view."""
        skip = gr.skip()
        last, run, stream = 0.0, None, None
        stop.requested, stop.running = False, True
        try:
            stream = stream_run(self.hub, _prompt(prompt), _knobs(*values), self.limits)
            for run, cycle in stream:
                if cycle is None:
                    # The figures are left as they are until cycle 0 replaces them: one browser render less.
                    yield (run, output_html(None), "Running\u2026 (prefill)", _slider(None), "", skip, skip, skip,
                           "Waiting for the first cycle\u2026", *[skip] * (VIEW_SIZE - 1))
                elif cycle.index == 0:
                    yield (run, output_html(run), self._progress(run), _slider(run), skip, skip, skip, skip,
                           *_view_values(cycle_view(run, 0)))
                    last = time.perf_counter()
                elif time.perf_counter() - last >= STREAM_EVERY_S:
                    yield (run, output_html(run), self._progress(run), _slider(run), *[skip] * (4 + VIEW_SIZE))
                    last = time.perf_counter()
                if stop.requested:
                    run.stop_reason = "stopped by the user"
                    break
        except (UserFacingError, MemoryError) as exc:
            yield (skip, skip, f"\u26a0 {_message(exc)}", *[skip] * (5 + VIEW_SIZE))
            return
        finally:
            if stream is not None:
                stream.close()
            stop.running = False
        yield self.finished(run)

    @staticmethod
    def request_stop(stop: StopRequest):
        """The Stop button: the running generator finishes after the cycle in progress."""
        if not stop.running:
            return gr.skip()
        stop.requested = True
        return "Stopping after the current cycle\u2026"

    @staticmethod
    def _progress(run: RunTrace) -> str:
        cap = run.config["sampling"]["max_new_tokens"]
        return f"Running\u2026 cycle {len(run.cycles)}, {len(run.output)} of at most {cap} tokens"

    def finished(self, run: RunTrace | None) -> tuple:
        """The end of a run (or of an import, or a Stop): summary, export file, full slider, first cycle."""
        if run is None:
            return (None, output_html(None), "", _slider(None), "", summary_figure_or_blank(None), None,
                    "", *_view_values(empty_view()))
        note = f" {RANDOM_HEAD_NOTE}" if run.head.startswith("random") else ""
        status = f"Done: {run.stop_reason or 'stopped'}.{note}"
        tour = tour_step(run, run.cycles[0], 0) if run.cycles else ""
        return (run, output_html(run), status, _slider(run), summary_text(run), summary_figure_or_blank(run, 0),
                write_trace(run), tour, *_view_values(cycle_view(run, 0)))

    # ---------------------------------------------------------------- stepping through cycles
    @staticmethod
    def show(run: RunTrace | None, index: float) -> tuple:
        """Outputs: summary plot, *view."""
        i = int(index or 0)
        return (summary_figure_or_blank(run, i), *_view_values(cycle_view(run, i)))

    @staticmethod
    def step(run: RunTrace | None, index: float, delta: int) -> tuple:
        """Outputs: slider, summary plot, *view."""
        n = len(run.cycles) if run is not None else 0
        i = max(0, min(int(index or 0) + delta, n - 1)) if n else 0
        return (gr.Slider(value=i), *Handlers.show(run, i))

    @staticmethod
    def play(run: RunTrace | None, playing: bool) -> tuple:
        """Outputs: playing, timer, play button."""
        playing = bool(run is not None and len(run.cycles) > 1 and not playing)
        return playing, gr.Timer(active=playing), gr.Button("\u23f8 Pause" if playing else "\u25b6 Play")

    @staticmethod
    def tick(run: RunTrace | None, index: float) -> tuple:
        """Outputs: slider, summary plot, *view, playing, timer, play button. Stops at the last cycle."""
        n = len(run.cycles) if run is not None else 0
        i = int(index or 0) + 1
        if i >= n:
            return (gr.skip(), gr.skip(), *[gr.skip()] * VIEW_SIZE, False, gr.Timer(active=False),
                    gr.Button("\u25b6 Play"))
        return (*Handlers.step(run, i, 0), True, gr.skip(), gr.skip())

    @staticmethod
    def tour(run: RunTrace | None, index: float, step: int, delta: int) -> tuple[int, str]:
        if run is None or not run.cycles:
            return step, "Run a prompt first: the tour walks through one recorded cycle."
        step = (step + delta) % len(TOUR)
        return step, tour_step(run, run.cycles[min(int(index or 0), len(run.cycles) - 1)], step)

    # ---------------------------------------------------------------- race, import, API
    def race(self, run: RunTrace | None, attn_impl: str) -> str:
        if run is None:
            return "Run a prompt first; the race decodes the same prompt without speculation."
        try:
            return race_mod.describe(race_run(self.hub, run, attn_impl, self.limits))
        except UserFacingError as exc:
            return f"\u26a0 {exc}"

    def imported(self, path: str | None) -> tuple:
        if not path:
            return (gr.skip(),) * (8 + VIEW_SIZE)
        try:
            run = read_trace(path, self.limits)
        except UserFacingError as exc:
            gr.Warning(str(exc))
            return (gr.skip(), gr.skip(), f"\u26a0 {exc}", *[gr.skip()] * (5 + VIEW_SIZE))
        out = list(self.finished(run))
        out[2] = f"Imported a recorded run of {len(run.cycles)} cycles (no computation)."
        return tuple(out)

    def api_generate(self, prompt: str, steps: int = 5, topk: int = 4, draft_tokens: int = 16,
                     temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0) -> dict:
        """Run EAGLE speculative decoding and return the full trace (every cycle's tree, mask, checks, KV moves).
        The server's limits apply as on the page; a run over the time limit returns its partial trace with
        `stop_reason` saying so."""
        try:
            knobs = _knobs(steps, topk, draft_tokens, temperature, top_p, max_new_tokens, seed)
            return generate(self.hub, _prompt(prompt), knobs, self.limits).to_dict()
        except (UserFacingError, MemoryError) as exc:
            raise gr.Error(_message(exc)) from exc


def _prompt(prompt) -> str:
    if prompt is None:
        return ""
    if not isinstance(prompt, str):
        raise UserFacingError(f"the prompt must be text, got {type(prompt).__name__}")
    return prompt


def _message(exc: Exception) -> str:
    if isinstance(exc, MemoryError):
        return "the server ran out of memory for this request: lower max new tokens or shorten the prompt"
    return str(exc)


def summary_figure_or_blank(run: RunTrace | None, selected: int | None = None):
    return summary_figure(run, selected) if run is not None else None


def build_app(engine: Engine | Callable[[], Engine] | EngineHub, model_id: str = "", head_path: str | None = None,
              note: str = "", gpu: Callable[[Callable], Callable] = lambda fn: fn,
              limits: Limits | None = None) -> gr.Blocks:
    """The app, with its queue configured. `engine` is an Engine, a factory called once on first use, or a
    ready EngineHub. `gpu` wraps the handlers that run the model (on ZeroGPU Spaces: `spaces.GPU`, which
    borrows a GPU per call). `limits` defaults to the EAGLEVIZ_* environment (Limits.from_env)."""
    limits = limits or Limits.from_env()
    hub = engine if isinstance(engine, EngineHub) else EngineHub(engine, model_id, head_path)
    h = Handlers(hub, limits)
    run_fn, race_fn, api_fn = gpu(h.run), gpu(h.race), gpu(h.api_generate)
    with gr.Blocks(title="eagleviz: EAGLE speculative decoding", delete_cache=(CACHE_TTL_S, CACHE_TTL_S)) as demo:
        run_state, tour_state, playing, stop = gr.State(None), gr.State(0), gr.State(False), gr.State(StopRequest())
        gr.Markdown(INTRO + (f"\n\n{note}" if note else ""))
        with gr.Row():
            with gr.Column(scale=3):
                first = presets.PRESETS[0]
                prompt = gr.Textbox(first.prompt, label="Prompt", lines=3, elem_id="prompt",
                                    max_length=limits.max_prompt_chars)
                preset = gr.Radio([p.name for p in presets.PRESETS], value=first.name, label="Presets that teach",
                                  elem_id="preset")
                preset_note = gr.Markdown(presets.note(first), elem_id="preset-note")
                with gr.Row():
                    run_btn = gr.Button("\u25b6 Run", variant="primary", elem_id="run")
                    stop_btn = gr.Button("\u25a0 Stop", variant="stop", elem_id="stop")
                    race_btn = gr.Button("Race plain decoding", elem_id="race")
                status = gr.Markdown(elem_id="status")
                gr.Markdown(limits.describe(), elem_id="limits", elem_classes="ev-limits")
                output = gr.HTML(output_html(None), elem_id="output-text")
            with gr.Column(scale=2):
                d, d_origin = default_knobs(KNOB_DEFAULTS)
                steps = gr.Slider(1, 8, d.steps, step=1, label="steps \u00b7 speculative_num_steps", elem_id="steps")
                topk = gr.Slider(1, 8, d.topk, step=1, label="topk \u00b7 speculative_eagle_topk", elem_id="topk")
                draft_tokens = gr.Slider(2, limits.max_draft_tokens, min(d.draft_tokens, limits.max_draft_tokens),
                                         step=1, elem_id="draft-tokens",
                                         label="draft tokens \u00b7 speculative_num_draft_tokens")
                with gr.Row():
                    gr.Markdown(d_origin, elem_id="default-tree", elem_classes="ev-limits")
                    textbook = gr.Button("Textbook tree 5 / 4 / 16", size="sm", elem_id="textbook-tree")
                validity = gr.Markdown(d.validity(), elem_id="validity")
                with gr.Row():
                    temperature = gr.Slider(0, 1.5, d.temperature, step=0.05, label="temperature",
                                            elem_id="temperature")
                    top_p = gr.Slider(0.05, 1, d.top_p, step=0.05, label="top-p", elem_id="top-p")
                with gr.Row():
                    max_new = gr.Slider(1, limits.max_new_tokens, min(d.max_new_tokens, limits.max_new_tokens),
                                        step=1, label="max new tokens",
                                        elem_id="max-new-tokens")
                    seed = gr.Number(d.seed, precision=0, minimum=0, label="seed", elem_id="seed")
                attn = gr.Dropdown(list(IMPLS), value=d.attn_impl, label="attention implementation",
                                   elem_id="attn-impl")
        with gr.Row():
            summary = gr.Markdown(elem_id="summary")
        summary_plot = gr.Plot(label="Run summary", elem_id="summary-plot", show_label=False)
        race_md = gr.Markdown(elem_id="race-result")
        with gr.Accordion("Measured speed: EAGLE vs plain decoding vs peers", open=False, elem_id="measured-speed"):
            speed = measured_speed()
            for i, panel in enumerate(speed.benches):
                gr.Markdown(panel.text, elem_id=f"bench-table-{i}", elem_classes="ev-bench")
                gr.Plot(panel.figure, label="Measured tokens/s", elem_id=f"bench-plot-{i}", show_label=False)
            gr.Markdown(speed.curve_text, elem_id="verify-cost-text")
            gr.Plot(speed.curve, label="Verification cost", elem_id="verify-cost", show_label=False)
        with gr.Row():
            slider = gr.Slider(0, 1, 0, step=1, label="cycle", elem_id="cycle-slider", interactive=False, scale=6)
            with gr.Column(scale=2, min_width=240):
                with gr.Row():
                    prev_btn = gr.Button("\u25c0 Previous", elem_id="prev", size="sm")
                    next_btn = gr.Button("Next \u25b6", elem_id="next", size="sm")
                play_btn = gr.Button("\u25b6 Play", elem_id="play", size="sm")
        caption = gr.Markdown(elem_id="cycle-caption")
        with gr.Row():
            tree_plot = gr.Plot(label="Draft tree", elem_id="draft-tree", scale=3, show_label=False)
            tree_md = gr.Markdown(elem_classes="ev-explain")
        with gr.Row():
            with gr.Column():
                mask_plot = gr.Plot(label="Attention mask", elem_id="attention-mask", show_label=False)
                mask_md = gr.Markdown(elem_classes="ev-explain")
            with gr.Column():
                path_plot = gr.Plot(label="Accepted path", elem_id="accepted-path", show_label=False)
                path_md = gr.Markdown(elem_classes="ev-explain")
        with gr.Row():
            kv_plot = gr.Plot(label="KV rewind", elem_id="kv-rewind", scale=3, show_label=False)
            kv_md = gr.Markdown(elem_classes="ev-explain")
        with gr.Accordion("Losslessness at T > 0: replay the acceptance step", open=False):
            replay_plot = gr.Plot(label="Acceptance replay", elem_id="replay", show_label=False)
            replay_md = gr.Markdown(elem_classes="ev-explain")
        with gr.Accordion("Guided tour: one cycle in four steps", open=False):
            tour_md = gr.Markdown("Run a prompt, then step through draft, verify, accept and rewind.", elem_id="tour")
            with gr.Row():
                tour_prev = gr.Button("\u25c0 Tour back", elem_id="tour-prev")
                tour_next = gr.Button("Tour next \u25b6", elem_id="tour-next")
        with gr.Accordion("Save, load, deploy", open=False):
            with gr.Row():
                export_btn = gr.DownloadButton("Export trace (JSON)", value=None, elem_id="export")
                import_file = gr.File(label="Import a trace (JSON)", file_types=[".json"], type="filepath",
                                      elem_id="import")
            flags = gr.Code(language="shell", label="Launch flags for these knobs", elem_id="launch-flags")
        timer = gr.Timer(AUTOPLAY_EVERY_S, active=False)

        # ------------------------------------------------------------ events
        knobs = [steps, topk, draft_tokens, temperature, top_p, max_new, seed, attn]
        view = [caption, tree_plot, tree_md, mask_plot, mask_md, path_plot, path_md, kv_plot, kv_md, replay_plot,
                replay_md]
        run_outputs = [run_state, output, status, slider, summary, summary_plot, export_btn, tour_md] + view
        model = dict(concurrency_id="model", concurrency_limit=limits.concurrency)
        preset.change(h.preset_chosen, preset, [prompt, preset_note, temperature])
        textbook.click(lambda: (5, 4, 16), None, [steps, topk, draft_tokens], queue=False)
        gr.on([k.change for k in knobs], h.knobs_changed, knobs, [validity, flags], show_progress="hidden")
        demo.load(h.knobs_changed, knobs, [validity, flags])
        run_btn.click(run_fn, [stop, prompt, *knobs], run_outputs, show_progress="minimal", **model)
        # Stop skips the queue: it must reach the running generator even when the queue is full.
        stop_btn.click(h.request_stop, stop, status, show_progress="hidden", queue=False)
        slider.release(h.show, [run_state, slider], [summary_plot, *view], show_progress="hidden")
        prev_btn.click(lambda r, i: h.step(r, i, -1), [run_state, slider], [slider, summary_plot, *view],
                       show_progress="hidden")
        next_btn.click(lambda r, i: h.step(r, i, +1), [run_state, slider], [slider, summary_plot, *view],
                       show_progress="hidden")
        play_btn.click(h.play, [run_state, playing], [playing, timer, play_btn])
        timer.tick(h.tick, [run_state, slider], [slider, summary_plot, *view, playing, timer, play_btn],
                   show_progress="hidden")
        tour_prev.click(lambda r, i, s: h.tour(r, i, s, -1), [run_state, slider, tour_state], [tour_state, tour_md])
        tour_next.click(lambda r, i, s: h.tour(r, i, s, +1), [run_state, slider, tour_state], [tour_state, tour_md])
        race_btn.click(race_fn, [run_state, attn], race_md, **model)
        import_file.upload(h.imported, import_file, run_outputs)
        gr.api(api_fn, api_name="generate", **model)
    return demo.queue(max_size=limits.queue_size, default_concurrency_limit=VIEW_CONCURRENCY)
