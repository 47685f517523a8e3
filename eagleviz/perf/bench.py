"""Speed, measured side by side: `python -m eagleviz bench` (the tree sweep is `eagleviz.perf.tune`).

bench: for each prompt, interleaved and repeated, run
    hf-generate      Hugging Face `model.generate` (the baseline a user would reach for)
    hf-prompt-lookup Hugging Face prompt-lookup decoding (a speculative peer that needs no draft model)
    plain            eagleviz's own loop without speculation
    lookup           our loop with prompt-lookup candidates only (no draft model), the tree's policy and steps
    eagle-chain      EAGLE with SGLang's fixed chain (topk = 1, --steps long)
    eagle-tree       EAGLE with the tree the options describe: by default the cost-aware tree with the knobs as
                     upper bounds (--fixed-tree: SGLang's fixed tree), candidates from --draft-source
    eagle-tuned      EAGLE with the fixed tree `tune` found fastest on this machine (when it has been run)
    plain-control    plain decoding again, a control (only when named in --methods): its ratio to plain should
                     be 1, so its interval is the measurement's own spread beside the other methods'
with the same model, dtype and thread count. With --lockstep, our methods run each prompt together, a step of
each in turn, each step timed (`run_lockstep`): on a machine whose speed drifts, their per-prompt ratios then
measure the methods rather than the moments they ran at. Reports the median tokens/s per method, the median per-prompt
speedup over hf-generate, tau and the mean time per phase, checks that the greedy methods agree (with
hf-generate, or from weight blocks with our plain loop; explaining a difference by the target's top-2 gap
where they diverge), and writes JSON, a Markdown table and (where Plotly is installed) a
Plotly HTML figure to --out; the JSON is also copied to <cache>/bench/, where the app's measured-speed
section looks first (eagleviz.measured). Fifteen A/B modes measure one engineering lever each, interleaved in one
process: `--ab trace` (recording the full trace), `--ab packing` (oneDNN-packed linears,
eagleviz.models.dense), `--ab hot-vocab` (the hot draft vocabulary, eagleviz.models.hot_vocab),
`--ab kv-fp32` (keys, values and attention in fp32 for a bf16 model, eagleviz.models.layers.attention_dtype),
`--ab fused` (each layer's small operations as compiled C calls, kernels.cpu_ops), `--ab policy` (the
cost-aware tree against SGLang's fixed tree with the same knobs), `--ab prefix` (each prefill after the cached
chat prefix, eagleviz.decoding.prefix), `--ab sample-ops` (reading the target's distribution in C,
kernels.sample_ops), `--ab stack` (the decoder stack from weight blocks in one C call, kernels.stack_ops),
`--ab learned` (the calibration corrected by each run's own acceptance, eagleviz.decoding.calibration),
`--ab rest-price` (the cost-aware tree priced with the measured resting cycle and sampled overhead,
eagleviz.decoding.costs), `--ab ledger` (the run's clock: drafted and lookup cycles judged against a resting one,
eagleviz.decoding.policy.Ledger, and the price list corrected by the phases' times,
eagleviz.decoding.costs.RunCosts), `--ab head-layer` (an EAGLE-3 head's layer in one C call, kernels.stack_ops) and
`--ab lookup` (prompt-lookup candidates merged into the head's tree) and `--ab graphs` (on a GPU: the target's
steps and the head's drafting captured in CUDA graphs over static state, eagleviz.models.static, against the
eager forward). Each A/B prints its ratios and writes
them, per arm with the trees each side ran, to --out/ab-LEVER-T{T}.json (`ab_name`): the file a figure quoted
from it can be checked against.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from eagleviz.config import SamplingConfig, TreeConfig, kv_slots
from eagleviz.decoding.load import add_model_args, add_tree_args, tree_from_args
from eagleviz.decoding.lookup import Foresight, SuffixIndex
from eagleviz.errors import UserFacingError
from eagleviz.journal import Journal
from eagleviz.measured import bench_name, tuned_config, tuned_tree, user_bench_path
from eagleviz.models.loading import cpu_description
from eagleviz.perf import peers as peer_methods
from eagleviz.perf.provenance import provenance
from eagleviz.prompts import bundle_copies, load_prompts
from eagleviz.visuals.table import markdown_table

AB_LEVERS = ("graphs", "trace", "packing", "hot-vocab", "kv-fp32", "fused", "policy", "lookup", "prefix", "sample-ops",
             "stack", "learned", "rest-price", "head-layer", "ledger")
METHODS = ("hf-generate", "hf-prompt-lookup", "plain", "lookup", "eagle-chain", "eagle-tree")
TUNED_METHOD = "eagle-tuned"
CONTROL_METHOD = "plain-control"  # plain decoding again: a ratio to plain that should be 1 (the spread's size)
OURS = ("plain", "lookup", "eagle-chain", "eagle-tree", TUNED_METHOD, CONTROL_METHOD)  # the others prefill whole
EXTRA_METHODS = (TUNED_METHOD, CONTROL_METHOD)  # run only when --methods names them (or `tune` has run)
GREEDY_REFERENCE = "hf-generate"


@dataclass
class Sample:
    tokens: list[int]
    seconds: float
    tau: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    prefill_ms: float = 0.0
    cycles: int = 0  # speculation cycles (0 for plain decoding)
    short: int = 0   # cycles before the last that did not accept all their tree's tokens (a chain's: a rejection)
    prefill_reused: int = 0  # prompt tokens ours took from the engine's cached chat opening (peers: none)
    decode: str = ""  # the decode path our run's steps took (`RunTrace.decode`; peers: "")

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """The tokens after the prefill's first over the time after the prefill (ours: peers time no prefill)."""
        after = self.seconds - self.prefill_ms / 1e3
        return (len(self.tokens) - 1) / after if after > 0 and self.prefill_ms > 0 else 0.0


