"""The app's handlers (eagleviz/app/handlers.py, eagleviz/app/navigation.py), session logic, race and launch flags, and
the page's wiring (eagleviz/app/ui.py), on a tiny random engine (fast, deep accepts)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr
import pytest

from eagleviz.decoding import race as race_mod
from eagleviz.errors import UserFacingError
from eagleviz.app.limits import Limits
from eagleviz.app.session import EngineHub, Knobs, generate, read_trace, stream_run
from eagleviz.trace import RunTrace
from eagleviz.app import presets
from eagleviz.app import navigation as nav
from eagleviz.app import handlers as handlers_mod
from eagleviz.app.handlers import STOPPED, Handlers, StopRequest
from eagleviz.app.shared import SHARED_RUN_NOTE
from eagleviz.app.navigation import VIEW_SIZE
from eagleviz.app.ui import as_pairs, build_app
from tiny import tiny_engine

# steps, topk, draft_tokens, temperature, top_p, max_new, seed, attn, adaptive (a fixed tree), source
KNOBS = (4, 4, 16, 0.0, 1.0, 16, 0, "auto", False, "eagle")
RUN_OUT = 8 + VIEW_SIZE                      # run_state, output, status, slider, summary, plot, export, tour


@pytest.fixture(scope="module")
def hub():
    return EngineHub(tiny_engine("llama", vocab=8), model_id="tiny", head_path=None)


@pytest.fixture(scope="module")
def handlers(hub):
    return Handlers(as_pairs(hub))


@pytest.fixture(scope="module")
def finished(handlers):
    """The outputs of every step of one run, and the final run."""
    steps = list(handlers.run(StopRequest(), None, "a prompt", *KNOBS))
    return steps, steps[-1][0]


# ------------------------------------------------------------------ knobs, presets, flags


def test_validity_shows_the_rule_and_adjustments(handlers):
    text, flags = handlers.knobs_changed(5, 4, 16, 0.0, 1.0, 48, 0, "auto", False)
    assert "**69**" in text and "**16** tokens" in text
    text, _ = handlers.knobs_changed(5, 4, 16, 0.0, 1.0, 48, 0, "auto", True)
    assert "**at most 16** tokens" in text and "pay on this machine" in text
    text, flags = handlers.knobs_changed(3, 1, 10, 0.0, 1.0, 48, 0, "auto")
    assert "Adjusted" in text and "steps + 1 = 4" in text
    assert "--speculative-num-draft-tokens 4" in flags and "--speculative-eagle-topk 1" in flags
    text, _ = handlers.knobs_changed(3, 2, 99, 0.0, 1.0, 48, 0, "auto")
    assert "reduced from 99 to 11" in text
    text, flags = handlers.knobs_changed(3, 2, 8, 3.0, 1.0, 48, 0, "auto")
    assert text.startswith("**Invalid:**") and "temperature" in text and flags.startswith("# invalid")


def test_launch_flags_name_sglang_and_vllm_knobs(hub):
    flags = Knobs(steps=6, topk=3, draft_tokens=20, temperature=0.7).flags(hub)
    assert "python -m sglang.launch_server" in flags and "--speculative-algorithm EAGLE" in flags
    assert "--speculative-num-steps 6" in flags and "--speculative-eagle-topk 3" in flags
    line = next(ln for ln in flags.splitlines() if "--speculative-config" in ln)
    spec = json.loads(line.split("'")[1])
    assert spec == {"method": "eagle", "model": "<path or Hub id of a trained EAGLE head>", "num_speculative_tokens": 6}
    assert "temperature=0.7" in flags


def test_launch_flags_say_what_does_not_carry_over_and_name_no_server_path(hub):
    from eagleviz.app.flags import HEAD_PLACEHOLDER

    here = EngineHub(hub.get(), model_id="tiny", head_path="assets/eagle-smollm2-135m")   # a folder here
    flags = Knobs(adaptive=True, source="eagle+lookup").flags(here)
    assert "assets/" not in flags and HEAD_PLACEHOLDER in flags and "a folder here" in flags
    assert "upper bounds" in flags and "Neither server mixes lookup" in flags
    lookup = Knobs(steps=4, draft_tokens=8, adaptive=False, source="lookup").flags(here)
    assert "--speculative-algorithm NGRAM" in lookup and '"method": "ngram"' in lookup and "upper bounds" not in lookup
    assert "--speculative-draft-model-path" not in lookup
    published = EngineHub(hub.get(), model_id="tiny", head_path="owner/some-eagle-head")      # a Hub id
    assert "--speculative-draft-model-path owner/some-eagle-head" in Knobs(adaptive=False).flags(published)


def test_presets_fill_the_prompt_the_temperature_and_their_own_branching_fixed_tree():
    for p in presets.PRESETS:
        prompt, note, temperature, steps, topk, draft_tokens, adaptive, source = Handlers.preset_chosen(p.name)
        assert (prompt, temperature) == (p.prompt, p.temperature) and "{" not in note
        assert (steps, topk, draft_tokens) == p.tree and topk >= 2 and adaptive is False and source == p.source
        assert f"Tree {p.tree_label}" in note                      # the note quotes its tree
    with pytest.raises(ValueError, match="must branch"):
        presets.Preset("chain", "p", "n", "high", (4, 1, 5))
    assert Handlers.preset_chosen(None)[1] == ""
    assert {p.shows for p in presets.PRESETS} == {"high", "code", "low", "sampling", "near_tie", "lookup"}


# ------------------------------------------------------------------ a run, streamed


def test_run_streams_then_finishes(finished):
    steps, run = finished
    assert all(len(s) == RUN_OUT for s in steps)
    assert "prefill" in steps[0][2]
    streamed_first = [s for s in steps[:-1] if isinstance(s[9], str) and s[9].startswith("**Cycle 0**")]
    assert len(streamed_first) == 1   # the first cycle's figures are sent as soon as it is recorded
    final = steps[-1]
    assert isinstance(run, RunTrace) and run.cycles and final[2].startswith("Done")
    assert "[\u03c4](#g-tau) =" in final[4]                    # summary with tau, linked to the glossary
    assert [text for text, _ in final[1]] == [t.text for t in run.output]   # one item per token
    assert read_trace(final[6]).token_ids == run.token_ids     # the export file reloads to the same run
    slider = final[3]
    assert slider.maximum == max(len(run.cycles) - 1, 1)
    longest = max(c.accept_length for c in run.cycles)    # it opens on the first cycle with the longest path
    opened = next(i for i, c in enumerate(run.cycles) if c.accept_length == longest)
    assert slider.constructor_args["value"] == opened and final[9].startswith(f"**Cycle {opened}**")


def test_streamed_progress_grows_the_slider_without_moving_it(handlers, monkeypatch):
    """While the run streams, the visitor may browse the cycles recorded so far: a progress update sends the
    slider's new range but no value (only the first cycle's update and the end set it to cycle 0)."""
    import eagleviz.app.handlers as module

    monkeypatch.setattr(module, "STREAM_EVERY_S", 0.0)   # an update after every cycle
    steps = list(handlers.run(StopRequest(), None, "a prompt", *KNOBS))
    progress = [s[3] for s in steps[:-1] if str(s[2]).startswith("Running\u2026 cycle") and not isinstance(s[9], str)]
    assert progress and all("value" not in slider.constructor_args for slider in progress)
    firsts = [s[3] for s in steps[:-1] if isinstance(s[9], str) and s[9].startswith("**Cycle 0**")]
    assert firsts[0].constructor_args["value"] == 0


def test_accepted_drafts_are_coloured_as_such(finished):
    steps, run = finished
    accepted = sum(c.accept_length for c in run.cycles)
    assert accepted > 0   # the tiny engine's random head covers half its vocabulary
    assert sum(kind == "accepted draft" for _, kind in steps[-1][1]) == accepted


def test_errors_are_shown_not_raised(handlers):
    out = list(handlers.run(StopRequest(), None, "   ", *KNOBS))
    assert len(out) == 1 and out[0][2].startswith("\u26a0") and "empty" in out[0][2]
    out = list(handlers.run(StopRequest(), None, "a prompt", 0, 2, 8, 0.0, 1.0, 12, 0, "auto"))
    assert "steps must be in" in out[0][2]


def test_stop_finishes_after_the_current_cycle(handlers):
    stop = StopRequest()
    assert handlers.request_stop(stop) is False             # nothing running: nothing to stop
    outputs = []
    for out in handlers.run(stop, None, "a prompt", *KNOBS):
        outputs.append(out)
        if out[0] is not None and out[0].cycles and not stop.requested:
            assert handlers.request_stop(stop) is True
    run = outputs[-1][0]
    assert run.stop_reason == "stopped by the user" and outputs[-1][2].startswith("Done: stopped")
    assert len(run.cycles) == 1 and not stop.running
    assert outputs[-1][6] and outputs[-1][4]                 # export file and summary, as after a full run


def test_two_pages_asking_for_one_run_at_once_share_it_and_a_stop_ends_only_its_own(handlers, monkeypatch):
    """A second page pressing Run with the same prompt and knobs while the first page's run goes joins it: one run
    decoded (`app.shared`), its cycles on both pages; a Stop on one page leaves it a copy of the run so far and
    the other page's run going to its end, which says it was shown to two."""
    started = []
    real = handlers_mod.stream_run
    monkeypatch.setattr(handlers_mod, "stream_run", lambda *args, **kw: started.append(1) or real(*args, **kw))
    a_stop, b_stop = StopRequest(), StopRequest()
    a = handlers.run(a_stop, None, "one prompt for two pages", *KNOBS)
    b = handlers.run(b_stop, None, "one prompt for two pages", *KNOBS)
    a_out, b_out = [next(a), next(a)], [next(b), next(b)]   # each: the prefill's line, then cycle 0's views
    assert a_out[1][0] is b_out[1][0] and a_out[1][2].startswith("Running\u2026 cycle")
    assert b_out[1][2].endswith("(one run shown to 2 pages that asked for it)")
    assert all(x is y for x, y in zip(a_out[1][8:], b_out[1][8:]))   # the first views made once for both pages
    assert handlers.request_stop(a_stop)
    a_out += list(a)
    b_out += list(b)
    assert started == [1]
    a_run, b_run = a_out[-1][0], b_out[-1][0]
    assert a_run.stop_reason == STOPPED and a_out[-1][2].startswith("Done: stopped") and len(a_run.cycles) == 1
    assert b_run.stop_reason != STOPPED and len(b_run.cycles) > 1 and b_out[-1][2].startswith("Done")
    assert b_run.token_ids[:len(a_run.token_ids)] == a_run.token_ids
    assert any(n.startswith(f"{SHARED_RUN_NOTE}: 2 visitors") for n in b_run.notes)
    assert f"\u21c9 {SHARED_RUN_NOTE}: 2 visitors" in b_out[-1][2]   # not a warning
    alone = list(handlers.run(StopRequest(), None, "one prompt for two pages", *KNOBS))[-1][0]
    assert started == [1, 1] and alone is not b_run   # a finished run is decoded again when asked again


