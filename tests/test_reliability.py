"""A shared server under many users, bad input and faults: concurrent runs stay separate and correct, a burst
is served or refused clearly, hostile uploads and knobs get a message, the server keeps serving, and no
secret reaches a trace."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import resource
import time
from pathlib import Path

import pytest

from eagleviz.errors import UserFacingError
from eagleviz.app.limits import Limits
from eagleviz.app.session import EngineHub, read_trace
from eagleviz.trace import RunTrace
from eagleviz.app import handlers as handlers_mod
from eagleviz.app.handlers import Handlers
from eagleviz.app.ui import as_pairs, build_app
from servers import client, serving
from tiny import tiny_engine

ROOT = Path(__file__).resolve().parents[1]
ARGS = (3, 2, 6, 0.0, 1.0, 12)   # steps, topk, draft_tokens, temperature, top_p, max_new_tokens


@pytest.fixture(scope="module")
def hub():
    return EngineHub(tiny_engine("llama", vocab=8), model_id="tiny")


@pytest.fixture(scope="module")
def server(hub):
    limits = Limits(queue_size=8, max_new_tokens=64)
    with serving(build_app(hub, limits=limits)) as url:
        yield url


def call(url: str, prompt: str, seed: int = 0):
    return client(url).predict(prompt, *ARGS, seed, api_name="/generate")


def test_concurrent_users_get_their_own_correct_runs(server):
    prompts = [f"user {i} asks something" for i in range(4)]
    alone = {p: call(server, p)["output"] for p in prompts}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = dict(zip(prompts, pool.map(lambda p: call(server, p), prompts)))
    for p in prompts:
        assert together[p]["prompt"] == p, "traces must never be mixed"
        assert [t["token"] for t in together[p]["output"]] == [t["token"] for t in alone[p]]


def test_two_model_runs_at_once_give_the_tokens_each_gives_alone(smol_engine_fp32, monkeypatch):
    """EAGLEVIZ_CONCURRENCY=2 lets two runs share one engine at the same moment: the real model and tokenizer,
    two threads, each run's tokens exactly those it produces alone (fp32), and the runs really overlapped. The
    run's clock is off here: with it a sampled run's trees follow how long its cycles take, which a second run
    on the same cores changes, and a sampled run that verifies other candidates draws other tokens (from the
    same distribution); what this checks is that two runs share no state."""
    import threading
    import time

    from eagleviz.app.session import Knobs, generate

    monkeypatch.setattr(smol_engine_fp32, "ledger", False)
    hub = EngineHub(smol_engine_fp32, model_id="embedded")
    jobs = [("Name three fruits.", Knobs(max_new_tokens=24)),
            ("Write a haiku about rain.", Knobs(max_new_tokens=24, temperature=0.8, seed=3))]
    alone = [generate(hub, p, k).token_ids for p, k in jobs]
    spans, results, start = {}, {}, threading.Barrier(2)

    def one(i):
        start.wait()
        t0 = time.perf_counter()
        results[i] = generate(hub, *jobs[i]).token_ids
        spans[i] = (t0, time.perf_counter())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [results[0], results[1]] == alone
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # the two runs overlapped in time


def test_a_server_with_concurrency_2_keeps_runs_separate(hub):
    limits = Limits(queue_size=8, max_new_tokens=64, concurrency=2)
    prompts = [f"user {i} asks something else" for i in range(4)]
    with serving(build_app(hub, limits=limits)) as url:
        alone = {p: call(url, p)["output"] for p in prompts}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = dict(zip(prompts, pool.map(lambda p: call(url, p), prompts)))
    for p in prompts:
        assert together[p]["prompt"] == p
        assert [t["token"] for t in together[p]["output"]] == [t["token"] for t in alone[p]]


def test_a_burst_of_requests_is_served_or_refused_clearly(server):
    """20 requests at once with a queue of 8: each completes or is refused with a message; none hangs."""
    outcomes = []

    def one(i):
        try:
            return "ok" if call(server, f"burst {i}")["output"] else "empty"
        except Exception as exc:  # gradio_client raises on a refused or failed request
            return f"refused: {exc}"

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        outcomes = list(pool.map(one, range(20), timeout=300))
    assert len(outcomes) == 20
    assert outcomes.count("ok") >= 8
    for o in outcomes:
        assert o == "ok" or re.search(r"queue|full|busy|try again", o, re.I), o
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the test process serving the burst: {peak_mb:.0f} MB")
    assert call(server, "still serving?")["output"]


@pytest.mark.parametrize("prompt,message", [
    ("", "empty"), ("   \n", "empty"), ("x" * 100_000, "at most 8,000 characters"),
])
def test_bad_prompts_through_the_api(server, prompt, message):
    with pytest.raises(Exception, match=message):
        call(server, prompt)


@pytest.mark.parametrize("prompt", ["héllo 👋🏽 🦅", "مرحبا بالعالم", "a\u202eb\x00c\x1b[31m\r\n"])
def test_unusual_text_is_decoded_like_any_other(server, prompt):
    assert len(call(server, prompt)["output"]) == 12


@pytest.mark.parametrize("knobs,message", [
    ((0, 2, 6, 0.0, 1.0, 12, 0), "steps"), ((3, 2, 999, 0.0, 1.0, 12, 0), "draft_tokens"),
    ((3, 2, 6, 2.5, 1.0, 12, 0), "temperature"), ((3, 2, 6, 1.0, 0.0, 12, 0), "top_p"),
    ((3, 2, 6, 0.0, 1.0, 100_000, 0), "max_new_tokens"), ((3, 2, 6, 0.0, 1.0, 12, -1), "seed"),
    ((3, 2, 6, 0.0, 1.0, 12, 2**70), "seed"), (("three", 2, 6, 0.0, 1.0, 12, 0), "steps"),
])
def test_knobs_beyond_bounds_through_the_api(server, knobs, message):
    with pytest.raises(Exception, match=message):
        client(server).predict("hi", *knobs, api_name="/generate")


@pytest.mark.parametrize("knobs", [(3, 2, 6, 0.0, 1.0, 1, 0), (3, 2, 6, 2.0, 1.0, 4, 2**62), (3, 2, 6, 1.0, 1.0, 4, 0),
                                   (16, 1, 17, 0.0, 1.0, 4, 0)])
def test_knobs_at_their_bounds_work(server, knobs):
    data = client(server).predict("hi", *knobs, api_name="/generate")
    assert 1 <= len(data["output"]) <= knobs[5]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name,data,message", [
    ("t.json", b"not json at all", "not JSON text"),
    ("t.json", b"\xff\xfe\x00garbage", "UTF-8"),
    ("t.json", b"[" * 100_000 + b"]" * 100_000, "nests"),
    ("t.json", json.dumps({"schema_version": 99}).encode(), "schema"),
    ("../../etc/passwd", b"{}", "schema"),
    ("t.json", json.dumps({"schema_version": 1, "prompt": 5}).encode(), "prompt"),
])
def test_hostile_uploads_are_refused_as_data(tmp_path, name, data, message):
    path = tmp_path / "up" / Path(name).name
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(UserFacingError, match=message):
        read_trace(path)


def test_an_oversized_upload_is_refused_before_parsing(tmp_path):
    path = write(tmp_path, "big.json", b" " * (2 * 2**20))
    with pytest.raises(UserFacingError, match="limited to 1 MB on this server"):
        read_trace(path, Limits(max_upload_mb=1))


def test_handler_errors_are_messages_and_the_next_request_works(hub):
    h = Handlers(as_pairs(hub), Limits(max_prompt_chars=50))
    with pytest.raises(Exception, match="at most 50 characters"):
        h.api_generate("y" * 51, *ARGS, 0)
    assert RunTrace.from_dict(h.api_generate("fine", *ARGS, 0)).output


def test_run_time_limit_keeps_the_partial_trace(hub):
    from eagleviz.app.session import Knobs, stream_run

    ticks = iter(range(0, 10_000, 50))
    runs = list(stream_run(hub, "slow", Knobs(3, 2, 6, max_new_tokens=60), Limits(max_run_seconds=100),
                           clock=lambda: next(ticks)))
    run = runs[-1][0]
    assert "time limit of 100 s" in run.stop_reason and 0 < len(run.output) < 60


def test_never_trust_remote_code():
    hits = [f"{p}:{i}" for p in (ROOT / "eagleviz").rglob("*.py") for i, line in enumerate(p.read_text().splitlines())
            if re.search(r"trust_remote_code\s*=\s*True", line)]
    assert not hits


def test_no_secret_reaches_a_trace(hub, monkeypatch):
    secret = "hf_" + "S3cr3tT0k3nValue1234567890"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", secret)
    data = Handlers(as_pairs(hub)).api_generate("what is my token?", *ARGS, 0)
    assert secret not in json.dumps(data) and secret not in str(os.environ.get("EAGLEVIZ_CACHE", ""))


def test_hub_download_without_network_is_actionable(monkeypatch):
    from eagleviz.models.loading import load_target

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserFacingError, match="network|offline"):
        load_target("someone/not-a-cached-model")


def test_the_concurrency_measurement_speaks_the_pages_protocol(server):
    """scripts/measure_concurrency.py's browser-like clients (queue join, the tab's event stream, diffs applied)
    against a live page: every visitor's first figures arrive before its run is done, and nothing is lost."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure_concurrency", ROOT / "scripts" / "measure_concurrency.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.measure(server, users=3, tokens=8, server_pid=os.getpid())
    assert result["done"] == 3 and result["lost"] == 0, result["rows"]
    for row in result["rows"]:
        assert 0 < row["first_s"] <= row["done_s"] and row["tokens"] == 8, row
    assert result["server_cpu_s"] is not None and result["clients_cpu_s"] >= 0