def _hf_generate(engine, ids: list[int], sampling: SamplingConfig, lookup: int | None) -> Sample:
    """Run HF generate on the same weights; only the new tokens are counted, EOS included like ours."""
    hf, dev = engine.target.hf, engine.target.device
    kwargs = dict(max_new_tokens=sampling.max_new_tokens, do_sample=not sampling.greedy,
                  eos_token_id=sorted(engine.target.eos_token_ids) or None, pad_token_id=0)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        torch.manual_seed(sampling.seed)
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    x = torch.tensor([ids], device=dev)
    start = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(x, attention_mask=torch.ones_like(x), **kwargs)
    seconds = time.perf_counter() - start
    return Sample(tokens=out[0, len(ids):].tolist(), seconds=seconds)


def start_ours(engine, ids: list[int], tree: TreeConfig | None, sampling: SamplingConfig, record: bool = True,
               index_of: Callable[[list[int]], SuffixIndex | Foresight] = SuffixIndex):
    """One run of ours, not started yet: its trace and the generator of its steps (tree None: plain decoding).
    index_of: the run's source of lookup candidates (`Engine.speculate`)."""
    run = engine.new_run("", ids, tree, sampling)
    return run, (engine.plain(ids, sampling, run) if tree is None else
                 engine.speculate(ids, tree, sampling, run, record, index_of))


def sample_of(run, seconds: float) -> Sample:
    """A finished run of ours that took `seconds`."""
    s = run.summary()
    return Sample(tokens=run.token_ids, seconds=seconds, tau=s["tau"], phases=s["mean_phase_ms"],
                  prefill_ms=run.prefill_ms, cycles=len(run.cycles),
                  short=sum(c.accept_length < len(c.tokens) - 1 for c in run.cycles[:-1]),
                  prefill_reused=run.prefill_reused, decode=run.decode)


def run_ours(engine, ids: list[int], tree: TreeConfig | None, sampling: SamplingConfig, record: bool = True,
             index_of: Callable[[list[int]], SuffixIndex | Foresight] = SuffixIndex) -> Sample:
    """One run of ours, timed whole (prefill included); `start_ours`'s arguments."""
    run, steps = start_ours(engine, ids, tree, sampling, record, index_of)
    start = time.perf_counter()
    for _ in steps:
        pass
    return sample_of(run, time.perf_counter() - start)


def run_lockstep(engine, methods: tuple[str, ...], ids: list[int], sampling: SamplingConfig, tree: TreeConfig,
                 tuned: TreeConfig | None = None, on_step: Callable | None = None) -> dict[str, Sample]:
    """Our `methods` on one prompt in lockstep: the method that has written the fewest tokens takes the next step
    (a token of plain decoding, a cycle of speculation; equals in `methods`' order), each step timed and added to
    its method's time (the prefill, inside the first step, included). Every method meets the machine as the others
    do at the same point of the text, where one whole run after another meets a machine whose speed may drift by
    tens of percent in minutes; a step that wrote several tokens (a cycle that accepted some, a stretch of resting
    cycles run before their traces) is met by as many of the others'. `on_step(method, item, seconds)`: told of
    each step (what it yielded, what it took)."""
    started = {m: start_ours(engine, ids, our_tree(m, tree, tuned), sampling) for m in methods}
    seconds = dict.fromkeys(methods, 0.0)
    live = list(methods)
    while live:
        m = min(live, key=lambda method: len(started[method][0].output))
        start = time.perf_counter()
        try:
            item = next(started[m][1])
        except StopIteration:
            live.remove(m)
            seconds[m] += time.perf_counter() - start
            continue
        took = time.perf_counter() - start
        seconds[m] += took
        if on_step is not None:
            on_step(m, item, took)
    return {m: sample_of(started[m][0], seconds[m]) for m in methods}


