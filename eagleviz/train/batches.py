"""Packing: several sequences side by side in one row of tokens, kept apart by a block-diagonal mask.

A row of R tokens is one training example; its sequences never see each other (attention masks), and
positions restart at 0 in each sequence. Packing keeps every matmul large, which is what makes training on
two CPU cores reasonably fast.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass
class Row:
    """R packed tokens: ids, pos, seq (R,) int64; mask (R,) bool; aux (R, 3H), final (R, H) bf16;
    top_ids (R, K) int64 and top_p (R, K) fp32 the target's sparse next-token distribution.
    seq[i] is the index of token i's sequence within the row."""

    ids: torch.Tensor
    pos: torch.Tensor
    seq: torch.Tensor
    mask: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor
    top_ids: torch.Tensor
    top_p: torch.Tensor

    @property
    def top(self) -> torch.Tensor:
        return self.top_ids[:, 0]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def to(self, device: torch.device | str) -> Row:
        """This row on `device` (itself when it is there already)."""
        if self.ids.device == torch.device(device):
            return self
        return Row(*(getattr(self, f).to(device, non_blocking=True) for f in self.__dataclass_fields__))


def pack(lengths: list[int], row_len: int, seed: int) -> list[list[int]]:
    """Shuffle the sequences (fixed seed) and fill rows of at most row_len tokens in that order.
    A sequence longer than row_len gets a row of its own (the caller cuts sequences to max_len <= row_len)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    rows: list[list[int]] = [[]]
    used = 0
    for i in order:
        if rows[-1] and used + lengths[i] > row_len:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += lengths[i]
    return [r for r in rows if r]


def make_row(shard, sequences: list[int]) -> Row:
    """Concatenate the given sequences of a shard (`eagleviz.train.features.FeatureShard`) into one row."""
    parts = [shard.sequence(i) for i in sequences]
    cat = lambda t: torch.cat([t[s] for s in parts])  # noqa: E731
    return Row(ids=cat(shard.ids).long(), pos=torch.cat([torch.arange(s.stop - s.start) for s in parts]),
               seq=torch.cat([torch.full((s.stop - s.start,), j) for j, s in enumerate(parts)]),
               mask=cat(shard.mask), aux=cat(shard.aux), final=cat(shard.final), top_ids=cat(shard.top_ids).long(),
               top_p=cat(shard.top_p).float())