# ------------------------------------------------------------------ stepping, autoplay, tour


def test_step_and_show_clamp_to_the_recording(finished):
    _, run = finished
    n = len(run.cycles)
    out = nav.step(run, 0, -1)
    assert out[0].value == 0 and out[3].startswith("**Cycle 0**")
    out = nav.step(run, n - 1, +1)
    assert out[0].value == n - 1
    out = nav.show(run, 1)
    assert len(out) == 1 + VIEW_SIZE and out[2].startswith("**Cycle 1**")
    assert nav.show(None, 0)[2].startswith("Run a prompt")


def test_autoplay_advances_and_stops_at_the_end(finished):
    _, run = finished
    playing, timer, button = nav.play(run, False)
    assert playing and timer.active and "Pause" in button.value
    out = nav.tick(run, 0)
    assert out[0].value == 1 and out[-3] is True
    out = nav.tick(run, len(run.cycles) - 1)
    assert out[-3] is False and out[-2].active is False
    assert nav.play(run, True)[0] is False


def test_tour_walks_four_steps(finished):
    _, run = finished
    texts = [nav.tour(run, 0, k, +1)[1] for k in range(-1, 3)]
    for title, text in zip(("Draft", "Verify", "Accept", "Rewind"), texts):
        assert title in text
    assert nav.tour(None, 0, 0, 1)[1].startswith("Run a prompt")


