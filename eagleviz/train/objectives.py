"""The two training objectives, on packed rows, through the engine's own `DraftHead.forward`.

Index conventions (one sequence, token x_i, target feature f_i at position i):
    draft anchor p pairs f_p with x_{p+1} and predicts x_{p+2}, whose target distribution is the target's
    output at position p + 1.

EAGLE-1 (paper section 4): one step; regress the next feature f_{p+1} (SmoothL1) and match the target
distribution through the target's LM head (soft cross-entropy, weight 0.1); uniform noise on the input
features makes the head tolerate its own feature errors at decoding time.

EAGLE-3 training-time test (paper section 3): unroll K steps as decoding will. Step k at anchor p takes the
token x_{p+1+k}, the head's own output of step k-1 as feature (target features only at step 0), the RoPE
position p + k, and is trained on the target distribution at position p + 1 + k. Its attention sees the
step-0 keys of anchors <= p (the committed prefix) and its own keys of steps 1..k (its ancestors in the
draft tree): the mask is [causal | I | ... | I] over the concatenated keys of steps 0..k. Loss = sum_k
0.8^k CE_k, CE only; positions whose target argmax lies outside the draft vocabulary are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from eagleviz.models.draft import DraftHead
from eagleviz.train.batches import Row
from eagleviz.train.cache import ListKVCache


@dataclass
class TargetParts:
    """What training borrows from the frozen target: its embedding and LM head, both (V, H)."""

    embed: torch.Tensor
    lm_head: torch.nn.Module


@dataclass
class StepResult:
    """Loss and accuracy of one forward of a row. acc[k] / count[k]: top-1 agreement with the target at
    unroll step k (k = 0 is the ordinary next-next-token prediction)."""

    loss: torch.Tensor
    correct: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)


def block_causal(seq: torch.Tensor) -> torch.Tensor:
    """(R,) sequence ids -> (R, R) bool: i may attend to j iff same sequence and j <= i."""
    r = seq.shape[0]
    same = seq[:, None] == seq[None, :]
    return same & torch.ones(r, r, dtype=torch.bool, device=seq.device).tril()


def ttt_mask(seq: torch.Tensor, k: int) -> torch.Tensor:
    """(R,) sequence ids -> (R, (k + 1) R) bool mask of unroll step k over the keys of steps 0..k."""
    r = seq.shape[0]
    eye = torch.eye(r, dtype=torch.bool, device=seq.device)
    return torch.cat([block_causal(seq)] + [eye] * k, dim=1)


def shifted(x: torch.Tensor, k: int, fill=0) -> torch.Tensor:
    """x[i + k] at row i, `fill` past the end."""
    if k == 0:
        return x
    pad = torch.full((k,) + tuple(x.shape[1:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat((x[k:], pad))


def valid_at(row: Row, k: int) -> torch.Tensor:
    """(R,) bool: anchor p has a prediction at step k, i.e. x_{p+2+k} is an answer token of p's sequence."""
    j = 2 + k
    return (shifted(row.seq, j, -1) == row.seq) & shifted(row.mask, j, False)


def _masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (x * valid).sum() / valid.sum().clamp(min=1)


def _agreement(head: DraftHead, logits: torch.Tensor, target_top: torch.Tensor, valid: torch.Tensor):
    pred = head.to_target_ids(logits.argmax(-1))
    return int(((pred == target_top) & valid).sum()), int(valid.sum())


def ttt_loss(head: DraftHead, row: Row, parts: TargetParts, steps: int = 5, decay: float = 0.8,
             impl: str = "torch") -> StepResult:
    """EAGLE-3 training-time test over `steps` unroll steps (any head arch; EAGLE-1 heads take their own
    output through fc like at decoding time)."""
    c = head.config
    feats = row.aux if c.arch == "eagle3" else row.final
    with torch.no_grad():
        emb = F.embedding(row.ids, parts.embed)
        w_draft = parts.lm_head.weight if c.arch == "eagle1" else parts.lm_head.weight[head.to_target_ids(
            torch.arange(c.draft_vocab_size, device=row.ids.device))]
        probs = torch.softmax((row.final @ w_draft.T).float(), dim=-1)
        in_vocab = head.t2d[row.top] if c.arch == "eagle3" else torch.ones_like(row.mask)
    cache = ListKVCache(len(head.blocks))
    result = StepResult(loss=torch.zeros((), device=row.ids.device))
    for k in range(steps):
        h = head(feats, shifted(emb, 1 + k), row.pos + k, cache, ttt_mask(row.seq, k), impl)
        logits = head.logits(h, parts.lm_head)
        valid = valid_at(row, k) & shifted(in_vocab, 1 + k, False)
        ce = F.cross_entropy(logits, shifted(probs, 1 + k), reduction="none")
        result.loss = result.loss + decay ** k * _masked_mean(ce, valid)
        ok, n = _agreement(head, logits.detach(), shifted(row.top, 1 + k), valid)
        result.correct.append(ok)
        result.count.append(n)
        feats = h
    return result


def eagle1_loss(head: DraftHead, row: Row, parts: TargetParts, noise: float = 0.2, p_weight: float = 0.1,
                gen: torch.Generator | None = None, impl: str = "torch") -> StepResult:
    """EAGLE-1: SmoothL1 to the next target feature + p_weight x soft CE through the target LM head, with
    uniform noise U(-noise/2, noise/2) on the input features. Needs an EAGLE-1 head."""
    if head.config.arch != "eagle1":
        raise ValueError("the EAGLE-1 objective regresses the target's final feature: it needs an eagle1 head")
    with torch.no_grad():
        emb = F.embedding(row.ids, parts.embed)
        jitter = (torch.rand(row.final.shape, generator=gen, device=row.final.device) - 0.5) * noise
        feats = (row.final.float() + jitter).to(row.final.dtype)
        next_feat = shifted(row.final, 1)
        probs = torch.softmax(parts.lm_head(next_feat).float(), dim=-1)
    cache = ListKVCache(len(head.blocks))
    h = head(feats, shifted(emb, 1), row.pos, cache, block_causal(row.seq), impl)
    logits = head.logits(h, parts.lm_head)
    valid = valid_at(row, 0)
    vloss = F.smooth_l1_loss(h.float(), next_feat.float(), reduction="none").mean(-1)
    ploss = F.cross_entropy(logits, probs, reduction="none")
    ok, n = _agreement(head, logits.detach(), shifted(row.top, 1), valid)
    return StepResult(loss=_masked_mean(vloss + p_weight * ploss, valid), correct=[ok], count=[n])
