"""The page's handlers that run the model or read files: knobs, presets, run and stop, race, compare, import, the
API.
Each returns values in the order of the outputs it is wired to in `eagleviz.app.ui.build_app`; the work lives in
`session` (engine side), `pairs` (which model is in memory) and `visuals` (trace -> figures).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import gradio as gr

from eagleviz.app import presets
from eagleviz.config import TreeConfig
from eagleviz.decoding.costs import CostModel
from eagleviz.decoding import race as race_mod
from eagleviz.errors import UserFacingError
from eagleviz.app.limits import Limits
from eagleviz.app.glossary import link_terms
from eagleviz.app.navigation import VIEW_SIZE, opening, tour_text, view_values
from eagleviz.app.pairs import PairHub
from eagleviz.app.scheduler import Turns
from eagleviz.app.shared import SHARED_RUN_NOTE, SharedRuns, sent_once, snapshot
from eagleviz.app.session import (RANDOM_HEAD_NOTE, SHARED_NOTE, FastestTree, Knobs, fastest_tree, generate, race_run,
                                  read_trace, rerun_with, stream_run, tree_of, why_small_trees, write_trace)
from eagleviz.trace import RunTrace
from eagleviz.visuals import summary_figure
from eagleviz.visuals import compare as compare_vis
from eagleviz.visuals.explain import stop_text, summary_text
from eagleviz.visuals.output_text import output_tokens

COST_AWARE = TreeConfig()   # the engine's default: cost-aware under 5 / 4 / 16, candidates from the head and lookup
COST_AWARE_ROW = "EAGLE, cost-aware (the default)"

STREAM_EVERY_S = 0.3      # minimum time between two streamed text updates, times the runs in progress (thirty
                          # runs streaming every cycle would spend the server's time on updates, not on decoding)
STOPPED = "stopped by the user"
KNOB_COUNT = 10           # the knobs every handler receives, in Knobs' field order
RACE_WAITS = ("A run is still going: the race compares a finished run with plain decoding. Press Race again once "
              "the run says Done (or press Stop to end it there).")
COMPARE_WAITS = ("A run is still going: Compare runs the prompt twice more, so it waits for the page's run. Press "
                 "Compare again once the run says Done (or press Stop to end it there).")
PENDING_TTL_S = 600       # a click not followed by its run within this long is forgotten (tab closed, queue full)


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


def _switch(name: str, value) -> bool:
    """A yes/no knob from the page (a checkbox) or the API (a boolean, or 0/1)."""
    if isinstance(value, bool):
        return value
    if value in (0, 1, "0", "1", "true", "false", "True", "False"):
        return str(value).lower() in ("1", "true")
    raise UserFacingError(f"{name} must be true or false, got {str(value)[:40]!r}")


def knobs_from(steps, topk, draft_tokens, temperature, top_p, max_new_tokens, seed, attn_impl="auto", adaptive=True,
               source=Knobs.source) -> Knobs:
    return Knobs(_number("steps", steps, int), _number("topk", topk, int),
                 _number("draft_tokens", draft_tokens, int), _number("temperature", temperature, float),
                 _number("top_p", top_p, float), _number("max_new_tokens", max_new_tokens, int),
                 _number("seed", 0 if seed is None else seed, int), str(attn_impl), _switch("adaptive", adaptive),
                 str(source))


def cycle_slider(run: RunTrace | None, value: int | None = 0):
    """The cycle slider over the run's cycles at `value` (None: the range grows, the visitor's position stays:
    while a run streams, the cycles recorded so far can be browsed)."""
    n = len(run.cycles) if run is not None else 0
    at = {} if value is None else {"value": min(value, max(n - 1, 0))}
    return gr.Slider(minimum=0, maximum=max(n - 1, 1), step=1, label=f"cycle (0 .. {max(n - 1, 0)})",
                     interactive=n > 1, **at)


@dataclass
class StopRequest:
    """Per-tab flags shared by the Run and Stop events: gr.State hands both events the same object, so the
    running generator sees the request between two cycles and finishes cleanly (summary and export included)."""

    requested: bool = False
    running: bool = False
    clicked_at: float | None = None   # when Run was clicked and its run has not started yet (`Handlers.announce`)


class Handlers:
    def __init__(self, pairs: PairHub, limits: Limits | None = None):
        self.pairs, self.limits = pairs, limits or Limits()
        self.turns = Turns(self.limits.concurrency)   # the one line to the model: runs take it cycle by cycle
        self.shared = SharedRuns()   # identical runs asked for at once, decoded once
        self._lock = threading.Lock()
        self._running = 0
        self.compares = 0  # Compares made: A and B take turns at going first (a first run pays the warm-up)
        self._pending: dict[int, float] = {}   # tab (id of its StopRequest) -> when its Run click was announced

    # ---------------------------------------------------------------- knobs, presets, pairs
    def knobs_changed(self, *values) -> tuple[str, str]:
        """values: the ten knobs (`KNOB_COUNT`), then the pair's name (optional)."""
        try:
            knobs = knobs_from(*values[:KNOB_COUNT])
        except UserFacingError as exc:
            return f"**Invalid:** {exc}", f"# invalid knobs: {exc}"
        hub = self.pairs.peek(values[KNOB_COUNT] if len(values) > KNOB_COUNT else None)
        if hub is None:
            return knobs.validity(), "# the launch flags appear once this model is loaded (on its first run)"
        return knobs.validity(), knobs.flags(hub)

    @staticmethod
    def preset_chosen(name: str | None) -> tuple:
        """The preset's prompt, its note, its temperature, its tree (steps, topk, draft tokens), the fixed tree
        (cost-aware off: the picture is what the knobs say) and its draft source."""
        preset = presets.by_name().get(name)
        if preset is None:
            return gr.skip(), "", *[gr.skip()] * 6
        return preset.prompt, presets.note(preset), preset.temperature, *preset.tree, False, preset.source

    @staticmethod
    def preset_kept(name: str | None, prompt: str, *values) -> tuple:
        """After the prompt or a knob changed: the preset the page's settings still are (`presets.matching`) and
        its note; an edited preset is let go, its note saying so. Outputs: preset, preset note."""
        try:
            found = presets.matching(prompt, knobs_from(*values))
        except UserFacingError:
            found = None
        if (found.name if found else None) == name:
            return gr.skip(), gr.skip()
        return (found.name, presets.note(found)) if found else (None, presets.edited_note(name))

    def pair_note(self, name: str | None) -> str:
        try:
            pair = self.pairs.pair(name)
        except UserFacingError as exc:
            return f"\u26a0 {exc}"
        if self.pairs.resident() == pair.name:
            return f"**{pair.name}** is loaded."
        return (f"**{pair.name}** is loaded on its first run (this takes a while); the model in memory now, "
                f"{self.pairs.resident() or 'none'}, is released first: one model at a time.")

    # ---------------------------------------------------------------- the queue
    def announce(self, stop: StopRequest):
        """Called without queueing when Run is clicked: a note when other runs share the model with this one.
        A tab counts once: a click while its run is waiting or going is ignored by the page (Gradio starts no
        second run from it), so it is not counted either and the note stays as it is."""
        now = time.monotonic()
        with self._lock:
            if stop.running or (stop.clicked_at is not None and now - stop.clicked_at < PENDING_TTL_S):
                return gr.skip()
            stop.clicked_at = now
            self._pending = {tab: t for tab, t in self._pending.items() if now - t < PENDING_TTL_S}
            self._pending[id(stop)] = now
            ahead = self._running + len(self._pending) - 1
        if ahead < 1:
            return ""
        gallery = "Meanwhile the **recorded runs** (Workshop, above) replay instantly, with no model work."
        if ahead >= self.limits.active_runs:
            return (f"\u25f7 {ahead} run(s) ahead of yours; this server runs {self.limits.active_runs} at a time, "
                    f"taking turns cycle by cycle. {gallery}")
        return (f"\u25f7 {ahead} run(s) ahead of yours share the model: each takes one cycle in turn, so yours shows "
                f"its first cycle after about {ahead} other cycles, then advances at 1/{ahead + 1} of its own speed. "
                f"{gallery}")

    def _started(self, stop: StopRequest) -> None:
        with self._lock:
            self._running += 1
            self._pending.pop(id(stop), None)
            stop.clicked_at = None

    def _ended(self) -> None:
        with self._lock:
            self._running -= 1

    # ---------------------------------------------------------------- run, stop, finish
    def run(self, stop: StopRequest, pair: str | None, prompt: str, *values) -> Iterator[tuple]:
        """Outputs: run_state, output, status, slider, summary, summary plot, export, tour, *view."""
        skip = gr.skip()
        last, run, stream, stopped = 0.0, None, None, False
        stop.requested, stop.running = False, True
        self._started(stop)
        try:
            knobs = knobs_from(*values)
            name = self.pairs.pair(pair).name
            if self.pairs.resident() != name:
                yield (skip, skip, f"Loading **{name}** (first use; one model is held at a time)\u2026",
                       *[skip] * (5 + VIEW_SIZE))
            with self.pairs.use(name) as hub:
                text = _prompt(prompt)

                def start():
                    return stream_run(hub, text, knobs, self.limits, turns=self.turns)

                # a run asked with the same pair, prompt and knobs while one goes joins it (EAGLEVIZ_SHARE_RUNS)
                stream = self.shared.stream((name, text, knobs), start) if self.limits.share_runs else start()
                for run, cycle in stream:
                    if stop.requested:   # heard while the cycle ran: no progress said over the page's "Stopping"
                        stopped = True
                        break
                    if cycle is None:
                        # the four views of what was shown before (the opening's recorded run) go: the first
                        # cycle's figures, drawn into empty frames, reached the browser sooner
                        yield (run, [], "Running\u2026 (prefill)", cycle_slider(None), "", skip, skip, skip, skip,
                               "Waiting for the first cycle\u2026", *[skip] * 4, None, None, None, None,
                               *[skip] * (VIEW_SIZE - 10))
                    elif cycle.index == 0:   # its views, and the tour's words naming it (the tour's first stop);
                        # the views made and serialised once for every page that shows this run
                        view = self.shared.once(run, "first views", lambda: sent_once(view_values(run, 0)))
                        yield (run, output_tokens(run), self._progress(run), cycle_slider(run), skip, skip, skip,
                               tour_text(run, 0, 0), *view)
                        last = time.perf_counter()
                    elif time.perf_counter() - last >= STREAM_EVERY_S * max(self._running, 1):
                        yield (run, output_tokens(run), self._progress(run), cycle_slider(run, None),
                               *[skip] * (4 + VIEW_SIZE))
                        last = time.perf_counter()
                    if stop.requested:   # heard while the page was sent the cycle: no cycle more
                        stopped = True
                        break
        except (UserFacingError, MemoryError) as exc:
            yield (skip, skip, f"\u26a0 {_message(exc)}", *[skip] * (5 + VIEW_SIZE))
            return
        finally:
            if stream is not None:
                stream.close()   # (a run others watch goes on for them)
            stop.running = False
            self._ended()
        if stopped:  # this page's copy, as the run is now (a lone run's closed: its notes written)
            run = snapshot(run)
            run.stop_reason = STOPPED
        yield self.finished(run)

    @staticmethod
    def request_stop(stop: StopRequest) -> bool:
        """The Stop button: the running generator finishes after the cycle in progress (whether one was running).
        It writes no status: its answer could reach the page after the run's last one and cover "Done"; the page
        says "Stopping" itself (`STOPPING_JS`), only over a status that says the run is going."""
        if not stop.running:
            return False
        stop.requested = True
        return True

    def _progress(self, run: RunTrace) -> str:
        cap = run.config["sampling"]["max_new_tokens"]
        pages = self.shared.viewers(run)
        shared = f" (one run shown to {pages} pages that asked for it)" if pages > 1 else ""
        return f"Running\u2026 cycle {len(run.cycles)}, {len(run.output)} of at most {cap} tokens{shared}"

    @staticmethod
    def finished(run: RunTrace | None, shown: tuple[int, tuple] | None = None) -> tuple:
        """The end of a run (or of an import, or a Stop): summary, export file, full slider, and the run's most
        instructive cycle (`navigation.instructive_cycle`), or `shown`: a cycle and its view values (a link's
        picture, `navigation.picture`)."""
        if run is None:
            return (None, [], "", cycle_slider(None), "", None, None, "", *view_values(None, 0))
        note = f" {RANDOM_HEAD_NOTE}" if run.head.startswith("random") else ""
        notes = "".join(f"\n\n{_mark(n)} {n}" for n in getattr(run, "notes", []))
        status = f"Done: {stop_text(run)}.{note}{notes}"
        i, view = shown or opening(run)
        tour = tour_text(run, i, 0) if run.cycles else ""
        return (run, output_tokens(run), status, cycle_slider(run, i), link_terms(summary_text(run)),
                summary_figure(run, i), write_trace(run), tour, *view)

    # ---------------------------------------------------------------- race, import, API
    def race(self, run: RunTrace | None, attn_impl: str, pair: str | None = None,
             stop: StopRequest | None = None) -> str:
        """Plain decoding against the page's run (do the texts agree?) and against EAGLE with the cost-aware tree
        (the default: SGLang's default knobs as upper bounds) and with this machine's fastest fixed tree (how fast
        can it be?), each timed alone: other runs wait for the race's turn to end.
        `stop`: the tab's run flags; a run still going is refused, its output is not the run's yet."""
        if stop is not None and stop.running:
            gr.Warning(RACE_WAITS)
            return f"\u26a0 {RACE_WAITS}"
        if run is None:
            return "Run a prompt first; the race decodes the same prompt without speculation."
        fastest = fastest_tree(float(run.config["sampling"].get("temperature", 0.0)))
        try:
            with self.pairs.use(pair) as hub:
                if hub.model_id and run.model != hub.get().target.name:
                    raise UserFacingError(f"this run was made with {run.model}; choose that model to race it")
                with self.turns.alone():
                    result = race_run(hub, run, attn_impl, self.limits)
                    policy = rerun_with(hub, run, COST_AWARE, attn_impl, self.limits)
                    again = rerun_with(hub, run, fastest.tree, attn_impl, self.limits) if fastest else None
                costs = hub.get(attn_impl).costs
        except UserFacingError as exc:
            return f"\u26a0 {exc}"
        return race_text(result, again, fastest, policy, costs)

    def compare(self, stop: StopRequest, pair: str | None, prompt: str, *values) -> tuple:
        """Setting A (the page's knobs) and setting B (A with B's tree, draft source and temperature) run on the
        prompt, one after the other (A first in one Compare, B first in the next), taking turns at the model like
        any run, within the server's limits.
        values: the ten knobs (`KNOB_COUNT`), then B's steps, topk, draft tokens, temperature, cost-aware tree
        and draft source. Outputs: the table, the acceptance histogram, the acceptance rate per position."""
        skip = gr.skip()
        if stop.running:
            gr.Warning(COMPARE_WAITS)
            return f"\u26a0 {COMPARE_WAITS}", skip, skip
        try:
            a = knobs_from(*values[:KNOB_COUNT])
            steps, topk, draft_tokens, temperature, adaptive, source = values[KNOB_COUNT:]
            b = replace(a, steps=_number("B steps", steps, int), topk=_number("B topk", topk, int),
                        draft_tokens=_number("B draft tokens", draft_tokens, int),
                        temperature=_number("B temperature", temperature, float),
                        adaptive=_switch("B cost-aware", adaptive), source=str(source))
            if a == b:
                return "Setting B is the same as A (the knobs above): change one of B's knobs.", skip, skip
            with self._lock:
                b_first, self.compares = self.compares % 2 == 1, self.compares + 1
            with self.pairs.use(pair) as hub:
                done = {id(k): generate(hub, _prompt(prompt), k, self.limits, self.turns)
                        for k in ((b, a) if b_first else (a, b))}
            runs = [done[id(a)], done[id(b)]]
        except (UserFacingError, MemoryError) as exc:
            return f"\u26a0 {_message(exc)}", skip, skip
        stats = compare_vis.compare_stats(*runs)
        return (compare_vis.compare_table(stats), compare_vis.histogram_figure(stats),
                compare_vis.positions_figure(stats))

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
                     temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                     model: str = "", adaptive: bool = True, source: str = "eagle+lookup") -> dict:
        """Run EAGLE speculative decoding and return the full trace (every cycle's tree, mask, checks, KV moves).
        `model` names one of the server's model/head pairs (empty: the first). `adaptive`: the cost-aware tree
        (the tree knobs are upper bounds), false for SGLang's fixed tree; `source`: "eagle", "lookup" or
        "eagle+lookup" (the default, as `Knobs` and the command line). The server's limits apply as on the page, and the run takes turns at the model with the
        page's runs; a run over the time limit returns its partial trace with `stop_reason` saying so."""
        try:
            knobs = knobs_from(steps, topk, draft_tokens, temperature, top_p, max_new_tokens, seed, "auto", adaptive,
                               source)
            with self.pairs.use(model or None) as hub:
                return generate(hub, _prompt(prompt), knobs, self.limits, self.turns).to_dict()
        except (UserFacingError, MemoryError) as exc:
            raise gr.Error(_message(exc)) from exc