# ------------------------------------------------------------------ import


def test_import_round_trip_and_refusals(handlers, finished, tmp_path):
    _, run = finished
    good = tmp_path / "run.json"
    good.write_text(run.to_json())
    out = handlers.imported(str(good))
    assert out[0].token_ids == run.token_ids and out[2].startswith("Imported")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 99}')
    out = handlers.imported(str(bad))
    assert out[2].startswith("\u26a0") and "schema version" in out[2]
    broken = json.loads(run.to_json())
    broken["cycles"][0]["path"] = [0, 999]
    bad.write_text(json.dumps(broken))
    assert "path" in handlers.imported(str(bad))[2]
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (Limits().max_upload_bytes + 1))
    with pytest.raises(UserFacingError, match="limited to 20 MB on this server"):
        read_trace(big)


# ------------------------------------------------------------------ race


def test_race_identical_in_fp32(handlers, finished):
    _, run = finished
    text = handlers.race(run, "auto")
    assert "| speedup |" in text and "Identical outputs" in text
    assert handlers.race(None, "auto").startswith("Run a prompt")


def test_race_explains_a_divergence(hub, finished):
    _, run = finished
    tampered = RunTrace.from_json(run.to_json())
    position = 3
    tampered.output[position].token = (tampered.output[position].token + 1) % 8
    result = race_mod.race(hub.get(), tampered)
    d = result.divergence
    assert not result.identical and d.position == position and len(d.top2) == 2 and d.gap >= 0
    text = race_mod.describe(result)
    assert f"from new token {position}" in text and "rounding" in text