def our_tree(method: str, tree: TreeConfig, tuned: TreeConfig | None = None) -> TreeConfig | None:
    """The tree one of our methods decodes with (None: plain decoding)."""
    if method in ("plain", CONTROL_METHOD):
        return None
    if method == "lookup":
        return tree.with_(source="lookup")
    if method == "eagle-chain":
        return TreeConfig.create(tree.steps, 1, tree.steps + 1, adaptive=False)
    return tuned if method == TUNED_METHOD else tree


def prepare(engine, methods, encoded: list[list[int]], sampling: SamplingConfig, tree: TreeConfig,
            tuned: TreeConfig | None = None) -> int:
    """Every graph our methods' runs of these prompts replay, captured before any is timed (`Engine.prepare`; on
    the eager path none). Returns how many."""
    trees = {our_tree(m, tree, tuned) for m in methods}
    return sum(engine.prepare(max(kv_slots(len(ids), sampling.max_new_tokens, t) for ids in encoded), t, sampling)
               for t in trees)


def run_method(engine, method: str, ids: list[int], sampling: SamplingConfig, tree: TreeConfig,
               tuned: TreeConfig | None = None, peers: dict | None = None) -> Sample:
    if peers and method in peers:
        tokens, seconds = peers[method].run(ids, sampling)
        return Sample(tokens=tokens, seconds=seconds)
    if method == "hf-generate":
        return _hf_generate(engine, ids, sampling, None)
    if method == "hf-prompt-lookup":
        return _hf_generate(engine, ids, sampling, 10)
    return run_ours(engine, ids, our_tree(method, tree, tuned), sampling)


def ab_ratio(engine, prompts: list[str], run_a, run_b, repeats: int) -> dict:
    """Decode time of variant a over variant b, interleaved, median of per-prompt ratios: which goes first turns
    with every prompt and every repeat (prompt i, repeat r: a first when i + r is even), so one repeat still
    puts each variant first on half the prompts. run_a, run_b: ids -> Sample. Also reports whether both
    produced the same tokens on every run."""
    ratios, same = [], True
    for i, prompt in enumerate(prompts):
        ids = engine.encode_prompt(prompt)
        times: dict[int, list[float]] = {0: [], 1: []}
        tokens: dict[int, list[int]] = {}
        for r in range(repeats):
            for which in ((0, 1) if (i + r) % 2 == 0 else (1, 0)):
                sample = (run_a, run_b)[which](ids)
                times[which].append(sample.seconds)
                tokens[which] = sample.tokens
        ratios.append(statistics.median(times[0]) / statistics.median(times[1]))
        same = same and tokens[0] == tokens[1]
    return {"median_ratio": statistics.median(ratios), "per_prompt": ratios, "same_tokens": same}


def tracing_overhead(engine, prompts: list[str], sampling: SamplingConfig, tree: TreeConfig, repeats: int) -> dict:
    """Decode time with the full trace over decode time without it (`ab_ratio`)."""
    return ab_ratio(engine, prompts, lambda ids: run_ours(engine, ids, tree, sampling, True),
                    lambda ids: run_ours(engine, ids, tree, sampling, False), repeats)


