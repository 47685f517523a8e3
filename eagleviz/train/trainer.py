"""The training loop: AdamW over packed rows, warmup + cosine schedule, checkpoints, held-out curves.

The run directory holds
    ckpt.pt       full state (fp32 head, optimizer, step, history): `--resume` continues from it
    head/         the head in the official EAGLE layout (config.json + model.safetensors, bf16), refreshed
                  at every checkpoint, so eval-head can measure a run while it trains
    history.json  the metrics of every evaluation; curve.html plots them
Step s trains row s mod R of epoch s // R, with rows packed by a seed that depends on the epoch: the data
order is a function of the step alone, so a resumed run sees exactly what an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from eagleviz.models.draft import DraftConfig, DraftHead, save_head
from eagleviz.train.batches import Row, pack
from eagleviz.train.features import FeatureShard, OnlineFeatures
from eagleviz.train.objectives import TARGET_DISTS, StepResult, TargetParts, eagle1_loss, ttt_loss

OBJECTIVES = ("ttt", "eagle1")


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters. `objective` ttt = EAGLE-3 training-time test, eagle1 = feature regression + soft CE."""

    arch: str = "eagle3"
    objective: str = "ttt"
    ttt_steps: int = 5
    ttt_decay: float = 0.8
    unroll_fraction: float = 0.25
    target_dist: str = "top8"
    noise: float = 0.2
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    row_len: int = 2048
    epochs: int = 2
    max_steps: int = 0
    eval_every: int = 50
    eval_rows: int = 4
    ckpt_minutes: float = 5.0
    autocast: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.objective == "eagle1" and self.arch != "eagle1":
            raise ValueError("the eagle1 objective regresses the target's final feature: use arch eagle1")
        if self.target_dist not in TARGET_DISTS:
            raise ValueError(f"target_dist must be one of {TARGET_DISTS}, got {self.target_dist!r}")
        if self.target_dist == "dense" and self.arch != "eagle3":
            raise ValueError("the dense target spans an EAGLE-3 draft vocabulary: use arch eagle3")
        if self.ttt_steps < 1 or self.row_len < 16:
            raise ValueError("ttt_steps must be >= 1 and row_len >= 16")


def lr_at(cfg: TrainConfig, step: int, total: int) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio x lr at `total`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, total - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def new_head(target, arch: str, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None,
             seed: int = 0) -> DraftHead:
    """A fresh fp32 head for `target`. EAGLE-3 heads start their LM head and final norm from the target's
    (rows of the draft vocabulary): the head then only has to learn to produce target-like final states."""
    torch.manual_seed(seed)
    vd = None if d2t is None else d2t.numel()
    head = DraftHead(DraftConfig.for_target(target, arch, draft_vocab_size=vd)).float()
    if arch == "eagle3":
        with torch.no_grad():
            if d2t is not None:
                head.d2t.copy_(d2t)
                head.t2d.copy_(t2d)
            rows = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
            head.lm_head.weight.copy_(target.lm_head.weight[rows].float())
            head.norm.weight.copy_(target.hf.model.norm.weight.float())
    return head