def test_race_refuses_an_imported_trace_over_the_limits(hub, finished):
    """An imported trace is raced like a new request: length, prompt and KV budget are checked first."""
    _, run = finished
    handlers = Handlers(as_pairs(hub))
    long = RunTrace.from_json(run.to_json())
    long.output = long.output * (600 // len(long.output) + 1)  # 600+ tokens: above this server's 512
    assert "above this server's limit of 512" in handlers.race(long, "auto")
    huge = RunTrace.from_json(run.to_json())
    huge.output = huge.output * (9000 // len(huge.output) + 1)  # above any run's 8,192
    assert handlers.race(huge, "auto").startswith("\u26a0 this run cannot be raced: max_new_tokens")
    long_prompt = RunTrace.from_json(run.to_json())
    long_prompt.prompt = "x" * (Limits().max_prompt_chars + 1)
    assert "at most 8,000 characters" in handlers.race(long_prompt, "auto")
    tiny_kv = Handlers(as_pairs(hub), Limits(kv_budget_mb=0))
    assert "budget of 0 MB" in tiny_kv.race(run, "auto")


def _row(text: str, name: str) -> list[str]:
    """The cells of the race table's row that starts with `name`."""
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| {name}"))
    return [cell.strip() for cell in row.strip("|").split("|")]


@pytest.mark.parametrize("machine", ["Another CPU, AVX2, no native bf16, 64 thread(s)", ""])
def test_race_divides_only_times_taken_on_this_machine(handlers, hub, finished, tmp_path, machine):
    """A trace imported from another machine, or one that does not say where it ran, is compared token by token,
    but its speed is not divided by a plain run timed here: the race says it needs a run made here."""
    _, run = finished
    data = json.loads(run.to_json())
    data["machine"] = machine
    path = tmp_path / "imported.json"
    path.write_text(json.dumps(data))
    imported = read_trace(path)
    text = handlers.race(imported, "auto")
    assert "Identical outputs" in text and "This run's own row has no speedup" in text and "Press Run" in text
    assert text.startswith("**Here, now: EAGLE is ")     # the answer comes from the rows timed here, alone
    assert _row(text, "EAGLE, this run's tree")[0].endswith("(timed elsewhere)")
    assert _row(text, "EAGLE, this run's tree")[-1] == ""          # no speedup in its row
    result = race_mod.race(hub.get(), imported)
    assert result.identical and not result.timed_here and result.speedup is None
    assert "Measured speedup" not in race_mod.describe(result)
    assert (machine or "a machine its trace does not record") in race_mod.elsewhere(result)
    # the run as this server made it: timed here, raced with its speedup
    assert run.machine and run.machine == hub.get().machine()
    text = handlers.race(run, "auto")
    assert "No speedup" not in text and _row(text, "EAGLE, this run's tree")[-1].endswith("x")
    assert race_mod.race(hub.get(), run).speedup > 0


def test_race_stops_plain_decoding_at_the_time_limit(hub, finished):
    from eagleviz.app.session import race_run

    _, run = finished
    ticks = iter(range(1000))
    result = race_run(hub, run, "auto", Limits(max_run_seconds=3), clock=lambda: next(ticks))
    assert "time limit" in result.plain.stop_reason and 0 < len(result.plain.output) < len(run.output)
    assert "plain decoding stopped: time limit" in race_mod.describe(result)


def test_race_renders_the_prompt_as_the_run_did(hub):
    """A run made without the chat template (generate --no-chat) is raced without it, and says so in its trace;
    a trace that does not record it is raced with the template, as runs are by default."""
    from tiny import TinyTokenizer

    class ChatTokenizer(TinyTokenizer):
        chat_template = "user: {prompt}"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return f"<user>{messages[0]['content']}<assistant>"

    engine = tiny_engine("llama", vocab=8)
    engine.target.tokenizer = ChatTokenizer()
    from eagleviz.config import SamplingConfig, TreeConfig

    sampling = SamplingConfig(max_new_tokens=8)
    bare = engine.generate("a prompt", TreeConfig.create(3, 2, 6), sampling, chat=False)
    chat = engine.generate("a prompt", TreeConfig.create(3, 2, 6), sampling)
    assert (bare.chat, chat.chat) == (False, True) and bare.prompt_tokens < chat.prompt_tokens
    for run in (bare, chat):
        result = race_mod.race(engine, run)
        assert result.plain.prompt_tokens == run.prompt_tokens and result.identical
    old = RunTrace.from_dict({k: v for k, v in json.loads(chat.to_json()).items() if k != "chat"})
    assert old.chat is None and race_mod.race(engine, old).plain.prompt_tokens == chat.prompt_tokens


def test_rounding_steps_in_bf16():
    d = race_mod.Divergence(position=0, speculative="a", plain="b", dtype="bfloat16",
                            top2=[(1, "a", 20.125), (2, "b", 20.0)])
    assert d.gap == pytest.approx(0.125) and d.rounding_steps == pytest.approx(1.0)


# ------------------------------------------------------------------ API and app


def test_api_generate_returns_the_trace(handlers):
    data = handlers.api_generate("a prompt", 3, 2, 6, 0.0, 1.0, 6, 0)
    run = RunTrace.from_dict(data)
    assert run.cycles and len(run.output) == 6 and data["summary"]["tau"] >= 1.0
    with pytest.raises(gr.Error):
        handlers.api_generate("a prompt", 3, 2, 6, 0.0, 1.0, 10_000, 0)


def test_generate_and_stream_agree(hub):
    knobs = Knobs(3, 2, 6, 0.0, 1.0, 8, 0)
    streamed = [c for _, c in stream_run(hub, "abc", knobs) if c is not None]
    assert [c.committed for c in streamed] == [c.committed for c in generate(hub, "abc", knobs).cycles]


def test_attention_impl_choices(hub):
    assert hub.get("torch").attn_impl == "torch"
    with pytest.raises(UserFacingError):
        hub.get("cuda-magic")


def test_build_app_has_the_stable_element_ids(hub):
    demo = build_app(hub)
    ids = {c.get("props", {}).get("elem_id") for c in demo.config["components"]}
    for elem_id in ("prompt", "run", "stop", "cycle-slider", "draft-tree", "attention-mask", "accepted-path",
                    "kv-rewind", "output-text", "summary"):
        assert elem_id in ids
    assert any(d.get("api_name") == "generate" for d in demo.config["dependencies"])


def _inside(node: dict, target: int, within: bool = False) -> set[int]:
    """Ids of the components laid out inside component `target` (walking Gradio's layout tree)."""
    ids = set()
    for child in node.get("children", []):
        if within:
            ids.add(child["id"])
        ids |= _inside(child, target, within or child["id"] == target)
    return ids


def test_measured_speed_section_shows_the_bench_table_and_the_curve(hub, tmp_path, monkeypatch):
    """Read once at build time, no model: the shipped bench, curve and ceiling (this machine has measured
    nothing), with the mismatches summarised; a clear message when no curve or ceiling exists; once measured, this
    machine's curve."""
    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path))
    demo = build_app(hub)
    by_id = {c["props"]["elem_id"]: c for c in demo.config["components"] if c.get("props", {}).get("elem_id")}
    section = by_id["measured-speed"]
    assert section["props"]["label"] == "Measured speed: EAGLE vs plain decoding vs peers"
    inside = _inside(demo.config["layout"], section["id"])
    assert {by_id[e]["id"] for e in ("bench-table-0", "bench-plot-0", "verify-cost-text", "verify-cost", "ceiling-text",
                                     "ceiling")} <= inside
    assert "What a perfect drafter would reach" in by_id["ceiling-text"]["props"]["value"]
    assert "every guess right" in by_id["ceiling"]["props"]["value"]["plot"]
    table = by_id["bench-table-0"]["props"]["value"]
    assert "| eagle-tree |" in table and "@prompt" not in table
    assert "Every greedy output of ours" in table and "Hugging Face's" in table  # from blocks: HF's numerics differ
    assert "shipped with eagleviz" in table and "threads" in table and "python -m eagleviz bench --limit" in table
    assert '"type":"bar"' in by_id["bench-plot-0"]["props"]["value"]["plot"]
    assert "shipped with eagleviz" in by_id["verify-cost-text"]["props"]["value"]

    import eagleviz.measured as measured

    monkeypatch.setattr(measured, "SHIPPED_DIR", tmp_path / "nothing-shipped")
    by_id = {c["props"]["elem_id"]: c for c in build_app(hub).config["components"] if c.get("props", {}).get("elem_id")}
    assert "run `python -m eagleviz tune` to measure this machine" in by_id["verify-cost-text"]["props"]["value"]
    assert "run `python -m eagleviz ceiling` to measure" in by_id["ceiling-text"]["props"]["value"]

    curve = {"prefix": 200, "ms": {"1": 30.0, "16": 36.0}, "relative": {"1": 1.0, "16": 1.2}}
    (tmp_path / "verify-cost.json").write_text(json.dumps({"verify_cost": curve, "machine": {"dtype": "bfloat16"}}))
    by_id = {c["props"]["elem_id"]: c for c in build_app(hub).config["components"] if c.get("props", {}).get("elem_id")}
    assert "measured on this machine" in by_id["verify-cost-text"]["props"]["value"]
    assert "n = 16 costs 1.20x" in by_id["verify-cost"]["props"]["value"]["plot"]