def lever_ab(engine, lever: str, prompts: list[str], sampling: SamplingConfig, tree: TreeConfig, repeats: int,
             head_dir: str | None = None) -> dict:
    """Decode time without `lever` over decode time with it (`ab_ratio`): the same weights, one process.

    packing: unpacked linears vs packed ones (eagleviz.models.dense), for our plain loop and the EAGLE tree;
    hot-vocab: the head's whole draft vocabulary vs the engine's hot one (eagleviz.models.hot_vocab), for the
    tree (its tau with each is reported too);
    kv-fp32: keys, values and attention in the model's dtype vs in fp32 (both forced, whatever
    `attention_dtype` picked at load; PyTorch's operations in both), for our plain loop and the EAGLE tree;
    fused: PyTorch's small operations vs the compiled layer (kernels.cpu_ops), the same fp32 cache, for our
    plain loop and the EAGLE tree;
    policy: SGLang's fixed tree vs the cost-aware tree under the same knobs (eagleviz.decoding.policy);
    lookup: candidates from the head alone vs merged with prompt lookup's (eagleviz.decoding.lookup);
    prefix: every prompt prefilled whole vs after the cached chat prefix (eagleviz.decoding.prefix), for our
    plain loop and the EAGLE tree; the median prefill times are reported too;
    sample-ops: PyTorch's argmax, top-k and draw vs kernels.sample_ops (the same tokens), for our plain loop and
    the EAGLE tree;
    stack: one Python call per C operation vs the decoder stack in one C call (kernels.stack_ops; bitwise the
    same), for our plain loop and the EAGLE tree;
    learned: the head's calibration as shipped vs corrected by each run's own acceptance
    (`eagleviz.decoding.calibration.RunAcceptance`), for our plain loop and the EAGLE tree;
    rest-price: a cost-aware tree priced without vs with the measured resting cycle and sampled overhead
    (`CostModel.rest`; without: the root alone costs verify(1) + the greedy overhead), for our plain loop and the
    EAGLE tree;
    head-layer: an EAGLE-3 head's layer as one Python call per C operation vs in one C call
    (`kernels.stack_ops.Midlayer`; bitwise the same), for our plain loop and the EAGLE tree;
    ledger: a cost-aware tree's drafted cycles judged by the forecast alone vs by the run's clock too
    (`eagleviz.decoding.policy.Ledger`), for our plain loop and the EAGLE tree;
    graphs: on a GPU, the eager forward (Python-launched kernels, the host drafting level by level) vs the
    steps and the drafting replayed from CUDA graphs (eagleviz.models.static), for our plain loop and the
    EAGLE tree."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.decoding.prefix import PrefixCache
    from eagleviz.models.draft import load_head
    from eagleviz.models.target import TargetModel

    t = engine.target
    policy = {"costs": engine.costs, "calibration": engine.calibration}  # the variants price trees alike
    with_ = engine
    if lever == "packing":
        without = Engine(TargetModel(t.hf, t.tokenizer, t.name, pack=False, kv_dtype=t.kv_dtype), engine.head,
                         engine.head_name, engine.attn_impl, pack=False, **policy)
    elif lever == "kv-fp32":
        if t.dtype == torch.float32 or t.device.type != "cpu":
            raise UserFacingError("--ab kv-fp32 compares a bf16/fp16 model's attention dtypes on a CPU")

        def variant(kv):  # PyTorch's attention in both: the fused layer reads fp32 only
            return Engine(TargetModel(t.hf, t.tokenizer, t.name, kv_dtype=kv, fused=False), engine.head,
                          engine.head_name, engine.attn_impl, **policy)
        without, with_ = variant(t.dtype), variant(torch.float32)
    elif lever == "fused":
        if t.ops is None:
            raise UserFacingError("--ab fused needs the fused CPU layer, which this model or machine cannot run "
                                  "(a CPU, bf16 or fp32, a C compiler: kernels/cpu_ops.py)")
        without = Engine(TargetModel(t.hf, t.tokenizer, t.name, kv_dtype=t.kv_dtype, fused=False), engine.head,
                         engine.head_name, engine.attn_impl, **policy)
    elif lever == "hot-vocab":
        without = Engine(t, load_head(head_dir, t), "whole draft vocabulary", engine.attn_impl, **policy)
    elif lever == "prefix":  # the same target and drafting head (re-making a head from blocks is refused)
        without = copy.copy(engine)
        without.prefix = PrefixCache(())  # what prefix_cache=False builds: every prompt prefilled whole
    elif lever == "sample-ops":
        if engine.sample_ops is None:
            raise UserFacingError("--ab sample-ops needs kernels/sample_ops.c compiled: a CPU and a C compiler")
        without = copy.copy(engine)  # the same target and drafting head
        without.sample_ops = None
    elif lever == "stack":
        if t._stack is None:
            raise UserFacingError("--ab stack needs a target from weight blocks with the compiled layer and "
                                  "kernels/stack_ops.c built (a CPU and a C compiler)")
        without = copy.copy(engine)
        without.target = copy.copy(t)
        without.target._stack = None
    elif lever == "learned":
        without = copy.copy(engine)
        without.learn = False
    elif lever == "ledger":
        without = copy.copy(engine)
        without.ledger = False
    elif lever == "head-layer":
        if engine.head is None or engine.head.compiled_layer is None:
            raise UserFacingError("--ab head-layer needs a one-layer EAGLE-3 head beside a target from weight blocks, "
                                  "with kernels/stack_ops.c built (a CPU and a C compiler)")
        without = copy.copy(engine)
        without.head = copy.copy(engine.head)
        without.head.compiled_layer = None
    elif lever == "graphs":
        if t.device.type != "cuda":
            raise UserFacingError("--ab graphs compares CUDA graphs with the eager forward: it needs --device cuda")
        without, with_ = engine.with_decode("eager"), engine.with_decode("graphs")
    elif lever == "rest-price":
        without = engine.with_policy(costs=dataclasses.replace(engine.costs, rest=None, sampled_overhead=None,
                                                               sampled_rest=None))
    else:
        without = engine
    if lever in ("policy", "lookup"):  # the same engine, two trees
        changed = {"policy": {"adaptive": False}, "lookup": {"source": "eagle"}}[lever]
        base = tree.with_(adaptive=True) if lever == "policy" else tree.with_(source="eagle+lookup")
        runs = (("eagle-tree", base.with_(**changed), base),)
    elif lever == "hot-vocab":
        runs = (("eagle-tree", tree, tree),)
    else:
        runs = (("plain", None, None), ("eagle-tree", tree, tree))
    results = {}
    for name, cfg_without, cfg_with in runs:
        taus, prefills = {"without": [], "with": []}, {"without": [], "with": []}

        def timed(eng, key, ids, cfg):
            sample = run_ours(eng, ids, cfg, sampling)
            taus[key].append(sample.tau)
            prefills[key].append(sample.prefill_ms)
            return sample

        res = ab_ratio(with_, prompts, lambda ids, c=cfg_without: timed(without, "without", ids, c),
                       lambda ids, c=cfg_with: timed(with_, "with", ids, c), repeats)
        if cfg_with is not None:
            res["tau"] = {k: round(statistics.mean(v), 3) for k, v in taus.items()}
            res["trees"] = {"without": tree_record(cfg_without), "with": tree_record(cfg_with)}
        if lever == "prefix":
            res["prefill_ms"] = {k: round(statistics.median(v), 1) for k, v in prefills.items()}
        results[name] = res
    return results


def tree_record(tree: TreeConfig) -> dict:
    """A tree as the JSON files record it: its knobs, whether it is cost-aware, where its candidates come from."""
    return {"steps": tree.steps, "topk": tree.topk, "draft_tokens": tree.draft_tokens, "adaptive": tree.adaptive,
            "source": tree.source}


def top2_gap(engine, ids: list[int]) -> float:
    """The target's gap between its two best logits after `ids` (`eagleviz.decoding.race.top2_after`)."""
    from eagleviz.decoding.race import top2_after

    (_, _, first), (_, _, second) = top2_after(engine, ids)
    return first - second


