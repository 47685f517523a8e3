"""Target features, computed once and cached to disk in shards.

The target is frozen, so its features are a fixed function of the data: one forward per sequence is
enough for every epoch and for both head architectures. A shard stores, for N tokens of S sequences:

    ids      (N,) int32     token ids, sequences concatenated
    mask     (N,) bool      loss mask (answer tokens)
    offsets  (S + 1,) int64 sequence boundaries in the concatenation
    aux      (N, 3H) bf16   inputs of target layers (2, N//2, N-3): the EAGLE-3 feature [low, mid, high]
    final    (N, H) bf16    post-final-norm hidden state: the EAGLE-1 feature, and through the target's LM head
                            the target distribution the draft learns
    top_ids  (N, K) int32   the target's K most likely next tokens at each position (argmax first)
    top_p    (N, K) fp16    their probabilities: a sparse target distribution, K = 8 holds almost all of
                            the mass of a 135M model's prediction and makes the training loss cheap

Features come from batched forwards of the Hugging Face module (right padding, causal attention: padding
never changes the real tokens' states); hooks record the inputs of the three layers, exactly the
tensors `TargetModel.forward(feature_layers=...)` returns.

On a GPU a forward of the 135M target costs less than a training step of the head, so `OnlineFeatures`
holds only the tokens and computes the features of each training row when the row is needed: the same
tensors, with nothing on disk (a shard holds ~4.7 kB per token: 1.5 GB for 330k tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eagleviz.train.batches import Row, make_row
from eagleviz.train.data import Sample


class Sequences:
    """S token sequences concatenated: `ids` (N,) and their boundaries `offsets` (S + 1,)."""

    ids: torch.Tensor
    offsets: torch.Tensor

    @property
    def num_sequences(self) -> int:
        return self.offsets.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.ids.numel()

    def sequence(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


@dataclass
class FeatureShard(Sequences):
    """Features of S sequences (see the module docstring for shapes)."""

    ids: torch.Tensor
    mask: torch.Tensor
    offsets: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor
    top_ids: torch.Tensor
    top_p: torch.Tensor

    @property
    def top(self) -> torch.Tensor:
        """(N,) the target's argmax at each position."""
        return self.top_ids[:, 0]

    def row(self, sequences: list[int]) -> Row:
        """The given sequences side by side in one training row."""
        return make_row(self, sequences)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(vars(self), tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> FeatureShard:
        return cls(**torch.load(path, map_location="cpu", weights_only=True))

    @classmethod
    def cat(cls, shards: list[FeatureShard]) -> FeatureShard:
        offsets, base = [torch.zeros(1, dtype=torch.long)], 0
        for s in shards:
            offsets.append(s.offsets[1:] + base)
            base += s.num_tokens
        return cls(torch.cat([s.ids for s in shards]), torch.cat([s.mask for s in shards]), torch.cat(offsets),
                   torch.cat([s.aux for s in shards]), torch.cat([s.final for s in shards]),
                   torch.cat([s.top_ids for s in shards]), torch.cat([s.top_p for s in shards]))


@torch.no_grad()
def target_features(target, batch: list[list[int]], k: int = 8, to_cpu: bool = True) -> list[tuple[torch.Tensor, ...]]:
    """(aux (L, 3H), final (L, H), top_ids (L, k), top_p (L, k)) for each token sequence of `batch`, from one
    padded forward; on the CPU, or where the target is (`to_cpu` False)."""
    hf = target.hf
    width = max(len(ids) for ids in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, seq in enumerate(batch):
        ids[r, :len(seq)] = torch.tensor(seq)
        attn[r, :len(seq)] = 1
    captured: dict[int, torch.Tensor] = {}
    hooks = [hf.model.layers[i].register_forward_pre_hook(
        lambda _m, args, kwargs, i=i: captured.__setitem__(i, kwargs.get("hidden_states", args[0] if args else None)),
        with_kwargs=True) for i in target.eagle3_layers]
    try:
        out = hf.model(input_ids=ids.to(target.device), attention_mask=attn.to(target.device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    final = out.last_hidden_state
    aux = torch.cat([captured[i] for i in target.eagle3_layers], dim=-1)
    top_p, top_ids = torch.softmax(target.lm_head(final).float(), dim=-1).topk(k, dim=-1)
    where = "cpu" if to_cpu else final.device
    return [(aux[r, :len(seq)].to(where, torch.bfloat16), final[r, :len(seq)].to(where, torch.bfloat16),
             top_ids[r, :len(seq)].to(where, torch.int32), top_p[r, :len(seq)].to(where, torch.float16))
            for r, seq in enumerate(batch)]


def collect(target, samples: list[Sample], max_len: int, batch_tokens: int = 4096) -> FeatureShard:
    """Features of `samples`, each cut to its first max_len tokens, in length-sorted padded batches."""
    cut = [Sample(s.ids[:max_len], s.loss_mask[:max_len]) for s in samples]
    order = sorted(range(len(cut)), key=lambda i: len(cut[i].ids))
    batches: list[list[int]] = [[]]
    for i in order:  # ascending lengths: a batch's padded width is its last sequence's length
        if batches[-1] and (len(batches[-1]) + 1) * len(cut[i].ids) > batch_tokens:
            batches.append([])
        batches[-1].append(i)
    results: dict[int, tuple] = {}
    for idx in batches:
        for i, feats in zip(idx, target_features(target, [cut[i].ids for i in idx])):
            results[i] = feats
    lengths = torch.tensor([len(s.ids) for s in cut])
    return FeatureShard(ids=torch.tensor([t for s in cut for t in s.ids], dtype=torch.int32),
                        mask=torch.tensor([m for s in cut for m in s.loss_mask], dtype=torch.bool),
                        offsets=torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0))),
                        aux=torch.cat([results[i][0] for i in range(len(cut))]),
                        final=torch.cat([results[i][1] for i in range(len(cut))]),
                        top_ids=torch.cat([results[i][2] for i in range(len(cut))]),
                        top_p=torch.cat([results[i][3] for i in range(len(cut))]))


class OnlineFeatures(Sequences):
    """Tokens of S sequences whose features the target computes when a training row asks for them (on its own
    device): the interface of a `FeatureShard` for training (ids, mask, offsets, sequence, row), without
    the features on disk or in memory."""

    def __init__(self, target, samples: list[Sample], max_len: int):
        cut = [Sample(s.ids[:max_len], s.loss_mask[:max_len]) for s in samples]
        self.target = target
        self.ids = torch.tensor([t for s in cut for t in s.ids], dtype=torch.int32)
        self.mask = torch.tensor([m for s in cut for m in s.loss_mask], dtype=torch.bool)
        lengths = torch.tensor([len(s.ids) for s in cut], dtype=torch.long)
        self.offsets = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)))

    def row(self, sequences: list[int]) -> Row:
        """The given sequences side by side in one training row, their features from one forward of the
        target (on its device)."""
        seqs = [self.ids[self.sequence(i)] for i in sequences]
        feats = target_features(self.target, [s.tolist() for s in seqs], to_cpu=False)
        lengths = torch.tensor([s.numel() for s in seqs])
        shard = FeatureShard(ids=torch.cat(seqs), mask=torch.cat([self.mask[self.sequence(i)] for i in sequences]),
                             offsets=torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0))),
                             aux=torch.cat([f[0] for f in feats]), final=torch.cat([f[1] for f in feats]),
                             top_ids=torch.cat([f[2] for f in feats]), top_p=torch.cat([f[3] for f in feats]))
        return make_row(shard, list(range(len(sequences)))).to(self.target.device)