def test_factory_is_called_once_on_first_use():
    calls = []

    def factory():
        calls.append(1)
        return tiny_engine("llama", vocab=8)

    hub = EngineHub(factory)
    assert not calls
    hub.get("auto"), hub.get("torch"), hub.get("auto")
    assert calls == [1] and hub.head_is_random


def test_the_fastest_tree_comes_from_tune_and_says_where(tmp_path, monkeypatch):
    """This machine's `tune` result first, else the shipped one (measured for the shipped head), else none; a
    fixed tree, as tune measured it; the line under the buttons names its source and why a CPU wants it small."""
    from eagleviz import measured
    from eagleviz.app.session import fastest_tree
    from eagleviz.app.ui import tree_origin

    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured, "SHIPPED_DIR", tmp_path / "shipped")
    assert fastest_tree() is None and "tune` finds" in tree_origin(None)
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / "tuned.json").write_text(json.dumps({"best": {"steps": 3, "topk": 4, "draft_tokens": 8}}))
    found = fastest_tree()
    assert (found.tree.steps, found.tree.topk, found.tree.draft_tokens, found.tree.adaptive) == (3, 4, 8, False)
    assert found.label == "3 / 4 / 8" and "shipped with eagleviz" in tree_origin(found)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tuned.json").write_text(json.dumps({"best": {"steps": 4, "topk": 1, "draft_tokens": 5}}))
    line = tree_origin(fastest_tree())
    assert "4 / 1 / 5" in line and "measured on this machine" in line and "race times it" in line
    assert "prefers small trees" in line
    (tmp_path / "cache" / "tuned.json").write_text(json.dumps({"best": {"steps": 99, "topk": 4, "draft_tokens": 8}}))
    assert fastest_tree().tree.steps == 3  # an unusable result is skipped: the shipped one applies


