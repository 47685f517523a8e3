"""Shared fixtures. TRITON_INTERPRET must be set before kernels.tree_attention is imported: Triton reads it
when a kernel is decorated, and the tests run the kernel on CPU tensors in the interpreter."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
# OpenMP threads that sleep instead of spinning: when another process holds a core, spinning threads make
# torch 40-100x slower (docs/performance.md, section 3). Read when OpenMP starts, so before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).parent))
# EAGLEVIZ_CPU=avx2 runs the suite as an AVX2-only CPU would (`kernels.capability`): torch's kernels, oneDNN
# (which then refuses bf16 weight packing, as on such a CPU) and the compiled C operations are held to AVX2.
# Read when torch starts, so set here, before anything imports it.
if os.environ.get("EAGLEVIZ_CPU"):
    from kernels.capability import emulation_environment  # noqa: E402 (imports no torch)

    for _name, _value in emulation_environment(os.environ["EAGLEVIZ_CPU"].strip().lower()).items():
        os.environ.setdefault(_name, _value)
# EAGLEVIZ_TEST_WITHOUT_TRITON=1 runs the suite as on a machine without Triton (it has Linux wheels only:
# a workshop's macOS laptop): importing it fails, the tests marked `triton` skip with a reason, the rest run.
if os.environ.get("EAGLEVIZ_TEST_WITHOUT_TRITON") == "1":
    sys.modules["triton"] = None
    sys.modules["triton.language"] = None

import importlib.util  # noqa: E402

import pytest  # noqa: E402


def _has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except ValueError:  # blocked above: sys.modules["triton"] is None
        return False


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_configure(config):
    """What the suite measures under its own load (price lists, `tune` and `bench` results) must not become this
    machine's: a price list measured while tests run prices a plain step at 4-12x its cost, and `make run`
    would read it afterwards. So the suite runs with EAGLEVIZ_CACHE a fresh folder (inside the user's cache,
    removed at the end) that links in only what is built once, the same for any load: the compiled kernels
    and the unpacked embedded model (unpacked into the user's cache first if it is not there yet)."""
    if os.environ.get("EAGLEVIZ_CACHE_FOR_TESTS"):  # set below: a subprocess of the suite inherits it
        return
    import shutil
    import tempfile
    import time

    from eagleviz.paths import cache_dir

    real = cache_dir()
    (real / "kernels").mkdir(parents=True, exist_ok=True)
    shared = [real / "kernels"]
    try:
        from eagleviz.models.loading import embedded_snapshot

        shared.append(embedded_snapshot())
    except Exception:  # noqa: BLE001 (no embedded model here: the tests that need it say so themselves)
        pass
    for stale in real.glob("tests-*"):  # left by a run that was killed, a day or more ago
        if time.time() - stale.stat().st_mtime > 86400:
            shutil.rmtree(stale, ignore_errors=True)
    fresh = Path(tempfile.mkdtemp(prefix="tests-", dir=real))
    for path in shared:
        (fresh / path.name).symlink_to(path, target_is_directory=True)
    config.add_cleanup(lambda: shutil.rmtree(fresh, ignore_errors=True))
    os.environ["EAGLEVIZ_CACHE"] = os.environ["EAGLEVIZ_CACHE_FOR_TESTS"] = str(fresh)


# What the default run (`make test`, CI) leaves to `make test-slow`, so that it stays near half an hour on a 2-core
# AVX2-only EPYC: the longest end-to-end scenarios, each with a shorter test of the same parts left in the default
# run, and the browser tests' second and third screen sizes where the first exercises the same controls. Seconds
# per test measured there (`pytest --durations=0`, 2026-11-29); ~2,000 s of the default run's ~5,300.
LEFT_TO_SLOW = (
    "test_workshop_browser.py::test_results_appear_where_the_visitor_looks",  # 219 s: a run, a race, slowed clicks
    "test_workshop_browser.py::test_the_queue_notice_counts_only_runs_that_exist_and_goes_when_the_run_is_done",
    "test_workshop_browser.py::test_a_learner_reads_plain_words_not_internals",
    "test_workshop_browser.py::test_an_edited_preset_lets_go_a_click_restores_it_and_an_import_restores_its_settings",
    "test_workshop_browser.py::test_the_figures_fit_the_layout_normal_and_projector",
    "test_workshop_browser.py::test_dark_turns_the_page_and_its_figures_dark_and_a_dark_link_opens_ticked",
    "test_workshop_browser.py::test_race_during_a_run_is_refused_in_plain_words",
    "test_workshop_flow_browser.py::test_a_class_from_preset_to_a_shared_picture",  # 97 s; rooms: test_class_browser
    # a class in the browser (408 s, on a server of its own: on the shared page, after other suites, a follower once
    # waited over 30 s for its instructor's cycle); the rooms' server side is tests/test_workshop.py's, their links
    # and tour tests/test_room_browser.py's
    "test_class_browser.py",
    "test_app_browser.py::test_a_code_answer_keeps_its_line_breaks_and_its_tokens_stay_clickable",
    "test_app_browser.py::test_the_page_at_other_sizes",
    "test_app_browser.py::test_an_output_token_opens_the_cycle_that_committed_it",
    "test_arrival_browser.py::test_word_tokens_keep_their_labels_in_the_mask_the_kv_cache_and_the_path[390-844]",
    "test_arrival_browser.py::test_word_tokens_keep_their_labels_in_the_mask_the_kv_cache_and_the_path[1024-768]",
    "test_arrival_browser.py::test_the_tours_words_are_on_screen_with_the_view_they_describe[1024]",
    "test_room_browser.py::test_the_tour_shows_each_view_it_talks_about_steps_with_the_arrows_and_makes_slides[390-844]",
    "test_room_browser.py::test_the_words_a_learner_meets_link_to_the_glossary[390-844]",
    "test_screens_browser.py::test_the_draft_trees_labels_stay_apart_while_the_phases_play[390-844]",
    "test_screens_browser.py::test_the_kv_cells_keep_legible_labels[story-390-844]",
    "test_screens_browser.py::test_the_kv_cells_keep_legible_labels[counting-390-844]",
    "test_screens_browser.py::test_a_plain_visits_first_screen_shows_the_picture_and_the_line_inviting_run[1024-768]",
    "test_figures_browser.py::test_the_story_presets_accepted_path_at_t_0_8_is_readable",
    "test_handout_browser.py::test_the_handout_is_one_printed_page_of_the_four_views_and_their_explanations[?gallery",
    # the bare machine: gpu-check on random weights and on the bundle stay; the bundle's other commands and the
    # training lease's rehearsal (205 s) are the slow run's
    "test_bare_box.py::test_training_on_a_bare_machine_runs_every_stage_and_resumes",
    "test_bare_box.py::test_tune_runs_on_the_bundle_and_saves_its_tree",
    "test_bare_box.py::test_bench_runs_on_the_bundle_and_writes_its_results_without_a_figure",
    "test_bare_box.py::test_ceiling_runs_on_the_bundle_and_writes_its_results",
    # the large tree's bitwise and MT-bench runs (the chain and the default tree stay; `eagleviz lossless` covers 80
    # prompts, every tree, and tests/test_numerics.py holds it to today's numerics)
    "test_lossless_blocks.py::test_greedy_eagle_is_plain_greedy_decoding_bit_for_bit[large]",
    "test_lossless_smollm.py::test_greedy_eagle_equals_greedy_decoding_on_mtbench[large]",
    "test_cycle_counts.py::test_a_fixed_trees_drafted_cycles_are_counted_after_the_first_and_both_arms_decode_the_same",
    # Triton's interpreter (2026-12-01): an EAGLE-1 head's greedy run on the five-kernel layer (82 s; the EAGLE-3
    # head's, on the same products and its own drafting, stays), an EAGLE-1 run's chunked static prefill (the
    # EAGLE-3 run's stays)
    "test_static.py::test_greedy_eagle_on_the_five_kernel_layer_writes_plain_decodings_tokens[eagle1]",
    "test_static.py::test_a_static_prefill_replays_the_captured_steps_chunk_by_chunk[eagle1]",
)


def _left(name: str, entry: str) -> bool:
    """Whether LEFT_TO_SLOW's `entry` names the test `name` (file::test[params]): a test without parameters names
    all its parameter sets, "[...]" one set, "[..." (unclosed) the sets it starts, and a file all its tests."""
    if entry.endswith(".py"):
        return name.split("::")[0] == entry
    if "[" not in entry:
        return name.split("[")[0] == entry
    return name == entry or (not entry.endswith("]") and name.startswith(entry))


def pytest_itemcollected(item):
    """Marks `slow` what LEFT_TO_SLOW names, before `-m` selects."""
    name = item.nodeid.rsplit("/", 1)[-1]
    if any(_left(name, entry) for entry in LEFT_TO_SLOW):
        item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config, items):
    skips = []
    if not _has_triton():
        skips.append(("triton", pytest.mark.skip(reason="Triton is not installed here (it ships Linux wheels only); "
                                                        "the PyTorch attention paths are tested instead")))
    if any(item.get_closest_marker("cuda") for item in items) and not _has_cuda():
        skips.append(("cuda", pytest.mark.skip(reason="no CUDA GPU is visible to PyTorch here; these tests run "
                                                      "where one is (see docs/gpu-check.md)")))
    for item in items:
        for marker, skip in skips:
            if item.get_closest_marker(marker):
                item.add_marker(skip)


