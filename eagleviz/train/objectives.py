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
0.8^k CE_k, CE only; positions whose target argmax lies outside the draft vocabulary are skipped. The target
distribution is either the target's top-8 (stored with the features) renormalised over the draft vocabulary
("top8"), or its whole distribution over the draft vocabulary ("dense"): softmax of the target's LM-head rows
of the draft vocabulary applied to the stored final state, which is exactly the target's full distribution
conditioned on the draft vocabulary, computed per row for a (R x H x Vd) product (cheap for a hot vocabulary
of a few thousand tokens).
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
    """What training borrows from the frozen target: its embedding weight (V, H) and its LM head module."""

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


def compute_dtype(head: DraftHead, device: torch.device) -> torch.dtype:
    """The dtype activations should enter the head in: autocast's when it is on, else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return head.fc.weight.dtype


def _masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (x * valid).sum() / valid.sum().clamp(min=1)


def _agreement(head: DraftHead, logits: torch.Tensor, target_top: torch.Tensor, valid: torch.Tensor):
    pred = head.to_target_ids(logits.argmax(-1))
    return int(((pred == target_top) & valid).sum()), int(valid.sum())


def draft_index(head: DraftHead) -> torch.Tensor:
    """(V,) int64: the draft id of each target id, -1 outside the draft vocabulary."""
    c = head.config
    if c.arch == "eagle1" or c.draft_vocab_size == c.vocab_size:
        return torch.arange(c.vocab_size)
    draft_ids = torch.arange(c.draft_vocab_size)
    index = torch.full((c.vocab_size,), -1, dtype=torch.long)
    index[head.to_target_ids(draft_ids.to(head.d2t.device)).cpu()] = draft_ids
    return index


def sparse_targets(head: DraftHead, row: Row) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's top-K distribution in draft ids: (ids (R, K) draft ids, p (R, K) renormalised over the
    draft vocabulary, in_vocab (R,) True where the target's argmax has a draft id)."""
    ids = draft_index(head).to(row.top_ids.device)[row.top_ids]
    p = row.top_p * (ids >= 0)
    return ids.clamp(min=0), p / p.sum(-1, keepdim=True).clamp(min=1e-6), ids[:, 0] >= 0


def dense_targets(head: DraftHead, row: Row, parts: TargetParts) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's whole next-token distribution over the draft vocabulary: (p (R, Vd) fp32, in_vocab (R,))."""
    rows = head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=head.lm_head.weight.device))
    weight = parts.lm_head.weight[rows.to(parts.lm_head.weight.device)]
    p = torch.softmax((row.final.to(weight.dtype) @ weight.T).float(), dim=-1)
    return p, draft_index(head).to(row.top.device)[row.top] >= 0