def test_the_page_opens_on_the_first_preset_with_its_branching_tree(hub):
    """The first screen teaches trees: the knobs start at the first preset's tree (topk >= 2, fixed), and the
    fastest tree is a button away."""
    demo = build_app(hub)
    values = {c.get("elem_id"): c.get("value") for c in (b["props"] for b in demo.config["components"])}
    first = presets.PRESETS[0]
    assert (values["steps"], values["topk"], values["draft-tokens"]) == first.tree and values["topk"] >= 2
    assert values["adaptive"] is False and values["prompt"] == first.prompt
    assert values["draft-source"] == "eagle"


def test_a_second_pair_is_named_loaded_on_first_use_and_never_a_path(hub):
    from eagleviz.app.pairs import Pair, PairHub

    loads = []
    pairs = PairHub((Pair("tiny"), Pair("other", "elsewhere")), load=lambda pair: loads.append(pair.name) or hub)
    h = Handlers(pairs)
    assert "loaded on its first run" in h.pair_note("tiny") and loads == []
    assert h.knobs_changed(*KNOBS, "tiny")[1].startswith("# the launch flags appear once")
    steps = list(h.run(StopRequest(), "other", "a prompt", *KNOBS))
    assert steps[0][2].startswith("Loading **other**") and steps[-1][2].startswith("Done") and loads == ["other"]
    assert "is loaded" in h.pair_note("other") and "sglang" in h.knobs_changed(*KNOBS, "other")[1]
    assert "not a model offered" in list(h.run(StopRequest(), "/etc/passwd", "a prompt", *KNOBS))[-1][2]
    with pytest.raises(gr.Error, match="not a model offered"):
        h.api_generate("a prompt", 3, 2, 6, 0.0, 1.0, 6, 0, model="../../models")


def test_the_race_times_the_fastest_tree_and_plain_decoding_and_compares_this_runs_text(hub, tmp_path,
                                                                                        monkeypatch):
    from eagleviz import measured

    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured, "SHIPPED_DIR", tmp_path / "shipped")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tuned.json").write_text(json.dumps({"best": {"steps": 4, "topk": 1, "draft_tokens": 5}}))
    h = Handlers(as_pairs(hub))
    run = generate(hub, "a prompt", Knobs(3, 2, 6, max_new_tokens=10, adaptive=False))
    text = h.race(run, "auto")
    rows = [line for line in text.splitlines() if line.startswith("| EAGLE") or line.startswith("| plain")]
    assert [r.split("|")[1].strip() for r in rows] == ["plain decoding", "EAGLE, cost-aware (the default)",
                                                       "EAGLE, this server's fastest tree",
                                                       "EAGLE, this run's tree (as it ran)"]
    assert "| \u2264 5 / 4 / 16 |" in rows[1] and "| 4 / 1 / 5 |" in rows[2] and "| 3 / 2 / 6 |" in rows[3]
    assert "timed alone" in text and all(_row(text, r.split("|")[1].strip())[-1].endswith("x") for r in rows)
    # the answer and the verdict, then the table with its baseline first: what sits under the Race button, in sight
    answer, verdict = text.split("\n\n")[:2]
    best = max(float(_row(text, r.split("|")[1].strip())[-1][:-1]) for r in rows[1:3])   # the rows timed alone
    assert answer.startswith("**Here, now: EAGLE is ") and f"({best:.2f}x at best: " in answer, answer
    assert "each run alone" in answer and "plain steps on this server" not in answer   # the tiny hub: no price list
    assert verdict.startswith("**This run against plain decoding.**") and "Identical outputs" in verdict
    from eagleviz.app.session import fastest_tree

    again = generate(hub, "a prompt", Knobs(4, 1, 5, max_new_tokens=10, adaptive=False,
                                            source=fastest_tree().tree.source))
    assert "(the fastest here)" in h.race(again, "auto")      # the run used the fastest tree: no second run
    default = generate(hub, "a prompt", Knobs(max_new_tokens=10))  # the cost-aware default: not run twice
    text = h.race(default, "auto")
    assert "EAGLE, cost-aware (the default)" not in text and "(the cost-aware default)" in text


