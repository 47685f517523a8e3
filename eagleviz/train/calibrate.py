"""`python -m eagleviz calibrate`: fit the head's calibration (`eagleviz.decoding.calibration`) on the cycles of
real runs, and say how well it predicts on prompts it was not fitted on.

Runs the engine on ShareGPT first turns (the training distribution, from an offset no training stage used;
never MT-bench, the evaluation set) with a wide fixed tree (SGLang's semantics, so that the verified nodes do
not depend on the policy being fitted) and lookup candidates merged in, at T = 0 and at T = 1. Every
verified node of every cycle is an observation: its cumulative draft log-probability and whether it lay on
the accepted path; every verified child of an accepted node, by its rank among its siblings; every lookup
token the head did not also propose whose parent was accepted, by the length of its suffix match. Three
quarters of the prompts fit the tables; the last quarter checks them (the reliability table: predicted
against observed acceptance per bin, and per cycle the predicted against the actual number of accepted head
nodes), written beside the journal as reliability.json and plotted in reliability.svg (`docs/tree-policy.md`
shows the shipped head's). Each prompt's observations are appended to a journal, so an interrupted run resumes
after its last finished prompt.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from pathlib import Path

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.calibration import EDGES, Calibration, HeadCalibration, file_for, fit
from eagleviz.errors import UserFacingError
from eagleviz.journal import Journal
from eagleviz.trace import CycleTrace
from eagleviz.train.plot import reliability_svg

FIT_SHARE = 0.75
MAX_PROMPT_CHARS = 2000   # ShareGPT holds pasted documents; a calibration prompt is a question
KINDS = ("scored", "child", "lookup")


def observe(cycle: CycleTrace) -> dict:
    """One cycle's observations: head nodes [score, on path], children of accepted nodes [rank, accepted],
    lookup tokens the head did not propose, after an accepted parent [match length, accepted] (a token both
    proposed is valued at the better of the two estimates, so the lookup table is for lookup alone)."""
    on_path = set(cycle.path)
    by_id = {n.id: n for n in cycle.nodes}
    verified = [by_id[i] for i in cycle.verify_nodes[1:]]
    scored = [[n.score, n.slot in on_path] for n in verified if n.source != "lookup"]
    child, lookup = [], []
    for parent_slot in cycle.path:
        kids = [n for n in verified if cycle.parents[n.slot] == parent_slot]
        head_kids = sorted((n for n in kids if n.source != "lookup"), key=lambda n: -n.prob)
        child += [[rank + 1, n.slot in on_path] for rank, n in enumerate(head_kids)]
        if cycle.lookup_ngram:
            lookup += [[cycle.lookup_ngram, n.slot in on_path] for n in kids if n.source == "lookup"]
    return {"scored": scored, "child": child, "lookup": lookup}


def reliability(table: Calibration, scored: list) -> list[dict]:
    """Per bin with observations: its score range, the predicted and the observed acceptance, the count."""
    rows: dict[int, list[bool]] = {}
    for score, ok in scored:
        rows.setdefault(bisect.bisect_right(EDGES, score), []).append(bool(ok))
    out = []
    for i in sorted(rows):
        out.append({"from": EDGES[i - 1] if i > 0 else None, "to": EDGES[i] if i < len(EDGES) else 0.0,
                    "predicted": round(table.accept[i], 4), "observed": round(sum(rows[i]) / len(rows[i]), 4),
                    "nodes": len(rows[i])})
    return out


def collect(engine, prompts: list[str], tree: TreeConfig, sampling: SamplingConfig, journal: Path,
            progress=print) -> list[list[dict]]:
    """Per prompt, its cycles' observations; resumes from `journal` (its first line records the settings)."""
    header = {"tree": [tree.steps, tree.topk, tree.draft_tokens, tree.source], "sampling": vars(sampling),
              "prompts": prompts, "head": engine.head_name}
    label = f"calibrate T={sampling.temperature:g}"
    return Journal(journal, header, label, progress).run(
        len(prompts), lambda i: [observe(c) for c in engine.generate(prompts[i], tree, sampling).cycles])


def _pool(prompts: list[list[dict]], kind: str) -> list[tuple]:
    return [tuple(x) for cycles in prompts for c in cycles for x in c[kind]]


