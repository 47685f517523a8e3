#!/usr/bin/env python3
"""Where eagleviz's CUDA decode time goes: one short, self-limiting profiling run (< 120 s on an H100).

    cd <project checkout root>
    python scripts/profile_gpu.py BUNDLE_DIR OUT_DIR          # a bundle from `export-bundle`
    python scripts/profile_gpu.py random OUT_DIR              # seeded random weights, no files needed
    python scripts/profile_gpu.py --tiny-cpu - OUT_DIR        # CPU dry run of every section (tiny model, seconds)

Needs torch, triton, transformers (numpy); not gradio, plotly, gguf or accelerate. Loads the target and
head the way `gpu-check --model BUNDLE` does (eagleviz.models.loading.load_target, the bundle's head,
its hot vocabulary) but builds the Engine directly, so no cost list is measured (a fixed tree needs none).

Sections (each in try/except; the report is rewritten after every section, so a timeout keeps what ran):
  env          GPU, torch/CUDA/cuDNN/Triton versions, SDPA backend switches
  load         target + head, engines with attention 'triton' and 'torch'
  warmup       one short plain and one EAGLE run per attention (Triton compiles here)
  timing       (a) plain 64 tokens and EAGLE (fixed 5/4/16, as gpu-check's bench) with Triton, twice;
               with PyTorch attention once, and EAGLE again with cuDNN SDPA switched off (tests whether
               the 128 ms draft phase is cuDNN building a graph per new sequence length)
  sdpa         micro-benchmark of the engine's SDPA call: first call at each new KV length vs a repeat,
               cuDNN on/off, and which SDPA backends accept the draft/verify shapes
  profile_*    (b) torch.profiler over a plain decode of 32 tokens (its prefill and first token outside the
               profiler; Triton, and 16 tokens with PyTorch attention) and over 10 EAGLE
               cycles: key_averages tables (self CPU, CUDA; top 40) as text; (c) kernel launches,
               cudaMemcpy*/cudaStreamSynchronize/cudaEventSynchronize per token, aten ops per token,
               GPU busy time per token
  syncs        (c) host-device synchronisations per token/cycle by source line (torch sync debug mode)
  triton       (d) compilations: every compile (kernel, phase, ms, specialisation signature) through
               triton.knobs hooks, kernel-cache entries per phase, Triton's disk cache
Outputs in OUT_DIR: report.json, *_by_self_cpu.txt, *_by_cuda.txt, trace_*.json.gz, progress on stdout.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import platform
import re
import shutil
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

T0 = time.perf_counter()
HARD_LIMIT_S = 115          # SIGALRM: whatever runs then is interrupted, the report is still written
START_LIMIT_S = 100         # no new section starts after this
PROMPT_FALLBACK = "Write a Python function that returns the factorial of n, with a docstring."
PHASE = ["startup"]         # the section running (Triton compile events are tagged with it)
COMPILES: list[dict] = []


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def elapsed() -> float:
    return time.perf_counter() - T0


class Budget(Exception):
    pass


def _alarm(signum, frame):
    raise Budget(f"hard time limit {HARD_LIMIT_S}s reached")


# ------------------------------------------------------------------------------------------ triton

def install_triton_hooks() -> str:
    """Record every Triton JIT compile (cache miss in this process) with its duration and signature."""
    try:
        from triton import knobs
    except Exception as exc:  # Triton < 3.4 has no knobs: the cache sizes still tell how many variants
        return f"no triton.knobs ({exc.__class__.__name__}); compile events not recorded"
    started: dict = {}
    prev_pre, prev_post = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

    def pre(*args, **kw):
        started[id(kw.get("key"))] = time.perf_counter()
        return prev_pre(*args, **kw) if prev_pre else None  # None: compile (a truthy return skips it)

    def post(*args, **kw):
        t = started.pop(id(kw.get("key")), None)
        fn = kw.get("fn")
        COMPILES.append({"kernel": getattr(fn, "name", str(fn)), "phase": PHASE[0],
                         "at_s": round(elapsed(), 2),
                         "ms": None if t is None else round((time.perf_counter() - t) * 1e3, 1),
                         "signature": str(kw.get("repr", ""))[:700]})
        return prev_post(*args, **kw) if prev_post else None

    knobs.runtime.jit_cache_hook = pre
    knobs.runtime.jit_post_compile_hook = post
    return "triton.knobs hooks installed"


def _jit_cache_size(fn) -> int | None:
    caches = getattr(fn, "device_caches", None)
    if caches is not None:  # Triton 3.x: device -> (kernel_cache, ..., binder)
        return sum(len(v[0]) for v in list(caches.values()) if isinstance(v, tuple) and v and isinstance(v[0], dict))
    cache = getattr(fn, "cache", None)
    if isinstance(cache, dict):
        return sum(len(c) for c in cache.values() if isinstance(c, dict))
    return None


def triton_cache_sizes() -> dict:
    try:
        from kernels import tree_attention as ta
    except Exception as exc:
        return {"error": repr(exc)}
    return {name: _jit_cache_size(getattr(ta, name, None))
            for name in ("_tree_attention_kernel", "_merge_splits_kernel")}


def triton_disk_cache() -> dict:
    root = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    try:
        return {"dir": str(root), "entries": sum(1 for _ in root.iterdir()) if root.is_dir() else 0}
    except OSError as exc:
        return {"dir": str(root), "error": repr(exc)}


# ------------------------------------------------------------------------------------------ helpers

def sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_summary(run) -> dict:
    s = run.summary()
    decode_s = run.wall_s - run.prefill_ms / 1e3
    n = len(run.output)
    out = {"tokens": n, "tokens_per_s": round(s["tokens_per_s"], 2), "wall_s": round(run.wall_s, 3),
           "prefill_ms": round(run.prefill_ms, 2),
           "decode_tokens_per_s": round((n - 1) / decode_s, 2) if decode_s > 0 and n > 1 else None,
           "ms_per_token_after_prefill": round(decode_s * 1e3 / max(n - 1, 1), 2),
           "stop_reason": run.stop_reason, "attn_impl": run.attn_impl}
    if run.cycles:
        out |= {"cycles": s["num_cycles"], "tau": round(s["tau"], 3),
                "mean_phase_ms": {k: round(v, 3) for k, v in s["mean_phase_ms"].items()},
                "mean_cycle_ms": round(decode_s * 1e3 / max(len(run.cycles), 1), 2)}
    return out


def sort_key_cuda(table_fn) -> str | None:
    for key in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        try:
            table_fn(sort_by=key, row_limit=1)
            return key
        except Exception:
            continue
    return None


def write_tables(ka, out_dir: Path, tag: str) -> dict:
    files = {}
    for label, key in (("by_self_cpu", "self_cpu_time_total"), ("by_cuda", sort_key_cuda(ka.table))):
        if key is None:
            continue
        try:
            text = ka.table(sort_by=key, row_limit=40, max_name_column_width=90)
        except TypeError:
            text = ka.table(sort_by=key, row_limit=40)
        path = out_dir / f"{tag}_{label}.txt"
        path.write_text(f"# {tag}: key_averages sorted by {key}, top 40\n{text}\n")
        files[label] = path.name
    return files


def event_counts(ka, steps: int, tokens: int, region_s: float) -> dict:
    """Per step (token or cycle) and per token: runtime/driver API calls (launches, copies, syncs), device
    kernels and their time, aten ops, Triton kernel launches."""
    api, kernels, copies, aten = {}, {}, {}, collections.Counter()
    kernel_count = kernel_us = 0
    for e in ka:
        name = e.key
        dev_type = str(getattr(e, "device_type", ""))
        self_dev = getattr(e, "self_device_time_total", None)
        if self_dev is None:
            self_dev = getattr(e, "self_cuda_time_total", 0.0)
        if "CUDA" in dev_type or "PrivateUse" in dev_type:
            if name.startswith(("Memcpy", "Memset")):
                copies[name] = {"count": e.count, "per_token": round(e.count / max(tokens, 1), 2)}
            else:
                kernel_count += e.count
                kernel_us += self_dev
                kernels[name[:120]] = (e.count, self_dev)
        elif re.match(r"^cu[A-Z]", name) or name.startswith("cuda"):
            api[name] = {"count": e.count, "per_token": round(e.count / max(tokens, 1), 2),
                         "per_step": round(e.count / max(steps, 1), 2),
                         "cpu_ms_total": round(e.cpu_time_total / 1e3, 2)}
        elif name.startswith("aten::"):
            aten[name] = e.count
    launches = sum(v["count"] for k, v in api.items() if "LaunchKernel" in k)
    syncs = {k: v for k, v in api.items() if "Synchronize" in k or k in ("cudaMemcpy", "cuMemcpyDtoH_v2")}
    top_kernels = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:15]
    triton = {k: c for k, (c, _) in kernels.items() if "tree_attention" in k or "merge_splits" in k}
    return {
        "steps": steps, "tokens": tokens, "region_wall_ms_per_token_profiled": round(region_s * 1e3 / max(tokens, 1), 2),
        "kernel_launch_api_calls_per_token": round(launches / max(tokens, 1), 1),
        "device_kernels_per_token": round(kernel_count / max(tokens, 1), 1),
        "gpu_kernel_ms_per_token": round(kernel_us / 1e3 / max(tokens, 1), 3),
        "gpu_busy_fraction_of_profiled_wall": round(kernel_us / 1e6 / region_s, 4) if region_s > 0 else None,
        "aten_ops_per_token_incl_nested": round(sum(aten.values()) / max(tokens, 1), 1),
        "top_aten_per_token": {k: round(v / max(tokens, 1), 1) for k, v in aten.most_common(15)},
        "sync_api_calls": syncs, "api_calls": api, "device_copies": copies,
        "triton_kernels_per_token": {k: round(c / max(tokens, 1), 2) for k, c in triton.items()},
        "top_kernels_by_time": [{"kernel": k, "count": c, "us_total": round(t, 1)} for k, (c, t) in top_kernels],
    }


def profile_steps(torch, engine, make_iter, n_steps: int, tokens_of, out_dir: Path, tag: str, dev,
                  trace: bool = False) -> dict:
    """Advance a decode generator once outside the profiler (prefill, and for EAGLE the first cycle), then
    profile the next n_steps; each step is marked by record_function('eagleviz.step')."""
    from torch.profiler import ProfilerActivity, profile, record_function

    it, run = make_iter()
    next(it)  # prefill (+ first token / cycle): not profiled
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    before = tokens_of(run)
    steps = 0
    sync(torch, dev)
    with profile(activities=acts, record_shapes=False, with_stack=False) as prof:
        t = time.perf_counter()
        for _ in range(n_steps):
            with record_function("eagleviz.step"):
                try:
                    next(it)
                except StopIteration:
                    break
            steps += 1
        sync(torch, dev)
        region = time.perf_counter() - t
    tokens = tokens_of(run) - before
    for _ in it:  # finish the run outside the profiler
        pass
    t = time.perf_counter()
    ka = prof.key_averages()  # once: on ~10^5 events this takes seconds
    result = {"files": write_tables(ka, out_dir, tag)}
    result |= event_counts(ka, steps, tokens, region)
    result["postprocess_s"] = round(time.perf_counter() - t, 2)
    if trace and elapsed() < START_LIMIT_S - 15:
        try:
            raw = out_dir / f"trace_{tag}.json"
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
            result["files"]["chrome_trace"] = raw.name + ".gz"
        except Exception as exc:
            result["trace_error"] = repr(exc)
    return result


def count_syncs(torch, fn, dev) -> dict:
    """Synchronising CUDA calls made by fn, grouped by the Python line that made them (torch's sync debug
    mode warns at each: .item(), .tolist(), .cpu(), int(t), blocking copies, stream/device syncs)."""
    if dev.type != "cuda":
        return {"skipped": "sync debug mode needs CUDA"}
    caught = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            units = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter()
    root = os.getcwd()
    for w in caught:
        if "synchroniz" not in str(w.message).lower():
            continue
        sites[f"{os.path.relpath(w.filename, root) if w.filename.startswith(root) else w.filename}:{w.lineno}"] += 1
    total, n = sum(sites.values()), max(units["n"], 1)
    return {"units": units, "total": total, "per_unit": round(total / n, 2),
            "by_site_per_unit": {k: round(v / n, 2) for k, v in sites.most_common(20)}}


# ------------------------------------------------------------------------------------------ loading

def load_engines(torch, model: str, tiny_cpu: bool, device: str = "cuda"):
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.draft import load_head, random_head

    if tiny_cpu:  # the dry run: a 2-layer random model of SmolLM2's layout, narrow, on the CPU, PyTorch attention
        from eagleviz.models.synthetic import EMBEDDED_SHAPE, CharTokenizer, random_hf_model
        from eagleviz.models.target import TargetModel

        shape = EMBEDDED_SHAPE | {"num_hidden_layers": 2, "vocab_size": 512, "tie_word_embeddings": False,
                                  "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "head_dim": 16, "initializer_range": 0.03}
        target = TargetModel(random_hf_model(shape, 0, torch.float32), CharTokenizer(), "tiny random (CPU dry run)",
                             pack=False, kv_dtype=torch.float32, fused=False)
        engine = Engine(target, random_head(target, "eagle1"), "random", "torch", pack=False,
                        compiled_sampling=False)
        return {"torch": engine}, {"model": target.name}

    from eagleviz.decoding import calibration
    from eagleviz.decoding.load import RANDOM_HEAD, _hot_vocabulary, default_head
    from eagleviz.models.loading import load_target
    from eagleviz.models.synthetic import RANDOM_MODEL

    target = load_target(model, "bfloat16", device, "model")  # as gpu-check's engines(): kv_dtype "model"
    head = default_head(model)
    arch = "eagle3" if model == RANDOM_MODEL else "eagle1"
    draft = random_head(target, arch) if head == RANDOM_HEAD else load_head(head, target)
    name = "random (untrained)" if head == RANDOM_HEAD else Path(head).name
    head_dir = None if head == RANDOM_HEAD else Path(head)
    draft, name = _hot_vocabulary(draft, name, head_dir, None)
    engine = Engine(target, draft, name, "triton", calibration=calibration.read(head_dir, target.weights))
    engines = {"triton": engine, "torch": engine.with_attention("torch")}
    info = {"model": target.name, "head": name, "head_arch": draft.config.arch, "dtype": str(target.dtype),
            "kv_dtype": str(target.kv_dtype), "weights": target.weights, "layers": target.num_layers,
            "notes": list(engine.notes)}
    return engines, info


def pick_prompt(model: str) -> str:
    path = Path(model) / "prompts" / "mtbench.jsonl"
    try:
        if path.is_file():
            row = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
            return row["prompt"] if "prompt" in row else row["turns"][0]
    except Exception:
        pass
    return PROMPT_FALLBACK


# ------------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="bundle directory (export-bundle), 'random', or '-' with --tiny-cpu")
    p.add_argument("out", type=Path)
    p.add_argument("--tiny-cpu", action="store_true", help="CPU dry run on a tiny 2-layer random model")
    p.add_argument("--no-trace", action="store_true", help="skip the (gzipped) Chrome traces")
    args = p.parse_args(argv)
    sys.path.insert(0, os.getcwd())  # run from the project checkout root
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"command": " ".join(sys.argv), "cwd": os.getcwd()}
    report_path = args.out / "report.json"

    def save():
        report["elapsed_s"] = round(elapsed(), 1)
        report["triton_compiles"] = COMPILES
        report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")

    log("importing torch")
    import torch

    if not args.tiny_cpu and not torch.cuda.is_available():
        msg = (f"no CUDA GPU visible (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
               "run on a GPU machine, or --tiny-cpu for a CPU dry run of the script")
        report["error"] = msg
        save()
        print(f"profile_gpu: {msg}", file=sys.stderr)
        return 2
    dev = torch.device("cpu" if args.tiny_cpu else "cuda")
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(max(1, int(HARD_LIMIT_S - elapsed())))  # counted from the script's start
    report["triton_hooks"] = install_triton_hooks()

    def section(name: str, fn, reserve_s: float = 0.0):
        if elapsed() > START_LIMIT_S - reserve_s:
            report[name] = {"skipped": f"time budget ({elapsed():.0f}s elapsed)"}
            log(f"{name}: skipped (time)")
            save()
            return None
        PHASE[0] = name
        log(f"{name} ...")
        t = time.perf_counter()
        before = len(COMPILES)
        try:
            result = fn()
        except BaseException as exc:  # Budget, CUDA errors, OOM: record and go on
            if isinstance(exc, KeyboardInterrupt):
                raise
            result = {"error": f"{exc.__class__.__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        if isinstance(result, dict):
            result["_seconds"] = round(time.perf_counter() - t, 2)
            result["_triton_compiles_in_section"] = len(COMPILES) - before
            result["_triton_cache_entries_after"] = triton_cache_sizes()
        report[name] = result
        save()
        log(f"{name}: done in {time.perf_counter() - t:.1f}s"
            + (f" ({result['error']})" if isinstance(result, dict) and "error" in result else ""))
        return result

    # -- env
    def env():
        info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                "host_cpus": os.cpu_count(), "triton_disk_cache": triton_disk_cache()}
        try:
            import triton
            info["triton"] = triton.__version__
        except Exception as exc:
            info["triton"] = repr(exc)
        try:
            info["cpu"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
        except OSError:
            pass
        if dev.type == "cuda":
            props = torch.cuda.get_device_properties(dev)
            info |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                     "sms": props.multi_processor_count,
                     "sdpa_enabled": {b: getattr(torch.backends.cuda, f"{b}_sdp_enabled")()
                                      for b in ("flash", "mem_efficient", "math", "cudnn")
                                      if hasattr(torch.backends.cuda, f"{b}_sdp_enabled")},
                     "TORCH_CUDNN_SDPA_DEPRIORITIZED": os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED")}
        return info

    section("env", env)

    # -- load
    state: dict = {}

    def load():
        t = time.perf_counter()
        engines, info = load_engines(torch, args.bundle, args.tiny_cpu)
        sync(torch, dev)
        state["engines"] = engines
        state["prompt"] = "List three colours." if args.tiny_cpu else pick_prompt(args.bundle)
        return info | {"load_s": round(time.perf_counter() - t, 2), "prompt": state["prompt"][:200],
                       "engines": list(engines)}

    section("load", load)
    if "engines" not in state:
        log("load failed: nothing else can run")
        save()
        return 1

    from eagleviz.config import SamplingConfig, TreeConfig

    engines = state["engines"]
    prompt = state["prompt"]
    tree = TreeConfig.create(adaptive=False)  # gpu-check's bench tree: 5 steps, topk 4, 16 draft tokens
    scale = 8 if args.tiny_cpu else 1         # the dry run decodes a few tokens only

    def gen(engine, n, use_tree):
        run = engine.generate(prompt, tree if use_tree else None, SamplingConfig(max_new_tokens=max(2, n // scale)))
        sync(torch, dev)
        return run

    # -- warm-up (Triton compiles its variants here; cuDNN builds its first graphs)
    def warmup():
        out = {}
        for impl, engine in engines.items():
            t = time.perf_counter()
            gen(engine, 16, False)
            gen(engine, 24, True)
            out[impl] = {"s": round(time.perf_counter() - t, 2)}
        return out

    section("warmup", warmup)

    # -- (a) timing
    def timing():
        out = {}
        if "triton" in engines:
            e = engines["triton"]
            out["triton_plain"] = [run_summary(gen(e, 64, False)) for _ in range(2)]
            out["triton_eagle"] = [run_summary(gen(e, 64, True)) for _ in range(2)]
        e = engines["torch"]
        out["torch_plain"] = run_summary(gen(e, 64, False))
        out["torch_eagle"] = run_summary(gen(e, 64, True))
        if dev.type == "cuda" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            was = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
            try:
                gen(e, 8, True)  # warm the fallback backend
                out["torch_eagle_cudnn_sdp_off"] = run_summary(gen(e, 64, True))
                out["torch_plain_cudnn_sdp_off"] = run_summary(gen(e, 32, False))
            finally:
                torch.backends.cuda.enable_cudnn_sdp(was)
        return out

    section("timing", timing, reserve_s=15)

    # -- (b, c) profiles
    def plain_iter(engine, n):
        def make():
            ids = engine.encode_prompt(prompt)
            sampling = SamplingConfig(max_new_tokens=n + 2)
            run = engine.new_run(prompt, ids, None, sampling)
            return engine.plain(ids, sampling, run), run
        return make

    def eagle_iter(engine, n):
        def make():
            ids = engine.encode_prompt(prompt)
            sampling = SamplingConfig(max_new_tokens=n + 24 // scale)
            run = engine.new_run(prompt, ids, tree, sampling)
            return engine.speculate(ids, tree, sampling, run), run
        return make

    tokens_of = lambda run: len(run.output)  # noqa: E731
    main_impl = "triton" if "triton" in engines else "torch"
    n_plain = max(2, 32 // scale)
    section("profile_plain_" + main_impl, lambda: profile_steps(
        torch, engines[main_impl], plain_iter(engines[main_impl], n_plain), n_plain, tokens_of, args.out,
        f"plain_{main_impl}", dev), reserve_s=15)

    # -- (c) syncs by source line
    def syncs():
        engine = engines[main_impl]
        out = {}

        def plain_run():
            run = gen(engine, 32, False)
            return {"n": len(run.output) - 1, "unit": "token after the prefill (the prefill's own read included)"}

        def eagle_run():
            run = gen(engine, 32, True)
            return {"n": len(run.cycles), "unit": "cycle", "tokens": len(run.output)}

        out["plain"] = count_syncs(torch, plain_run, dev)
        out["eagle"] = count_syncs(torch, eagle_run, dev)
        return out

    section("syncs", syncs, reserve_s=10)

    # -- host cost per call on this machine (enqueue only vs with a sync), and a whole one-token forward
    def host_overhead():
        from eagleviz.decoding.drafting import causal
        from kernels import tree_attention as ta

        target = engines[main_impl].target

        def per_call(fn, n):
            fn()
            sync(torch, dev)
            t = time.perf_counter()
            for _ in range(n):
                fn()
            host = time.perf_counter() - t
            sync(torch, dev)
            total = time.perf_counter() - t
            return {"host_us": round(host / n * 1e6, 1), "until_done_us": round(total / n * 1e6, 1)}

        out = {}
        x = torch.zeros(576, device=dev, dtype=target.kv_dtype)
        out["one_tiny_op_add_"] = per_call(lambda: x.add_(1.0), 500)
        hkv, hq, d, n = target.num_kv_heads, target.num_heads, target.head_dim, 300
        q = torch.randn(1, hq, d, device=dev, dtype=target.kv_dtype)
        kc = torch.randn(hkv, 1024, d, device=dev, dtype=target.kv_dtype)
        k = kc[:, :n].transpose(0, 1)
        out["attention_torch_t1"] = per_call(lambda: ta.tree_attention_torch(q, k, k, n, None, d ** -0.5), 200)
        if dev.type == "cuda" and ta.tl is not None:
            out["attention_triton_t1"] = per_call(lambda: ta.tree_attention_triton(q, k, k, n, None, d ** -0.5), 200)
            m16 = torch.ones(16, 16, dtype=torch.bool, device=dev).tril()
            out["pack_mask_bits_16"] = per_call(lambda: ta.pack_mask_bits(m16), 200)
        cache = target.new_cache(1024)
        ids = torch.arange(300, device=dev) % target.vocab_size
        with torch.inference_mode():
            target.forward(ids, torch.arange(300, device=dev), cache, causal(300, dev), logit_rows=None,
                           impl=main_impl)
        tok, pos = torch.tensor([7], device=dev), torch.tensor([300], device=dev)

        def fwd1():
            cache.length = 300
            return target.forward(tok, pos, cache, None, impl=main_impl)

        out[f"target_forward_t1_{main_impl}"] = per_call(fwd1, 20 if dev.type == "cuda" else 3)
        out["note"] = ("host_us ~= until_done_us means the host (Python + dispatch + launches) is the bottleneck; "
                       "one_tiny_op_add_ is this host's floor per eager op")
        return out

    section("host_overhead", host_overhead, reserve_s=10)

    # -- what CUDA graphs would give for the same kernels: capture one forward at a fixed cache length, replay it
    def graph_floor():
        if dev.type != "cuda":
            return {"skipped": "CUDA only"}
        from eagleviz.decoding.drafting import causal

        out = {}
        for impl in [i for i in ("triton", "torch") if i in engines]:
            target = engines[impl].target
            for t in (1, 16):
                label = f"{impl}_t{t}"
                try:
                    cache = target.new_cache(1024)
                    with torch.inference_mode():
                        ids = torch.arange(300, device=dev) % target.vocab_size
                        target.forward(ids, torch.arange(300, device=dev), cache, causal(300, dev),
                                       logit_rows=None, impl=impl)
                    tok = torch.arange(t, device=dev) + 11
                    pos = torch.arange(300, 300 + t, device=dev)
                    mask = None if t == 1 else causal(t, dev)

                    def step():
                        cache.length = 300
                        return target.forward(tok, pos, cache, mask, impl=impl).logits

                    def timed(fn, n):
                        sync(torch, dev)
                        s0 = time.perf_counter()
                        for _ in range(n):
                            fn()
                        sync(torch, dev)
                        return (time.perf_counter() - s0) / n * 1e3

                    step()  # a first call at this shape (cuDNN builds its graph here, if it is chosen)
                    eager_ms = timed(step, 10)
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(3):
                            step()
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        static_logits = step()
                    replay_ms = timed(graph.replay, 50)
                    ref = step().float()
                    graph.replay()
                    sync(torch, dev)
                    diff = (static_logits.float() - ref).abs().max().item()
                    out[label] = {"eager_ms": round(eager_ms, 3), "graph_replay_ms": round(replay_ms, 4),
                                  "speedup": round(eager_ms / replay_ms, 1), "max_abs_logit_diff": diff}
                except Exception as exc:
                    out[label] = {"error": f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:300]}"}
                    torch.cuda.synchronize()
        out["note"] = ("a forward at a fixed cache length captured as a CUDA graph: replay time is the floor the "
                       "same kernels reach without host overhead (not a usable decoder: positions are fixed)")
        return out

    section("graph_floor", graph_floor, reserve_s=10)

    section("profile_eagle_" + main_impl, lambda: profile_steps(
        torch, engines[main_impl], eagle_iter(engines[main_impl], 32), max(2, 10 // scale), tokens_of, args.out,
        f"eagle_{main_impl}", dev), reserve_s=15)

    # -- SDPA micro-benchmark: the engine's own call (kernels.tree_attention.tree_attention_torch) on cache views
    def sdpa():
        if dev.type != "cuda":
            return {"skipped": "CUDA only"}
        from kernels.tree_attention import tree_attention_torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        hq, hkv, d, cap = 9, 3, 64, 2048
        kc = torch.randn(hkv, cap, d, device=dev, dtype=torch.bfloat16)
        vc = torch.randn(hkv, cap, d, device=dev, dtype=torch.bfloat16)

        def call(tq, n, masked):
            qkv = torch.randn(tq, (hq + 2 * hkv) * d, device=dev, dtype=torch.bfloat16)
            q = qkv[:, : hq * d].view(tq, hq, d)  # a view of a fused projection, as the engine's q is
            k, v = kc[:, :n].transpose(0, 1), vc[:, :n].transpose(0, 1)
            mask = torch.ones(tq, tq, dtype=torch.bool, device=dev).tril() if masked else None
            sync(torch, dev)
            t = time.perf_counter()
            tree_attention_torch(q, k, v, n - tq if masked else n, mask, d ** -0.5)
            sync(torch, dev)
            return (time.perf_counter() - t) * 1e3

        out = {}
        try:
            out["priority_order"] = [str(b) for b in torch._C._get_sdp_priority_order()]
        except Exception as exc:
            out["priority_order"] = f"unavailable ({exc.__class__.__name__})"
        accepts = {}
        for label, tq, masked in (("decode_t1_nomask", 1, False), ("draft_t4_mask", 4, True),
                                  ("verify_t16_mask", 16, True)):
            accepts[label] = {}
            for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
                if not hasattr(SDPBackend, b):
                    continue
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        with sdpa_kernel([getattr(SDPBackend, b)]):
                            call(tq, 300, masked)
                    accepts[label][b] = True
                except Exception as exc:
                    accepts[label][b] = f"no: {str(exc).splitlines()[0][:120]}"
        out["backend_accepts"] = accepts
        was = torch.backends.cuda.cudnn_sdp_enabled()
        for cudnn in (True, False):
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            try:
                for label, tq, masked in (("decode_t1_nomask", 1, False), ("draft_t4_mask", 4, True),
                                          ("verify_t16_mask", 16, True)):
                    new = [round(call(tq, n, masked), 3) for n in (401, 433, 466, 497, 530)]  # new KV lengths
                    same = [round(call(tq, 530, masked), 3) for _ in range(3)]                # a repeated one
                    out[f"{label}_cudnn_{'on' if cudnn else 'off'}_ms"] = {"new_lengths": new, "repeat": same}
            finally:
                torch.backends.cuda.enable_cudnn_sdp(was)
        return out

    section("sdpa", sdpa, reserve_s=10)

    if main_impl != "torch":
        section("profile_plain_torch", lambda: profile_steps(
            torch, engines["torch"], plain_iter(engines["torch"], 16), 16, tokens_of, args.out,
            "plain_torch", dev), reserve_s=12)
        section("profile_eagle_torch", lambda: profile_steps(
            torch, engines["torch"], eagle_iter(engines["torch"], 16), 4, tokens_of, args.out,
            "eagle_torch", dev), reserve_s=12)
    if not args.no_trace:
        section("trace_plain_" + main_impl, lambda: profile_steps(
            torch, engines[main_impl], plain_iter(engines[main_impl], 4), 4, tokens_of, args.out,
            f"short_plain_{main_impl}", dev, trace=True), reserve_s=10)

    # -- (d) Triton
    def triton_section():
        by_phase = collections.Counter(c["phase"] for c in COMPILES)
        return {"compiles_total": len(COMPILES), "compiles_by_phase": dict(by_phase),
                "compile_ms_total": round(sum(c["ms"] or 0 for c in COMPILES), 1),
                "cache_entries": triton_cache_sizes(), "disk_cache": triton_disk_cache(),
                "note": "a compile after 'warmup' means a new specialisation appeared during a timed/profiled run"}

    section("triton", triton_section, reserve_s=-50)

    # -- summary on stdout
    def pick(path, default=None):
        cur = report
        for k in path:
            if not isinstance(cur, dict) or k not in cur:
                return default
            cur = cur[k]
        return cur

    try:
        summary = {
            "plain_triton_tok_s": [r.get("decode_tokens_per_s") for r in pick(["timing", "triton_plain"], [])],
            "eagle_triton_tok_s": [r.get("decode_tokens_per_s") for r in pick(["timing", "triton_eagle"], [])],
            "plain_torch_tok_s": pick(["timing", "torch_plain", "decode_tokens_per_s"]),
            "eagle_torch_tok_s": pick(["timing", "torch_eagle", "decode_tokens_per_s"]),
            "eagle_torch_draft_ms": pick(["timing", "torch_eagle", "mean_phase_ms", "draft"]),
            "eagle_torch_draft_ms_cudnn_off": pick(["timing", "torch_eagle_cudnn_sdp_off", "mean_phase_ms", "draft"]),
            "plain_kernels_per_token": pick([f"profile_plain_{main_impl}", "device_kernels_per_token"]),
            "plain_launch_calls_per_token": pick([f"profile_plain_{main_impl}", "kernel_launch_api_calls_per_token"]),
            "plain_gpu_ms_per_token": pick([f"profile_plain_{main_impl}", "gpu_kernel_ms_per_token"]),
            "plain_syncs_per_token": pick(["syncs", "plain", "by_site_per_unit"]),
            "eagle_syncs_per_cycle": pick(["syncs", "eagle", "by_site_per_unit"]),
            "host_us_per_tiny_op": pick(["host_overhead", "one_tiny_op_add_", "host_us"]),
            "host_forward_t1": pick(["host_overhead", f"target_forward_t1_{main_impl}"]),
            "graph_floor": {k: v for k, v in (pick(["graph_floor"], {}) or {}).items()
                            if isinstance(v, dict) and not k.startswith("_")},
            "triton_compiles": len(COMPILES),
        }
        report["summary"] = summary
        save()
        log("summary: " + json.dumps(summary, default=str)[:3000])
    except BaseException as exc:  # the alarm, or a section's odd result: the report is already saved
        log(f"summary failed: {exc!r}")
    log(f"report: {report_path}")
    if hasattr(signal, "SIGALRM"):
        signal.alarm(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