def test_the_speed_verdict_is_one_line_from_this_servers_runs_and_price_list(hub):
    """"Is EAGLE faster here?" in one line: the best run timed here against plain decoding, in one of three words,
    and why from this server's price list (not a shipped benchmark's) and the run's acceptance."""
    from eagleviz.app.handlers import speed_verdict
    from eagleviz.decoding.costs import CostModel

    run = generate(hub, "a prompt", Knobs(3, 2, 6, max_new_tokens=10, adaptive=False))
    costs = CostModel(verify=((1, 1.0), (16, 4.3)), draft_level=0.3, overhead=0.1, step_ms=12.5)
    tau, p = run.summary()["tau"], run.summary()["tokens_per_s"]

    def plain_at(ratio: float):   # plain decoding that ran at p / ratio tokens/s
        return SimpleNamespace(summary=lambda: {"tokens_per_s": p / ratio})

    for ratio, word in ((1.31, "faster than"), (1.02, "about as fast as"), (0.97, "about as fast as"),
                        (0.6, "slower than")):
        line = speed_verdict(plain_at(ratio), [("EAGLE, cost-aware (the default)", run)], costs)
        assert line.startswith(f"**Here, now: EAGLE is {word} plain decoding ({ratio:.2f}x at best: cost-aware")
        assert "verifying 16 tokens costs 4.3 plain steps on this server" in line and f"\u03c4 = {tau:.2f}" in line
        assert "\n" not in line
    assert speed_verdict(plain_at(1.0), [], costs) == ""      # nothing timed here: no answer made up


def test_a_typed_knob_value_is_taken_into_the_sliders_range_and_an_empty_box_never_raises():
    """Gradio's slider refuses 10000 typed into steps ("Value 10000 is greater than maximum value 8.") and an
    empty box with a server TypeError; the page's knobs take the nearest end, or their value when built."""
    from eagleviz.app.typed import Knob, WholeNumber

    steps, temperature, seed = Knob(1, 8, 4, step=1), Knob(0.0, 1.5, 0.8, step=0.05), WholeNumber(7, minimum=0,
                                                                                                   precision=0)
    assert [steps.preprocess(v) for v in (10000, -3, 5, None, float("nan"))] == [8, 1, 5, 4, 4]
    assert temperature.preprocess(99.0) == 1.5 and temperature.preprocess(None) == 0.8
    assert seed.preprocess(-5) == 0 and seed.preprocess(None) == 7 and seed.preprocess(12) == 12
    assert steps.get_block_name() == "slider" and seed.get_block_name() == "number"   # drawn as Gradio's own


def test_a_typed_value_runs_as_the_slider_shows_it_and_a_line_says_what_was_changed():
    """2.5 typed into steps runs as 3 (where the slider's thumb shows it), not as 2; a value past an end, an empty
    box or a word: the box set to what runs, and one line naming the knob, what was typed and what is used."""
    from eagleviz.app.typed import Knob, WholeNumber

    steps = Knob(1, 8, 4, step=1, label="steps \u00b7 speculative_num_steps")
    temperature = Knob(0.0, 1.5, 0.8, step=0.05, label="temperature")
    seed = WholeNumber(7, minimum=0, precision=0, label="seed")
    assert [steps.preprocess(v) for v in (2.5, 3.49, 3.5)] == [3, 3, 4]
    assert temperature.preprocess(0.33) == 0.33                     # a fraction of a fractional knob runs as typed
    assert steps.noted(5) == (gr.skip(), "") and temperature.noted(0.33) == (gr.skip(), "")
    value, line = steps.noted(2.5)
    assert value == 3 and line == "\u26a0 steps: 2.5 is not a whole number: 3 is used."
    value, line = steps.noted(10000)
    assert value == 8 and "above the knob's range, which ends at 8: 8 is used" in line
    value, line = steps.noted("")
    assert value == 4 and "empty" in line and "4" in line
    value, line = temperature.noted("abc")
    assert value == 0.8 and line.startswith("\u26a0 temperature: 'abc' is not a number: 0.8 is used")
    assert seed.noted(-5)[0] == 0 and "seed" in seed.noted(-5)[1]


def test_a_control_token_is_labelled_in_words_in_every_view():
    """The quoting preset's recorded run ends on `<|im_end|>`: its tree node, mask row and KV cell read
    "[end]", never the marker cut to a few characters."""
    from eagleviz.app import gallery
    from eagleviz.visuals.style import token_label

    assert (token_label("<|im_end|>"), token_label("</s>"), token_label("<div>")) == ("[end]", "[end]", "<div>")
    run = gallery.load("quoting")
    i = next(k for k, c in enumerate(run.cycles) if "<|im_end|>" in c.texts)
    view = nav.view_values(run, i)
    tree, mask = view[6], view[7]
    labels = [t for trace in tree.data for t in (trace.text or ()) if isinstance(t, str)]
    assert "[end]" in labels and not any("im_e" in t for t in labels)
    ticks = [*(mask.layout.yaxis.ticktext or ()), *(mask.layout.xaxis.ticktext or ())]
    assert not any("im_e" in str(t) for t in ticks)


