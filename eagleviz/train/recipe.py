"""`train-head --online --minutes M` (implied by `--device cuda`): the whole head recipe in one command and one
time budget, for a GPU lent for half an hour.

    1) answers   the target answers the training prompts itself, greedily and sampled at T = 1 (EAGLE-3's
                 self-distillation), shard by shard (240 prompts) alternating the two, at the device's batch
                 size, until `answer_share` of the budget is spent or every prompt is answered. Answers are
                 cached as JSON lines (about 1 kB each), so a second run goes on where this one stopped.
    2) train     the training-time test on rows whose target features are computed when the row is needed
                 (`eagleviz.train.features.OnlineFeatures`: nothing on disk). A probe measures the steps per
                 second, then the warmup + cosine schedule is fitted to end when the budget (less what the
                 measurement needs) ends; a checkpoint every `ckpt_minutes`; `--resume` continues it.
    3) measure   eval-head --quick on the head: tau at T = 0 and 1 on MT-bench, held-out top-1.
Everything it measured goes to RUN/recipe.json (and eval.json): the answers' and the training's tokens per
second on this device are the figures docs/training.md plans a GPU run with.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from eagleviz.train import data as D
from eagleviz.train import pipeline as P
from eagleviz.train.batches import pack
from eagleviz.train.features import OnlineFeatures, collect
from eagleviz.train.trainer import Trainer, TrainConfig

SHARD = 240
OPEN_SCHEDULE = 10**9  # the probe's schedule length: warmup, then a learning rate that has not begun to decay


@dataclass(frozen=True)
class Budget:
    """How a run of `minutes` spends them. answer_share: at most this fraction on answers; eval_share: kept
    for the final measurement; probe_s: training seconds that measure the step rate before the schedule is
    fitted. gen_batch: prompts answered at once; gen_tokens: the longest answer."""

    minutes: float
    answer_share: float = 0.4
    eval_share: float = 0.1
    probe_s: float = 60.0
    gen_batch: int = 64
    gen_tokens: int = 256

    def __post_init__(self):
        if self.minutes <= 0 or not 0 < self.answer_share < 1 or not 0 <= self.eval_share < 1:
            raise ValueError(f"a budget needs minutes > 0 and shares in (0, 1), got {self}")
        if self.answer_share + self.eval_share >= 1:
            raise ValueError("answer_share + eval_share must leave time to train")


def answers_dir(cache: Path, source: str, cfg: P.DataConfig, gen_tokens: int) -> Path:
    """Where the answers of `source` are cached: the staged pipeline's folder (shared), keyed by length."""
    name = "answers" if source == "self" else f"answers-sampled-T{P.SAMPLED_TEMPERATURE:g}"
    return cache / (name + cfg.cache_suffix + ("" if gen_tokens == 256 else f"-N{gen_tokens}"))


def answer(target, asked: list[str], cfg: P.DataConfig, cache: Path, budget: Budget, deadline: float,
           log=print) -> tuple[dict[str, int], dict]:
    """Answer `asked` with each self-generated source, shard by shard in turn, until `deadline`: (prompts
    answered per source, what this run generated: shards, answer tokens, seconds)."""
    sources = [s for s in cfg.sources if s != "original"]
    done = {s: 0 for s in sources}
    before = {s: set(answers_dir(cache, s, cfg, budget.gen_tokens).glob("*.jsonl")) for s in sources}
    start = time.monotonic()
    for end in range(SHARD, len(asked) + SHARD, SHARD):
        for source in sources:
            temperature = P.SAMPLED_TEMPERATURE if source == "sampled" else 0.0
            done[source] = D.generate_answers(target, asked[:end], answers_dir(cache, source, cfg, budget.gen_tokens),
                                              batch_size=budget.gen_batch, max_new_tokens=budget.gen_tokens,
                                              temperature=temperature, seed=cfg.seed, deadline=deadline)
        log(f"answers: {', '.join(f'{s} {n}' for s, n in done.items())} of {len(asked)} prompts "
            f"({time.monotonic() - start:.0f} s)")
        if time.monotonic() > deadline:
            break
    new = [f for s in sources for f in answers_dir(cache, s, cfg, budget.gen_tokens).glob("*.jsonl")
           if f not in before[s]]
    tokens = sum(len(r["ids"]) - r["answer_start"] for f in new for r in map(json.loads, f.read_text().splitlines()))
    seconds = time.monotonic() - start
    return done, {"new_shards": len(new), "new_answer_tokens": tokens, "seconds": round(seconds, 1),
                  "answer_tokens_per_s": round(tokens / seconds, 1) if new else None}