@pytest.fixture
def one_thread():
    """torch on one thread for the test: a tiny model's operations are too small to share, and two sleeping
    threads woken for each (OMP_WAIT_POLICY=PASSIVE above) made a 20,000-run test take 1.3-1.6x as long."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smol_fp32():
    """The embedded SmolLM2-135M-Instruct in fp32 (exact greedy comparisons), loaded once per session."""
    from eagleviz.models.loading import load_target

    return load_target("embedded", dtype="float32")


@pytest.fixture(scope="session")
def smol_engine_fp32(smol_fp32):
    """fp32 engine with the shipped head when present (so acceptance paths are exercised), else a random head."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.draft import load_head, random_head
    from eagleviz.decoding.load import RANDOM_HEAD, default_head

    path = default_head("embedded")
    head = random_head(smol_fp32, seed=0) if path == RANDOM_HEAD else load_head(path, smol_fp32)
    return Engine(smol_fp32, head, path)


@pytest.fixture
def tiny_cli(tmp_path, monkeypatch):
    """`bench` and `tune`'s model loader returns a tiny engine; EAGLEVIZ_CACHE is a fresh directory."""
    import eagleviz.decoding.load as loading
    from tiny import tiny_engine

    monkeypatch.setattr(loading, "load_engine", lambda *args, **kwargs: tiny_engine("llama", vocab=8))
    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture(scope="session")
def app_url():
    """The page served by the embedded SmolLM2 target and the default head, started once for every browser suite:
    each test opens its own tab and makes the runs it needs, so the suites pass alone, together and in any
    order (a suite that needs other settings, or a server of its own, serves its own page)."""
    from servers import embedded_page

    with embedded_page() as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium, launched once for every browser suite (each test opens its own tab)."""
    import playwright.sync_api as playwright_sync

    from servers import CHROMIUM, CHROMIUM_ARGS

    with playwright_sync.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        yield chromium
        chromium.close()