def bench(engine, prompts: list[str], sampling: SamplingConfig, tree: TreeConfig, repeats: int,
          methods=METHODS, progress=print, journal: Path | None = None, peers: dict | None = None,
          lockstep: bool = False) -> dict:
    """Interleaved runs: for each prompt and repeat, every method once, the order rotated from one prompt and
    repeat to the next; `lockstep`, our methods advanced a step each in turn within each prompt
    (`run_lockstep`; `result["pairing"]`: "step", else "prompt"). `peers`: the llama.cpp methods' models (`eagleviz.perf.peers.make_peers`). Every method
    prefills alike: when a peer (Hugging Face's, llama.cpp's) is among the methods, ours prefill each prompt
    whole too, as they do, not after the engine's cached chat opening (`result["prefill"]`: "whole" or
    "cached opening").

    `journal`: a JSON-lines file that records each finished prompt; a run with the same settings picks up
    after the last recorded prompt (a long bench survives an interruption), and the file is removed at the
    end. A journal written with other settings (the methods, the tree with its policy and draft source, the
    machine, the price list and calibration the policy used) is never mixed in: the run starts afresh and says
    which settings differed."""
    found = tuned_tree(sampling.temperature, shipped=False) if TUNED_METHOD in methods else None
    tuned = tuned_config(found) if found else None
    if TUNED_METHOD in methods and tuned is None:
        raise UserFacingError(f"{TUNED_METHOD} runs the tree `python -m eagleviz tune` found: run it first")
    if lockstep and not all(m in OURS for m in methods):
        raise UserFacingError("--lockstep advances our own methods a step each in turn: "
                              f"{', '.join(m for m in methods if m not in OURS)} cannot be stepped so")
    samples: dict[str, list[list[Sample]]] = {m: [] for m in methods}
    encoded = [engine.encode_prompt(p) for p in prompts]
    prefill = "cached opening" if all(m in OURS for m in methods) else "whole"
    if prefill == "whole":  # as the peers do: ours do not start from the engine's cached chat opening either
        from eagleviz.decoding.prefix import PrefixCache

        engine = copy.copy(engine)
        engine.prefix = PrefixCache(())
    pairing = "step" if lockstep else "prompt"
    header = {"prefill": prefill, "pairing": pairing, "prompts": encoded, "methods": list(methods), "repeats": repeats,
              "sampling": vars(sampling),
              "tree": tree_record(tree), "machine": machine_info(engine), "policy": policy_record(engine),
              "tuned": tuned and [tuned.steps, tuned.topk, tuned.draft_tokens]}
    log = Journal(journal, header, "bench", progress)
    prepare(engine, [m for m in methods if m in OURS], encoded, sampling, tree, tuned)
    for m in methods:  # warm-up: first-call allocations and lazy initialisation
        run_method(engine, m, encoded[0], SamplingConfig(max_new_tokens=8), tree, tuned, peers)

    def prompt(i: int) -> dict:
        per = {m: [] for m in methods}
        for r in range(repeats):
            shift = (i + r) % len(methods)  # no method always runs first (or right after another) on every prompt
            order = methods[shift:] + methods[:shift]
            if lockstep:
                for m, sample in run_lockstep(engine, order, encoded[i], sampling, tree, tuned).items():
                    per[m].append(asdict(sample))
                continue
            for m in order:
                per[m].append(asdict(run_method(engine, m, encoded[i], sampling, tree, tuned, peers)))
        return per

    for per in log.run(len(encoded), prompt):
        for m in methods:
            samples[m].append([Sample(**x) for x in per[m]])
    result = summarize(engine, encoded, samples, sampling, methods)
    result["prefill"], result["pairing"] = prefill, pairing
    if tuned is not None:
        result["tuned_tree"] = {"steps": tuned.steps, "topk": tuned.topk, "draft_tokens": tuned.draft_tokens,
                                "source": found.path.name}
    log.close()
    return result