def training_samples(target, prompts, train_idx: list[int], cfg: P.DataConfig, cache: Path, done: dict[str, int],
                     gen_tokens: int) -> list[D.Sample]:
    """Every answered conversation, once per source (the file's own answers included when asked for)."""
    samples = []
    for source in cfg.sources:
        if source == "original":
            samples += P.train_samples(target, cfg, prompts, train_idx, cache, source="original")
        elif done[source]:
            samples += D.read_answers(answers_dir(cache, source, cfg, gen_tokens), done[source], SHARD)
    return samples


def heldout_rows(target, prompts, held_idx: list[int], cache: Path, tcfg: TrainConfig, budget: Budget, max_len: int):
    """Features of the held-out conversations the training curve reads (the target's greedy answers to the
    held-out prompts, cached where eval-head's top-1 finds them): the first `eval_rows` packed rows only,
    computed once and kept in memory."""
    folder = cache / f"answers-heldout-{len(held_idx)}"
    asked = [prompts[i][0] for i in held_idx]
    D.generate_answers(target, asked, folder, batch_size=budget.gen_batch)
    samples = D.read_answers(folder, len(asked))
    rows = pack([min(len(s.ids), max_len) for s in samples], tcfg.row_len, 0)[:tcfg.eval_rows]
    return collect(target, [samples[i] for row in rows for i in row], max_len)