def test_the_concurrency_measurement_runs_whole_and_logs_the_servers_steps(server, tmp_path, capsys):
    """scripts/measure_concurrency.py run whole against a page already up (--url, --out), then measured under
    `traced` (what the server --trace starts runs under, here around this process's page): each model step and
    each run's first logged, and summarised in server_log."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure_concurrency", ROOT / "scripts" / "measure_concurrency.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--url", server, "--users", "2", "--tokens", "6", "--out", str(tmp_path / "result.json")])
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["done"] == 2 and result["lost"] == 0 and result["active_runs"] == "server default"
    assert json.loads(capsys.readouterr().out) == result
    with script.traced(tmp_path / "trace"):
        result = script.measure(server, users=2, tokens=6, trace=tmp_path / "trace")
    log = result["server_log"]
    assert result["done"] == 2 and log["steps"] >= 2 and log["first_steps_s"]["max"] > 0, log
    assert log["last_first_step_ends_s"] is not None
    assert len((tmp_path / "trace" / "steps.jsonl").read_text().splitlines()) == log["steps"]  # all in the window


def test_visitors_asking_for_one_run_at_once_are_served_one_run_and_distinct_ones_their_own(server, tmp_path,
                                                                                            monkeypatch):
    """scripts/measure_concurrency.py with every visitor on one preset: the server decodes one run for all three
    (one first step in its log, `eagleviz/app/shared.py`), each visitor's page streamed it whole; with --distinct
    each visitor's prompt is its own and three runs are decoded."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure_concurrency", ROOT / "scripts" / "measure_concurrency.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "mix", lambda: [("one", "the same question", (3, 1, 4), 0.0, False, "eagle")])
    real = handlers_mod.stream_run

    def slow(*args, **kwargs):  # each event 0.2 s later: a run lasts while the three requests arrive
        for event in real(*args, **kwargs):
            time.sleep(0.2)
            yield event

    monkeypatch.setattr(handlers_mod, "stream_run", slow)
    for distinct, runs in ((False, 1), (True, 3)):
        trace = tmp_path / f"trace-{distinct}"
        with script.traced(trace):
            result = script.measure(server, users=3, tokens=6, trace=trace, distinct=distinct)
        firsts = [row for row in map(json.loads, (trace / "steps.jsonl").read_text().splitlines()) if row["first"]]
        assert result["done"] == 3 and result["distinct"] is distinct and len(firsts) == runs, result["rows"]
        assert all(row["tokens"] == 6 for row in result["rows"])


def test_the_server_log_summary_counts_only_the_measured_window(tmp_path):
    """scripts/measure_concurrency.py --trace: steps and full collections from the measurement's start on."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("measure_concurrency", ROOT / "scripts" / "measure_concurrency.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    steps = [{"end": 9.0, "wall": 1.0, "cpu": 1.0, "first": True},            # before the window: left out
             {"end": 10.2, "wall": 0.2, "cpu": 0.1, "first": True},
             {"end": 10.5, "wall": 0.3, "cpu": 0.3, "first": False}]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (tmp_path / "gc.jsonl").write_text(json.dumps({"generation": 2, "start": 10.1, "seconds": 0.3}) + "\n"
                                       + json.dumps({"generation": 1, "start": 10.3, "seconds": 0.01}) + "\n")
    log = script.server_log(tmp_path, since=10.0)
    assert (log["steps"], log["steps_wall_s"], log["steps_cpu_s"], log["steps_span_s"]) == (2, 0.5, 0.4, 0.5)
    assert log["first_steps_s"]["max"] == 0.2 and log["last_first_step_ends_s"] == 0.2
    assert log["full_collections"] == [{"at_s": 0.1, "ms": 300}]
