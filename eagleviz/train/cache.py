"""A key/value cache that autograd can see through.

`eagleviz.models.kv_cache.KVCache` writes in place into preallocated tensors, which breaks backpropagation. This
cache keeps, per layer, the list of written blocks and joins them with `torch.cat` when read, so gradients
flow to every key and value. It has the interface `DraftHead.forward` uses (write, view, length, advance),
which lets training run the very forward the engine runs.
"""

from __future__ import annotations

import torch


class ListKVCache:
    """Per-layer lists of (T, Hkv, D) key and value blocks, appended in order."""

    def __init__(self, layers: int):
        self.k: list[list[torch.Tensor]] = [[] for _ in range(layers)]
        self.v: list[list[torch.Tensor]] = [[] for _ in range(layers)]
        self.length = 0

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append a block; blocks must be written in order (start = current end of this layer)."""
        end = sum(block.shape[0] for block in self.k[layer])
        if start != end:
            raise RuntimeError(f"ListKVCache only appends: write at {start}, layer {layer} ends at {end}")
        self.k[layer].append(k)
        self.v[layer].append(v)

    def view(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n slots of `layer` as (n, Hkv, D)."""
        k, v = torch.cat(self.k[layer]), torch.cat(self.v[layer])
        if k.shape[0] < n:
            raise RuntimeError(f"ListKVCache layer {layer} holds {k.shape[0]} slots, {n} requested")
        return k[:n], v[:n]

    def advance(self, n: int) -> None:
        self.length += n