def fit_and_check(prompts: list[list[dict]], source: str) -> tuple[Calibration, dict]:
    """Fit on the first FIT_SHARE of the prompts and check on the rest; the table returned is refitted on all."""
    cut = max(1, int(len(prompts) * FIT_SHARE))
    held = fit(*(_pool(prompts[:cut], k) for k in KINDS), source=source)
    check = [c for cycles in prompts[cut:] for c in cycles]
    predicted = [sum(held.path_accept(s) for s, _ in c["scored"]) for c in check]
    actual = [sum(ok for _, ok in c["scored"]) for c in check]
    report = {"fit_prompts": cut, "check_prompts": len(prompts) - cut, "check_cycles": len(check),
              "reliability": reliability(held, _pool(prompts[cut:], "scored")),
              "predicted_accepted_per_cycle": statistics.mean(predicted) if check else None,
              "actual_accepted_per_cycle": statistics.mean(actual) if check else None,
              "mean_abs_error_per_cycle": statistics.mean(abs(p - a) for p, a in zip(predicted, actual))
              if check else None}
    return fit(*(_pool(prompts, k) for k in KINDS), source=source), report


def parser() -> argparse.ArgumentParser:
    from eagleviz.decoding.load import add_model_args

    p = argparse.ArgumentParser(prog="python -m eagleviz calibrate", description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--limit", type=int, default=96, help="ShareGPT first turns to run (per temperature)")
    p.add_argument("--first-conversation", type=int, default=8000,
                   help="the first ShareGPT conversation used (past every training stage's range)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--tree", default="6/8/48", help="the fixed tree observed, steps/topk/draft_tokens")
    p.add_argument("--temperatures", default="0,1", help="0 fits the greedy table, a T > 0 the sampling table")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None, help="where calibration.json (calibration-blocks.json for --weights blocks) goes "
                                                          "(default: the head's directory)")
    p.add_argument("--journal", type=Path, default=Path("runs/calibrate"), help="resumable observations")
    return p


def main(argv: list[str] | None = None) -> int:
    import torch

    from eagleviz.decoding.load import default_head, load_engine
    from eagleviz.train.data import load_prompts

    args = parser().parse_args(argv)
    try:
        steps, topk, budget = (int(x) for x in args.tree.split("/"))
        tree = TreeConfig.create(steps, topk, budget, adaptive=False, source="eagle+lookup")
        temps = sorted({float(t) for t in args.temperatures.split(",")})
        samplings = [SamplingConfig(temperature=t, max_new_tokens=args.max_new_tokens) for t in temps]
    except ValueError as exc:
        raise UserFacingError(f"calibrate: {exc}") from exc
    if args.limit < 4:
        raise UserFacingError("--limit must be at least 4 (a quarter of the prompts checks the fit)")
    head = args.head or default_head(args.model)
    out = args.out or Path(head)
    if args.threads:
        torch.set_num_threads(args.threads)
    turns = [p for p, _ in load_prompts("sharegpt")[args.first_conversation:] if 0 < len(p) <= MAX_PROMPT_CHARS]
    prompts = turns[:args.limit]
    if len(prompts) < 4:
        raise UserFacingError(f"only {len(prompts)} ShareGPT first turns from #{args.first_conversation} on: "
                              "lower --first-conversation")
    engine = load_engine(args.model, head, args.dtype, args.device, args.attn_impl, args.draft_vocab, args.kv_dtype,
                         weights=args.weights)
    tables, reports = {}, {}
    for sampling in samplings:
        name = "greedy" if sampling.greedy else "sampling"
        journal = args.journal / f"{name}-T{sampling.temperature:g}.jsonl"
        observed = collect(engine, prompts, tree, sampling, journal)
        source = (f"fitted on {len(prompts)} ShareGPT first turns (from #{args.first_conversation}) at "
                  f"T = {sampling.temperature:g}, fixed tree {args.tree} with lookup, {engine.head_name}")
        tables[name], reports[name] = fit_and_check(observed, source)
    greedy = tables.get("greedy") or tables["sampling"]
    calibration = HeadCalibration(greedy, tables.get("sampling") or greedy)
    out.mkdir(parents=True, exist_ok=True)
    (out / file_for(engine.target.weights)).write_text(calibration.to_json())
    (args.journal / "reliability.json").write_text(json.dumps(reports, indent=1))
    (args.journal / "reliability.svg").write_text(reliability_svg(reports))
    for name, rep in reports.items():
        if rep["check_cycles"]:
            print(f"{name}: predicted {rep['predicted_accepted_per_cycle']:.2f} vs actual "
                  f"{rep['actual_accepted_per_cycle']:.2f} accepted head nodes per cycle on {rep['check_cycles']} "
                  f"held-out cycles; mean abs error {rep['mean_abs_error_per_cycle']:.2f}")
        for row in rep["reliability"]:
            print(f"  score [{row['from']}, {row['to']}): predicted {row['predicted']:.3f} observed "
                  f"{row['observed']:.3f} over {row['nodes']} nodes")
    print(f"wrote {out / file_for(engine.target.weights)} and {args.journal / 'reliability.json'} (plotted in "
          f"{args.journal / 'reliability.svg'})")
    return 0