# `speed_verdict`'s words: within this much of plain decoding's speed, EAGLE is "about as fast"
ABOUT_AS_FAST = 0.05


def speed_verdict(plain: RunTrace, timed: list[tuple[str, RunTrace]], costs: CostModel | None, n: int = 16,
                  alone: bool = True) -> str:
    """One line that answers "is EAGLE faster here?": the best of the EAGLE runs `timed` on this server now against
    plain decoding timed with them (`alone`: each run alone, else the page's run as it streamed), and why, from
    this server's own price list (`costs`, measured where it runs, not a shipped benchmark's) and the best run's
    acceptance. Empty when nothing was timed here."""
    p = plain.summary()["tokens_per_s"]
    rates = [(r.summary()["tokens_per_s"] / p, name, r) for name, r in timed if p > 0]
    if not rates:
        return ""
    best, name, run = max(rates, key=lambda x: x[0])
    tau = run.summary()["tau"]
    word = ("faster than" if best >= 1 + ABOUT_AS_FAST else "about as fast as" if best > 1 - ABOUT_AS_FAST
            else "slower than")
    why = f"its head's drafts gave \u03c4 = {tau:.2f} tokens a target forward"
    if costs is not None and costs.step_ms > 0:
        why = (f"verifying {n} tokens costs {costs.verify_cost(n) / costs.verify_cost(1):.1f} plain steps on this "
               f"server (its price list, {costs.step_ms:.1f} ms a plain step) and {why}")
    how = "each run alone" if alone else "this run as it ran, streamed to the page"
    return (f"**Here, now: EAGLE is {word} plain decoding ({best:.2f}x at best: {name.removeprefix('EAGLE, ')}).** "
            f"Measured on this server just now, {how}; {why}.")