def test_the_tour_goes_on_into_the_next_cycle_and_back(finished):
    """Past its last stop (rewind) the tour opens the next cycle at its first stop (draft), the whole view
    redrawn; back from the first stop it returns to the previous cycle's rewind."""
    _, run = finished
    assert len(run.cycles) >= 2
    out = nav.tour(run, 0, 3, +1)
    step, text, slider, _, *view = out
    assert step == 0 and "Draft" in text and "(cycle 1)" in text and slider.value == 1
    assert view[1].startswith("**Cycle 1**") and view[3].value == nav.tour_frame(run.cycles[1], 0)
    back = nav.tour(run, 1, 0, -1)
    assert back[0] == 3 and "Rewind" in back[1] and "(cycle 0)" in back[1] and back[2].value == 0
    last = len(run.cycles) - 1
    assert nav.tour(run, last, 3, +1)[2] == gr.skip()        # the run's last cycle: round the same cycle
    assert len(out) == 4 + VIEW_SIZE


def test_the_mask_names_every_row():
    """Plotly's automatic ticks may drop every second row's name on a short panel, the accepted rows among them:
    the mask gives every row as a tick."""
    from eagleviz.app import gallery

    run = gallery.load("counting")
    cycle = nav.instructive_cycle(run)
    mask = nav.view_values(run, cycle)[7]
    assert len(mask.layout.yaxis.tickvals) == run.cycles[cycle].num_tree_tokens == 16
    assert sum("<b>" in t for t in mask.layout.yaxis.ticktext) == len(run.cycles[cycle].path)


def test_compare_b_follows_a_in_the_page_without_a_request(hub):
    """B's knobs copy A's, B's own input lets go and "B = A" follows again, all in the browser: a copy made by the
    server and answered late (a busy server) landed over a value typed into B since."""
    demo = build_app(hub)
    ids = {c.get("props", {}).get("elem_id"): c["id"] for c in demo.config["components"]}
    b = {ids[e] for e in ("b-steps", "b-topk", "b-draft-tokens", "b-temperature", "b-adaptive", "b-source")}
    a = {ids[e] for e in ("steps", "topk", "draft-tokens", "temperature", "adaptive", "draft-source")}
    deps = demo.config["dependencies"]
    writes_b = [d for d in deps if b & set(d["outputs"])]
    own = [d for d in deps if {(t, "input") for t in b} & {tuple(t) for t in d["targets"]}]
    assert len(writes_b) == 2 and len(own) == 1            # the copy and B = A; B's own input writes its note
    for d in writes_b + own:
        assert not d["backend_fn"] and d["js"], d["targets"]
    assert any({(t, "change") for t in a} <= {tuple(t) for t in d["targets"]} for d in writes_b)


def test_the_picture_and_the_handout_are_made_in_the_page_from_the_four_views(hub):
    """The two buttons over the explanations run in the browser (no request: a follower's page and a busy server
    make them alike) and read the four views the page has, under their element ids."""
    from eagleviz.app import handout

    demo = build_app(hub)
    ids = {c.get("props", {}).get("elem_id"): c["id"] for c in demo.config["components"]}
    assert {v for v, _ in handout.VIEWS} <= ids.keys() and {"cycle-slider", "cycle-caption", "summary"} <= ids.keys()
    for button, js in (("picture", handout.PICTURE_JS), ("handout", handout.HANDOUT_JS)):
        (dep,) = [d for d in demo.config["dependencies"] if [ids[button], "click"] in map(list, d["targets"])]
        assert not dep["backend_fn"] and dep["js"] == js and dep["outputs"] == [ids["handout-note"]]


def test_a_picture_pushed_to_a_follower_fires_no_server_event(hub):
    """What the room's stream sets on a follower's page (its views, slider, tour, run) triggers no event with a server
    function: a pushed picture sends nothing back (`workshop.moved` answers a page's own moves, chained after them).
    The fast counterpart of test_class_browser.py's request count (on the views' `.change`, every picture cost every
    follower two requests, one of them queued)."""
    config = build_app(hub).config
    elem = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
    stream = next(d for d in config["dependencies"] if any(t[1] == "change" for t in d["targets"])
                  and "follow-text" in [elem.get(o) for o in d["outputs"]])
    pushed = set(stream["outputs"]) - {o for o in stream["outputs"] if elem.get(o) == "follow-text"}
    fired = [(elem.get(target) or target, d["id"]) for d in config["dependencies"] if d["backend_fn"]
             for target, event in d["targets"] if event == "change" and target in pushed]
    assert len(pushed) > 10 and fired == [], fired