def sparse_cross_entropy(logits: torch.Tensor, ids: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(R,) cross-entropy of log_softmax(logits) against a distribution with mass p on ids (both (R, K))."""
    return torch.logsumexp(logits, dim=-1) - (p * logits.gather(1, ids)).sum(-1)


TARGET_DISTS = ("top8", "dense")


def ttt_loss(head: DraftHead, row: Row, parts: TargetParts, steps: int = 5, decay: float = 0.8,
             unroll_fraction: float = 1.0, gen: torch.Generator | None = None, impl: str = "torch",
             target_dist: str = "top8") -> StepResult:
    """EAGLE-3 training-time test over `steps` unroll steps (any head arch; EAGLE-1 heads take their own
    output through fc as at decoding time).

    Step 0 runs every anchor (its keys are everyone's prefix). With unroll_fraction < 1, steps >= 1 follow a
    random subset of the anchors that have a prediction at some later step: an anchor's unrolled chain
    attends only to step-0 keys and to itself, so dropping other chains changes nothing for it. The per-step losses stay
    unbiased and the unrolled steps cost that fraction of a full row. target_dist: "top8" or "dense" (an EAGLE-3
    head's whole draft vocabulary; see the module docstring).
    """
    if target_dist not in TARGET_DISTS:
        raise ValueError(f"target_dist must be one of {TARGET_DISTS}, got {target_dist!r}")
    if target_dist == "dense" and head.config.arch != "eagle3":
        raise ValueError("the dense target spans an EAGLE-3 head's draft vocabulary: it needs an eagle3 head")
    c = head.config
    n_rows = len(row)
    dtype = compute_dtype(head, row.ids.device)
    with torch.no_grad():
        emb = F.embedding(row.ids, parts.embed).to(dtype)
        if target_dist == "dense":
            dense_p, in_vocab = dense_targets(head, row, parts)
        else:
            tgt_ids, tgt_p, in_vocab = sparse_targets(head, row)
        causal = block_causal(row.seq)
    feats = (row.aux if c.arch == "eagle3" else row.final).to(dtype)
    anchors = torch.arange(n_rows, device=row.ids.device)
    cache = ListKVCache(len(head.blocks))
    result = StepResult(loss=torch.zeros((), device=row.ids.device))
    for k in range(steps):
        at = (anchors + 1 + k).clamp(max=n_rows - 1)  # the token fed, and the position of the target output
        n = anchors.numel()
        mask = causal if k == 0 else torch.cat(
            [causal[anchors]] + [torch.eye(n, dtype=torch.bool, device=causal.device)] * k, dim=1)
        h = head(feats, emb[at], row.pos[anchors] + k, cache, mask, impl)
        logits = head.logits(h, parts.lm_head)
        has_target = valid_at(row, k)[anchors]
        if target_dist == "dense":
            ce = torch.logsumexp(logits, dim=-1) - (dense_p[at] * logits).sum(-1)
        else:
            ce = sparse_cross_entropy(logits, tgt_ids[at], tgt_p[at])
        result.loss = result.loss + decay ** k * _masked_mean(ce, has_target & in_vocab[at])
        # accuracy over every position: a target argmax without a draft id counts as a miss
        ok, cnt = _agreement(head, logits.detach(), row.top[at], has_target)
        result.correct.append(ok)
        result.count.append(cnt)
        feats = h
        if k == 0 and unroll_fraction < 1.0:
            later = torch.stack([valid_at(row, j) for j in range(1, steps)]).any(0)
            keep = anchors[later]
            keep = keep[torch.randperm(keep.numel(), generator=gen)[:max(1, int(unroll_fraction * n_rows))]]
            anchors = keep.sort().values
            feats = h[anchors]
    return result


def eagle1_loss(head: DraftHead, row: Row, parts: TargetParts, noise: float = 0.2, p_weight: float = 0.1,
                gen: torch.Generator | None = None, impl: str = "torch") -> StepResult:
    """EAGLE-1: SmoothL1 to the next target feature + p_weight x soft CE through the target LM head, with
    uniform noise U(-noise/2, noise/2) on the input features. Needs an EAGLE-1 head."""
    if head.config.arch != "eagle1":
        raise ValueError("the EAGLE-1 objective regresses the target's final feature: it needs an eagle1 head")
    dtype = compute_dtype(head, row.ids.device)
    with torch.no_grad():
        emb = F.embedding(row.ids, parts.embed).to(dtype)
        jitter = (torch.rand(row.final.shape, generator=gen).to(row.final.device) - 0.5) * noise  # a CPU generator
        feats = (row.final.float() + jitter).to(dtype)
        next_feat = shifted(row.final, 1)
        probs = torch.softmax(parts.lm_head(next_feat.to(parts.lm_head.weight.dtype)).float(), dim=-1)
    cache = ListKVCache(len(head.blocks))
    h = head(feats, shifted(emb, 1), row.pos, cache, block_causal(row.seq), impl)
    logits = head.logits(h, parts.lm_head)
    valid = valid_at(row, 0)
    vloss = F.smooth_l1_loss(h.float(), next_feat.float(), reduction="none").mean(-1)
    ploss = F.cross_entropy(logits, probs, reduction="none")
    ok, n = _agreement(head, logits.detach(), shifted(row.top, 1), valid)
    return StepResult(loss=_masked_mean(vloss + p_weight * ploss, valid), correct=[ok], count=[n])