def race_text(result: race_mod.RaceResult, fastest_run: RunTrace | None, fastest: FastestTree | None,
              policy_run: RunTrace | None = None, costs: CostModel | None = None) -> str:
    """The race as Markdown: the one-line answer to "is EAGLE faster here?" (`speed_verdict`), whether the page's
    run and plain decoding agree (`race.describe`'s verdict), then the speeds of plain decoding, the cost-aware
    tree, the fastest fixed tree and the page's run, then why a CPU prefers small trees (the verdicts and the
    baseline first: they are what sits under the Race button in sight). A row the page's run already is, is not
    run twice: its label says so. `costs`: this server's price list."""
    run, plain = result.speculative, result.plain
    p = plain.summary()["tokens_per_s"]
    rows = [(COST_AWARE_ROW, policy_run)] if policy_run is not None else []
    here = fastest is not None and not fastest.shipped
    rows += [(f"EAGLE, {'this server' if here else 'the shipped benchmark'}'s fastest tree", fastest_run)] \
        if fastest_run is not None else []
    mine = tree_of(run)
    own = "EAGLE, this run's tree" + (" (timed elsewhere)" if not result.timed_here else
                                      (" (the fastest here)" if here else " (the shipped benchmark's fastest)")
                                      if fastest is not None and fastest_run is None and mine == fastest.tree else
                                      " (the cost-aware default)" if mine == COST_AWARE else
                                      " (as it ran)" if rows else "")
    alone = rows   # timed alone by the race, other runs waiting
    rows = [("plain decoding", plain), *rows, (own, run)]   # the baseline first: in sight under the button
    lines = ["| | tree | tokens | time (s) | tokens/s | \u03c4 | speedup |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        s, tree = r.summary(), tree_of(r)
        bound = "\u2264 " if tree is not None and tree.adaptive else ""   # the knobs are upper bounds
        shape = f"{bound}{tree.steps} / {tree.topk} / {tree.draft_tokens}" if tree else ""
        tau = f"{s['tau']:.2f}" if tree else ""
        speedup = f"{s['tokens_per_s'] / p:.2f}x" if p > 0 and (r is not run or result.timed_here) else ""
        lines.append(f"| {name} | {shape} | {s['new_tokens']} | {s['wall_s']:.2f} | {s['tokens_per_s']:.1f} | {tau} "
                     f"| {speedup} |")
    where = (f"The fastest tree is the fixed one `tune` found ({fastest.origin}); the cost-aware tree takes "
             "SGLang's default knobs as upper bounds and verifies, each cycle, what is expected to pay here. They "
             "and plain decoding were timed alone, other runs waiting. " if fastest is not None else
             "No `tune` result here: the race times this run's tree and the cost-aware one. " if result.timed_here
             else "")
    if not result.timed_here:
        where += (f"This run's own row has no speedup: {race_mod.elsewhere(result)} Press Run to make one here. "
                  if alone else f"**No speedup measured**: {race_mod.elsewhere(result)} Press Run to make one here. ")
    elif alone:
        where += "This run's own row was timed as it ran, streamed to the page (the others alone). "
    answer = speed_verdict(plain, alone or ([(own, run)] if result.timed_here else []), costs, alone=bool(alone))
    verdict = race_mod.describe(result).split("\n\n", 2)[2:]  # after describe's table and speedup: the texts
    # The verdicts first, then the table: under the Race button, in sight; the reasons after them.
    return ((answer + "\n\n" if answer else "") + "**This run against plain decoding.** " + "".join(verdict) + "\n\n"
            + "\n".join(lines) + "\n\n" + where + why_small_trees(costs=costs))


def _mark(note: str) -> str:
    """The sign before a run's note: a clock for the time it waited for its turns, paired arrows for a run shown
    to several pages, a warning for the rest."""
    if note.startswith(SHARED_NOTE):
        return "\u25f7"
    return "\u21c9" if note.startswith(SHARED_RUN_NOTE) else "\u26a0"


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