class _StepClock:
    """Stands in for a progress bar to time the steps of a probe (the first `skip` include warming up)."""

    def __init__(self, skip: int = 3):
        self.times, self.skip = [], skip

    def update(self, n: int = 1) -> None:
        self.times.append(time.monotonic())

    def set_postfix(self, **values) -> None:
        pass

    @property
    def steps_per_s(self) -> float | None:
        steady = self.times[self.skip:]
        return (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 2 else None


def train(trainer: Trainer, seconds: float, budget: Budget, log=print, max_steps: int | None = None) -> dict:
    """Train for `seconds`: a fresh run first probes its step rate on an open schedule, a resumed one reads it
    from its history; then the schedule is fitted to the time left. `max_steps`: the schedule is that many steps
    in all instead (a resumed run goes on to it), and the run ends with them if the time has not ended it first."""
    start, first, rate = time.monotonic(), trainer.step, None
    if max_steps is not None:
        trainer.total = max(max_steps, trainer.step)
        log(f"train: a schedule of {trainer.total} steps (--max-steps), within {seconds:.0f} s")
    else:
        rate = trainer.step / max(trainer.elapsed, 1e-9)  # a resumed run's history
        if trainer.step == 0:
            trainer.total = OPEN_SCHEDULE
            clock = _StepClock()
            trainer.run(minutes=min(budget.probe_s, seconds / 4) / 60, progress=clock)
            rate = clock.steps_per_s or trainer.step / max(trainer.elapsed, 1e-9)
        # 5% under the measured rate: evaluations and checkpoints the probe may not have met take time too
        total = trainer.fit_schedule(max(0.0, seconds - (time.monotonic() - start)), 0.95 * rate)
        log(f"train: {rate:.2f} steps/s measured; schedule fitted to {total} steps")
    trainer.run(minutes=max(0.0, seconds - (time.monotonic() - start)) / 60)
    rate = rate if rate is not None else trainer.step / max(trainer.elapsed, 1e-9)   # --max-steps: the whole run's
    return {"steps": trainer.step, "this_run_steps": trainer.step - first, "schedule_steps": trainer.total,
            "steps_per_s": round(rate, 3), "seconds": round(time.monotonic() - start, 1)}


def run(target, args, dcfg: P.DataConfig, tcfg: TrainConfig, budget: Budget, out: Path, cache: Path,
        eval_prompts: str, log=print) -> dict:
    """The three phases within the budget (see the module docstring); returns what recipe.json records."""
    import torch

    from eagleviz.train.evaluate import EvalConfig, evaluate_head, format_report

    start = time.monotonic()
    end = start + budget.minutes * 60
    prompts = D.load_prompts(dcfg.data)
    train_idx, held_idx = D.split(len(prompts), dcfg.heldout, dcfg.seed)
    asked = [prompts[i][0] for i in dcfg.chosen(train_idx)]
    done, generated = answer(target, asked, dcfg, cache, budget, start + budget.answer_share * budget.minutes * 60, log)
    samples = training_samples(target, prompts, train_idx, dcfg, cache, done, budget.gen_tokens)
    data = OnlineFeatures(target, samples, dcfg.max_len)
    heldout = heldout_rows(target, prompts, held_idx, cache, tcfg, budget, dcfg.max_len)
    log(f"training data: {len(samples)} conversations, {data.num_tokens} tokens ({int(data.mask.sum())} answer "
        f"tokens), features computed online on {target.device}")
    head = _head(target, args, data, out)
    trainer = Trainer(tcfg, head.to(target.device), P.target_parts(target), data, heldout, out)
    if args.resume:
        trainer.load()
    seconds = end - budget.eval_share * budget.minutes * 60 - time.monotonic()
    trained = train(trainer, seconds, budget, log, getattr(args, "max_steps", None))
    tokens = data.num_tokens
    trained["tokens_per_s"] = round(trained["steps_per_s"] * tokens / trainer.rows_per_epoch, 1)
    if tcfg.arch == "eagle3":
        P.write_hot_tokens(trainer.head, data, out / "head", f"{dcfg.data} self-generated answers ({dcfg.answers})")
    eval_cfg = EvalConfig(head=str(out / "head"), target=args.target, prompts=eval_prompts, limit=args.eval_limit,
                          max_new_tokens=args.eval_tokens, heldout=dcfg.heldout, max_len=dcfg.max_len, chain=False,
                          dtype=args.dtype, cache=str(cache.parent), draft_vocab=4096, heldout_answers="self",
                          device=str(target.device), data=dcfg.data)
    del trainer, data
    if target.device.type == "cuda":
        torch.cuda.empty_cache()
    report = evaluate_head(eval_cfg)
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    log(format_report(report))
    record = {"budget": asdict(budget), "device": str(target.device), "target": target.name,
              "answers": {"prompts": len(asked), "answered": done} | generated,
              "training": {"conversations": len(samples), "tokens": tokens} | trained,
              "eval": {name: {"tau": round(r["tau"], 3)} for name, r in report["runs"].items()}
              | {"heldout_top1": report.get("heldout", {}).get("top1_by_unroll_step")},
              "minutes": round((time.monotonic() - start) / 60, 2)}
    (out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _head(target, args, data: OnlineFeatures, out: Path):
    """The head to train: the checkpoint's shape (--resume), the --init head, or a new one (EAGLE-3: its draft
    vocabulary chosen from the answers)."""
    from eagleviz.train.trainer import new_head

    if args.resume:
        return P.resumed_head(out / "ckpt.pt", args.arch)
    if args.init:
        return P.init_head(target, args.init, args.arch, args.draft_vocab or None, args.add_layers)
    d2t = t2d = None
    if args.arch == "eagle3":
        d2t, t2d, _ = P.choose_vocab(data, target.vocab_size, target.eos_token_ids, args.draft_vocab or None)
    return new_head(target, args.arch, d2t, t2d, seed=args.seed)