class Trainer:
    """Trains `head` on the rows of `data`; measures it on the rows of `heldout`. `data` is a FeatureShard, or
    `OnlineFeatures` whose rows the target computes when asked (`eagleviz.train.features`); rows go to the
    head's device."""

    def __init__(self, cfg: TrainConfig, head: DraftHead, parts: TargetParts, data: FeatureShard | OnlineFeatures,
                 heldout: FeatureShard, out_dir: Path):
        self.cfg, self.head, self.parts, self.data, self.out = cfg, head, parts, data, out_dir
        self.device = next(head.parameters()).device
        self.lengths = [int(n) for n in data.offsets.diff()]
        self.rows_per_epoch = len(pack(self.lengths, cfg.row_len, cfg.seed))
        self.total = cfg.max_steps or cfg.epochs * self.rows_per_epoch
        ho_lengths = [int(n) for n in heldout.offsets.diff()]
        self.heldout = [heldout.row(r).to(self.device) for r in pack(ho_lengths, cfg.row_len, 0)[:cfg.eval_rows]]
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.step, self.elapsed, self.history = 0, 0.0, []
        self._epoch_rows: tuple[int, list[list[int]]] | None = None

    # ------------------------------------------------------------------ state
    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        state = {"config": asdict(self.cfg), "head": self.head.state_dict(), "opt": self.opt.state_dict(),
                 "step": self.step, "elapsed": self.elapsed, "history": self.history,
                 "head_config": self.head.config.to_hf()}
        tmp = self.out / "ckpt.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(self.out / "ckpt.pt")
        save_head(self.head, self.out / "head")
        (self.out / "history.json").write_text(json.dumps(self.history, indent=1) + "\n")
        from eagleviz.train.plot import write_curve

        write_curve(self.history, self.out / "curve.html", title=f"{self.cfg.arch} / {self.cfg.objective}")

    def load(self) -> None:
        state = torch.load(self.out / "ckpt.pt", map_location="cpu", weights_only=False)
        self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.elapsed, self.history = state["step"], state["elapsed"], state["history"]

    # ------------------------------------------------------------------ one step
    def row(self, step: int) -> Row:
        epoch, i = divmod(step, self.rows_per_epoch)
        if self._epoch_rows is None or self._epoch_rows[0] != epoch:
            self._epoch_rows = (epoch, pack(self.lengths, self.cfg.row_len, self.cfg.seed + epoch))
        rows = self._epoch_rows[1]
        return self.data.row(rows[i % len(rows)]).to(self.device)  # packings of other epochs may differ by a row

    def _autocast(self):
        dtype = self.parts.embed.dtype
        if self.cfg.autocast and dtype in (torch.bfloat16, torch.float16):
            return torch.autocast("cpu" if self.parts.embed.device.type == "cpu" else "cuda", dtype=dtype)
        return nullcontext()

    def objective(self, row: Row, train: bool) -> StepResult:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)  # a function of the step: resumable
        if cfg.objective == "eagle1" and train:
            return eagle1_loss(self.head, row, self.parts, noise=cfg.noise, gen=gen)
        return ttt_loss(self.head, row, self.parts, steps=cfg.ttt_steps, decay=cfg.ttt_decay,
                        unroll_fraction=cfg.unroll_fraction if train else 1.0, gen=gen, target_dist=cfg.target_dist)

    def train_step(self) -> StepResult:
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.cfg, self.step, self.total)
        self.head.train()
        row = self.row(self.step)
        with self._autocast():
            result = self.objective(row, train=True)
        self.opt.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.step += 1
        return result

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out CE (training-time-test loss) and top-1 agreement with the target per unroll step."""
        self.head.eval()
        losses, correct, count = [], None, None
        with self._autocast():
            for row in self.heldout:
                r = ttt_loss(self.head, row, self.parts, steps=self.cfg.ttt_steps, decay=self.cfg.ttt_decay,
                             target_dist=self.cfg.target_dist)
                losses.append(float(r.loss))
                correct = r.correct if correct is None else [a + b for a, b in zip(correct, r.correct)]
                count = r.count if count is None else [a + b for a, b in zip(count, r.count)]
        return {"loss": sum(losses) / len(losses), "acc": [a / max(n, 1) for a, n in zip(correct, count)]}

    def fit_schedule(self, seconds: float, steps_per_s: float) -> int:
        """Make the schedule end when `seconds` more of training at `steps_per_s` end (a time budget instead of
        a step count: the cosine decays over the steps that fit); returns the new total."""
        self.total = max(self.step + 1, self.step + int(seconds * steps_per_s))
        return self.total

    # ------------------------------------------------------------------ the loop
    def run(self, minutes: float | None = None, progress=None) -> None:
        """Train until the schedule ends or `minutes` of wall time pass (then checkpoint and return)."""
        start, last_ckpt = time.perf_counter(), time.perf_counter()
        base_elapsed = self.elapsed
        window: list[StepResult] = []
        if self.step == 0 and not self.history:
            self._record(window)
        while self.step < self.total:
            result = self.train_step()
            window.append(StepResult(loss=result.loss.detach(), correct=result.correct, count=result.count))
            self.elapsed = base_elapsed + time.perf_counter() - start
            if progress is not None:
                progress.update(1)
                progress.set_postfix(loss=f"{float(result.loss.detach()):.3f}",
                                     acc=f"{result.correct[0] / max(result.count[0], 1):.3f}")
            out_of_time = minutes is not None and time.perf_counter() - start > minutes * 60
            if self.step % self.cfg.eval_every == 0 or self.step == self.total or out_of_time:
                self._record(window)
                window = []
            if out_of_time or time.perf_counter() - last_ckpt > self.cfg.ckpt_minutes * 60:
                self.save()
                last_ckpt = time.perf_counter()
            if out_of_time:
                return
        self.save()

    def _record(self, window: list[StepResult]) -> None:
        entry = {"step": self.step, "elapsed_s": round(self.elapsed, 1), "lr": lr_at(self.cfg, self.step, self.total),
                 "heldout": self.evaluate()}
        if window:
            steps = len(window[0].count)
            entry["train"] = {"loss": sum(float(w.loss) for w in window) / len(window),
                              "acc": [sum(w.correct[k] for w in window) / max(1, sum(w.count[k] for w in window))
                                      for k in range(steps)]}
        self.history.append(entry)