def summarize(engine, encoded, samples, sampling: SamplingConfig, methods) -> dict:
    ref = GREEDY_REFERENCE if GREEDY_REFERENCE in methods else methods[0]
    # the tokens every greedy method is checked against: from weight blocks, our plain loop (Hugging Face
    # computes the same weights widened, with fp32 activations: another numerics, compared to ours like the others)
    same = "plain" if engine.target.weights == "blocks" and "plain" in methods else ref
    rows, mismatches = {}, []
    for m in methods:
        tps = [statistics.median(s.tokens_per_s for s in reps) for reps in samples[m]]
        ratios = [statistics.median(s.tokens_per_s for s in reps) / statistics.median(b.tokens_per_s for b in base)
                  for reps, base in zip(samples[m], samples[ref])]
        taus = [reps[0].tau for reps in samples[m] if reps[0].tau]
        phases = {}
        for reps in samples[m]:
            for k, v in reps[0].phases.items():
                phases.setdefault(k, []).append(v)
        rows[m] = {"tokens_per_s": statistics.median(tps), "speedup": statistics.median(ratios),
                   "tau": statistics.mean(taus) if taus else None,
                   "phase_ms": {k: statistics.mean(v) for k, v in phases.items()},
                   "tokens": sum(len(reps[0].tokens) for reps in samples[m])}
    for m in methods:
        if m in OURS:  # the path its steps took, and the rate after the prefill (the same prefill in every method)
            rows[m]["decode"] = sorted({s.decode for reps in samples[m] for s in reps})
            rows[m]["decode_tokens_per_s"] = statistics.median(
                statistics.median(s.decode_tokens_per_s for s in reps) for reps in samples[m])
    if "plain" in methods:
        for m in methods:
            per_prompt = [statistics.median(s.tokens_per_s for s in reps) / statistics.median(b.tokens_per_s for b in base)
                          for reps, base in zip(samples[m], samples["plain"])]
            rows[m]["vs_plain"] = statistics.median(per_prompt)
            rows[m]["vs_plain_ci95"] = bootstrap_ci(per_prompt)
            rows[m]["vs_plain_per_prompt"] = per_prompt
            decoding = [statistics.median(s.decode_tokens_per_s for s in reps) /
                        statistics.median(b.decode_tokens_per_s for b in base)
                        for reps, base in zip(samples[m], samples["plain"])
                        if statistics.median(b.decode_tokens_per_s for b in base) > 0]
            if m in OURS and decoding:
                rows[m]["decode_vs_plain"] = statistics.median(decoding)
                rows[m]["decode_vs_plain_ci95"] = bootstrap_ci(decoding)
    if sampling.greedy:
        for m in methods:
            if m in peer_methods.METHODS:  # another engine's numerics: compared for speed, not tokens
                continue
            for i, (reps, base) in enumerate(zip(samples[m], samples[same])):
                a, b = base[0].tokens, reps[0].tokens
                if a == b:
                    continue
                k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                mismatches.append({"method": m, "prompt": i, "position": k,
                                   "top2_gap": top2_gap(engine, encoded[i] + a[:k])})
    return {"rows": rows, "reference": ref, "greedy_reference": same, "greedy_mismatches": mismatches,
            "unchecked": [m for m in methods if m in peer_methods.METHODS], "prompts": len(encoded),
            "sampling": vars(sampling), "machine": machine_info(engine)}


def resampled_medians(values: list[float], draws: int = 2000, seed: int = 0) -> torch.Tensor:
    """(draws,) medians of `values` resampled with replacement (seeded), each as `statistics.median` takes it
    (the mean of the two middle values of an even count), the definition every point estimate here uses."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.tensor(values, dtype=torch.float64)
    n = len(values)
    ranked = x[torch.randint(0, n, (draws, n), generator=gen)].sort(dim=1).values
    return (ranked[:, (n - 1) // 2] + ranked[:, n // 2]) / 2


def bootstrap_ci(values: list[float], draws: int = 2000, seed: int = 0) -> list[float]:
    """The 95% bootstrap interval of the median of `values` (prompts resampled with replacement, seeded)."""
    medians = resampled_medians(values, draws, seed)
    return [round(float(medians.quantile(0.025)), 4), round(float(medians.quantile(0.975)), 4)]


def policy_record(engine) -> dict:
    """What the cost-aware tree's choices depend on: the price list and the calibration the engine holds."""
    calibration = hashlib.sha256(engine.calibration.to_json().encode()).hexdigest()[:16]
    return {"costs": engine.costs.to_dict(), "calibration_sha256": calibration}


