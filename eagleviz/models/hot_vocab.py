"""The hot draft vocabulary: draft only among the most frequent tokens (FR-Spec; SGLang's
`--speculative-token-map`).

A draft step streams the head's weights and its LM head from memory; the LM head (16,384 x 576 for the
shipped head) is two thirds of those bytes, paid at every one of the `steps` draft steps. Keeping only the
N most frequent tokens of the draft vocabulary shrinks that product N/Vd-fold. The output stays exactly the
target's: the target verifies every drafted token, so a token outside the hot set can still be produced, it
just cannot be drafted. What it costs is acceptance when the target's next token is rare, which is why the
ranking comes from answer text (the tokens a chat answer uses), counted once per head and shipped with it as
`hot-tokens.json`.

EAGLE-3 heads only: they have their own LM head over a draft vocabulary with a `d2t` map, which the
restriction slices. EAGLE-1 heads use the target's LM head and are left whole.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch

from eagleviz.models.draft import DraftHead

HOT_TOKENS_FILE = "hot-tokens.json"
DEFAULT_HOT_SIZE = 4096  # docs/performance.md entry 11: no measurable loss of tau at 4,096 on MT-bench


def rank_tokens(counts: torch.Tensor, candidates: torch.Tensor) -> list[int]:
    """Target ids of `candidates` (1-D int64), most frequent first by `counts` (V,), ties by id."""
    ids = candidates.sort().values
    order = torch.argsort(counts[ids], descending=True, stable=True)
    return ids[order].tolist()


def write_ranking(head_dir: str | Path, ranking: list[int], source: str, counted_tokens: int) -> Path:
    path = Path(head_dir) / HOT_TOKENS_FILE
    path.write_text(json.dumps({"source": source, "counted_tokens": counted_tokens, "ids": ranking}) + "\n")
    return path


def read_ranking(head_dir: str | Path) -> list[int] | None:
    """The ranked target ids shipped with a head, or None when it ships none."""
    path = Path(head_dir) / HOT_TOKENS_FILE
    if not path.exists():
        return None
    ids = json.loads(path.read_text()).get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{path}: 'ids' must be a list of token ids")
    return ids


def draft_target_ids(head: DraftHead) -> torch.Tensor:
    """(Vd,) the target id of every draft id."""
    return head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=head.d2t.device))


def restrict(head: DraftHead, ranking: list[int], size: int) -> DraftHead:
    """A copy of an EAGLE-3 `head` that drafts only the `size` highest-ranked tokens of its draft vocabulary
    (ranked ids outside it are skipped, draft ids the ranking misses are dropped). The rows keep their order,
    so `d2t` stays a per-row offset. Returns `head` itself when every draft id is kept."""
    if head.config.arch != "eagle3":
        raise ValueError("a hot draft vocabulary needs an EAGLE-3 head (EAGLE-1 heads use the target's LM head)")
    if size < 1:
        raise ValueError(f"the hot vocabulary size must be at least 1, got {size}")
    targets = draft_target_ids(head)
    row_of = {t: r for r, t in enumerate(targets.tolist())}
    rows = [row_of[t] for t in ranking if t in row_of][:size]
    if len(rows) >= head.config.draft_vocab_size:
        return head
    keep = torch.tensor(sorted(rows), device=targets.device)
    small = copy.deepcopy(head)
    small.config = dataclasses.replace(head.config, draft_vocab_size=keep.numel())
    with torch.no_grad():
        small.lm_head = torch.nn.Linear(head.config.hidden_size, keep.numel(), bias=False,
                                        device=keep.device, dtype=head.lm_head.weight.dtype)
        small.lm_head.weight.copy_(head.lm_head.weight[keep])
        small.d2t = targets[keep] - torch.arange(keep.numel(), device=keep.device)
        small.t2d = torch.zeros_like(head.t2d)
        small.t2d[targets[keep]] = True
    return small
