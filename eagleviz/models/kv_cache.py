"""A preallocated key/value cache with an explicit length, and the commit that rewinds it.

Layout: k, v are (layers, Hkv, capacity, D). Slots [0, length) hold committed positions. A forward over T
new tokens writes slots [length, length + T) and then advances `length` by T. After verification the
engine calls `commit_path`: the slots of the accepted path are gathered into contiguous positions right
after the committed prefix and `length` is set just past them. Nothing is freed: the rejected tree slots
beyond `length` are simply overwritten by the next cycle. This is the "KV rewind".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagleviz.models.host import to_device


@dataclass
class KVCache:
    """k, v: (layers, Hkv, capacity, D); `length` is the number of valid leading slots."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    @classmethod
    def allocate(cls, layers: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> KVCache:
        shape = (layers, kv_heads, capacity, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @staticmethod
    def bytes_for(layers: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype) -> int:
        """Memory a cache of this shape takes (keys and values)."""
        return 2 * layers * kv_heads * capacity * head_dim * torch.empty((), dtype=dtype).element_size()

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: (T, Hkv, D) written at slots [start, start + T) of `layer`."""
        end = start + k.shape[0]
        if end > self.capacity:
            raise ValueError(f"KV cache overflow: need {end} slots, capacity {self.capacity}")
        self.k[layer, :, start:end] = k.transpose(0, 1)
        self.v[layer, :, start:end] = v.transpose(0, 1)

    def view(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n slots of `layer` as (n, Hkv, D) strided views (no copy)."""
        return self.k[layer, :, :n].transpose(0, 1), self.v[layer, :, :n].transpose(0, 1)

    def advance(self, n: int) -> None:
        self.length += n

    def rewind(self, length: int) -> None:
        """Forget every slot at or beyond `length` (they will be overwritten)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind a cache of length {self.length} to {length}")
        self.length = length

    def commit_path(self, start: int, slots: list[int]) -> list[tuple[int, int]]:
        """Compact the accepted path: cache slots `slots` (absolute, ascending) move to start, start+1, ...

        Returns the (source, destination) slot pairs that actually moved; sets length = start + len(slots).
        The gather happens before the scatter (index_select copies), so overlapping moves are safe.
        """
        moves = self.settle(start, slots)
        if moves:  # the slot indices travel without making the host wait for the queued kernels
            src = to_device([m[0] for m in moves], self.k.device)
            dst = to_device([m[1] for m in moves], self.k.device)
            self.k.index_copy_(2, dst, self.k.index_select(2, src))
            self.v.index_copy_(2, dst, self.v.index_select(2, src))
        return moves

    def settle(self, start: int, slots: list[int]) -> list[tuple[int, int]]:
        """`commit_path`'s bookkeeping alone (the moves already made on the device, `commit_moves`): the pairs
        that move, and length = start + len(slots)."""
        self.length = start + len(slots)
        return [(s, start + i) for i, s in enumerate(slots) if s != start + i]

    def commit_moves(self, start: torch.Tensor, path: torch.Tensor) -> None:
        """`commit_path`'s moves with everything on the device: slot start + path[i] to start + i for every i of
        path (n,) (relative slots; a place the walk did not accept holds i: a move onto itself), start (1,)."""
        dst = start + torch.arange(path.numel(), device=path.device)
        src = start + path
        self.k.index_copy_(2, dst, self.k.index_select(2, src))
        self.v.index_copy_(2, dst, self.v.index_select(2, src))