def machine_info(engine) -> dict:
    """What a measurement of `engine` ran on and with: the machine, the numerics, the paths the engine took (the
    decode path and attention it uses, not the ones asked for, and its notes on any fallback) and where the code
    and machine come from (`eagleviz.perf.provenance`)."""
    return {"cpu": cpu_description(), "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
            "torch": torch.__version__, "dtype": str(engine.target.dtype).removeprefix("torch."),
            "kv_dtype": str(engine.target.kv_dtype).removeprefix("torch."), "device": str(engine.target.device),
            "cpu_layer": "compiled" if engine.target.ops is not None else "torch", "weights": engine.target.weights,
            "model": engine.target.name, "head": engine.head_name, "decode": engine.decode,
            "attn_impl": engine.attn_impl, "layer_kernels": layer_kernels(engine.target),
            "notes": list(engine.notes)} | provenance(engine.target.device)


def layer_kernels(target) -> str:
    """How a GPU's steps run a target layer: "products" (five Triton kernels, `kernels/layer_products.py`),
    "small" (nine, `kernels/layer_ops.py`) or "torch" (PyTorch's operations: a CPU, or a model they do not fit)."""
    return "products" if target.layer_products else "small" if target.layer_kernels else "torch"


def decode_lines(result: dict, asked: str) -> list[str]:
    """The rates after the prefill (the same prefill in every method of ours), and a warning for each method whose
    runs took another decode path than the engine's (a capture that failed: the runs' notes say why)."""
    rows = {m: r for m, r in result["rows"].items() if "decode_tokens_per_s" in r}
    lines = []
    if rows:
        lines.append("after the prefill: " + ", ".join(
            f"{m} {r['decode_tokens_per_s']:.1f} tokens/s" + (f" ({r['decode_vs_plain']:.2f}x plain)"
                                                              if "decode_vs_plain" in r else "")
            for m, r in rows.items()))
    lines += [f"warning: {m}'s steps ran {' and '.join(r['decode'])}, not {asked} as asked (a capture failed: the "
              "runs' notes say why)" for m, r in rows.items() if r["decode"] != [asked]]
    return lines


def ab_name(lever: str, temperature: float) -> str:
    """The file name of an A/B result: ab-policy-T0.json, ab-lookup-T1.json."""
    return f"ab-{lever}-T{temperature:g}.json"


def write_outputs(result: dict, out: Path, stem: str) -> list[str]:
    """The result as JSON, its Markdown table and its Plotly figure in `out`; returns the suffixes written. Where
    Plotly is not installed (a GPU machine lent bare) the figure is left out, and a line says so: the JSON and
    the table hold the same numbers."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (out / f"{stem}.md").write_text(markdown_table(result) + "\n")
    if importlib.util.find_spec("plotly") is None:
        print(f"no figure ({stem}.html): plotly is not installed; the JSON and the table hold its numbers")
        return [".md", ".json"]
    from eagleviz.visuals.speed import bench_figure

    bench_figure(result).write_html(out / f"{stem}.html", include_plotlyjs=True)
    return [".md", ".json", ".html"]


def keep_latest(result: dict, path: Path | None = None) -> Path:
    """Copy the result where the app looks first (`eagleviz.measured`), so that the page shows this
    machine's numbers instead of the shipped ones: `path`, by default the bench's at the result's temperature."""
    path = path or user_bench_path(result["sampling"]["temperature"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return path


def publish(result: dict, wanted: bool, path: Path | None = None) -> str:
    """The line that says where the page reads its measured speed from: with `wanted` (--publish) the result
    is copied there (`keep_latest`); without, the page keeps what it showed, so a smoke test or a run on
    another model never replaces the shipped figures by accident."""
    if wanted:
        return f"published: the page shows it from {keep_latest(result, path)}"
    return "not published: the page keeps its figures (--publish shows these instead)"


# ---------------------------------------------------------------------------------------------- CLI
def common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default="mtbench",
                   help="'mtbench' (with --model BUNDLE, the bundle's copy) or a file of prompts")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--publish", action="store_true",
                   help="show this result on the page's Measured speed in place of the shipped one (default: "
                        "written to --out only)")
    add_model_args(p)


def check_knobs(args, tree_args: bool = False) -> tuple[SamplingConfig, TreeConfig | None]:
    """The sampling settings (and the tree, given tree_args), validated before any model is loaded."""
    try:
        sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
        tree = tree_from_args(args) if tree_args else None
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    if args.limit is not None and args.limit < 1:
        raise UserFacingError(f"--limit must be at least 1, got {args.limit}")
    return sampling, tree


def setup(args, with_prompts: bool = True):
    from eagleviz.decoding.load import load_engine

    _, source = bundle_copies(args.model, prompts=args.prompts)
    prompts = load_prompts(source, args.limit) if with_prompts else []
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine(args.model, args.head, args.dtype, args.device, args.attn_impl, args.draft_vocab,
                         args.kv_dtype, weights=args.weights, decode=args.decode)
    return engine, prompts


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz bench", description="speed, side by side")
    common_args(p)
    add_tree_args(p)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from {', '.join(METHODS + EXTRA_METHODS + peer_methods.METHODS)} "
                        f"(default: all of ours and Hugging Face's; {TUNED_METHOD} once `tune` has run; "
                        f"{CONTROL_METHOD} is plain decoding again, a control; the llama.cpp ones need "
                        "llama-cpp-python)")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument("--lockstep", action="store_true",
                   help="our methods advanced a step each in turn within each prompt, each step timed, rather than "
                        "one whole run after another: all meet the machine at the same moments (our methods only)")
    p.add_argument("--ab", choices=AB_LEVERS, default=None,
                   help="only measure one lever, interleaved in one process: what recording the full trace costs "
                        "(trace), what packed linears gain (packing), what the hot draft vocabulary gains (hot-vocab), "
                        "what fp32 keys, values and attention gain for a bf16 model (kv-fp32), what the compiled layer "
                        "operations gain (fused), what the cost-aware tree gains over SGLang's fixed tree with the "
                        "same knobs (policy), what prompt-lookup candidates add to the head's (lookup), what "
                        "starting each prefill from the cached chat prefix gains (prefix), what reading the target's "
                        "distribution in C gains (sample-ops), what the decoder stack in one C call gains (stack), "
                        "what CUDA graphs over static state gain over the eager forward on a GPU (graphs), what judging "
                        "drafted cycles by the run's clock gains (ledger)")
    args = p.parse_args(argv)
    sampling, tree = check_knobs(args, tree_args=True)
    if args.methods is None:
        methods = METHODS + ((TUNED_METHOD,) if tuned_tree(args.temperature, shipped=False) else ())
    else:
        methods = tuple(m for m in args.methods.split(",") if m)
    unknown = [m for m in methods if m not in METHODS + EXTRA_METHODS + peer_methods.METHODS]
    if unknown or not methods:
        p.error(f"--methods: unknown {unknown}" if unknown else "--methods: none given")
    peers = peer_methods.make_peers(methods, args.model, args.threads or torch.get_num_threads())
    engine, prompts = setup(args)
    if args.ab:
        return ab_main(args, argv, engine, prompts, sampling, tree)
    stem = Path(bench_name(args.temperature)).stem
    result = bench(engine, prompts, sampling, tree, args.repeats, methods, journal=args.out / f"{stem}.journal.jsonl",
                   peers=peers, lockstep=args.lockstep)
    result["tree"] = tree_record(tree)
    result["command"] = "python -m eagleviz bench " + " ".join(argv)
    written = write_outputs(result, args.out, stem)
    print(markdown_table(result))
    for line in decode_lines(result, engine.decode):
        print(line)
    print(f"wrote {args.out / stem}{'/'.join(written)}; {publish(result, args.publish)}")
    return 0


def ab_main(args, argv: list[str], engine, prompts: list[str], sampling: SamplingConfig, tree: TreeConfig) -> int:
    """`bench --ab LEVER`: the lever's ratio per arm, printed and written to --out (`ab_name`)."""
    if args.ab == "trace":
        ratio = "decode time with the full trace / without"
        arms = {"eagle-tree": tracing_overhead(engine, prompts, sampling, tree, args.repeats)}
    else:
        from eagleviz.decoding.load import default_head

        ratio = f"decode time without {args.ab} / with"
        arms = lever_ab(engine, args.ab, prompts, sampling, tree, args.repeats, args.head or default_head(args.model))
    for name, res in arms.items():
        _print_ratio(f"{name}: {ratio}" if args.ab != "trace" else ratio, res)
    result = {"lever": args.ab, "ratio": ratio, "arms": arms, "prompts": len(prompts), "repeats": args.repeats,
              "sampling": vars(sampling), "tree": tree_record(tree), "machine": machine_info(engine),
              "command": "python -m eagleviz bench " + " ".join(argv)}
    path = args.out / ab_name(args.ab, args.temperature)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def _print_ratio(what: str, res: dict) -> None:
    tau = f"; tau without {res['tau']['without']:.3f}, with {res['tau']['with']:.3f}" if "tau" in res else ""
    prefill = (f"; median prefill without {res['prefill_ms']['without']:.1f} ms, with {res['prefill_ms']['with']:.1f} "
               "ms" if "prefill_ms" in res else "")
    print(f"{what}: median {res['median_ratio']:.3f} over {len(res['per_prompt'])} prompts "
          f"({', '.join(f'{r:.3f}' for r in res['per_prompt'])}); same tokens: {res['same_tokens']}{tau}{prefill}")


if __name__ == "__main__":
    raise SystemExit(bench_main(os.sys.argv[1:]))
