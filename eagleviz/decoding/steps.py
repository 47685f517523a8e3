"""How an engine's runs get their target steps and draft state: the decode path, and the static states it
lends each run (`eagleviz.models.static`, `eagleviz.decoding.device_draft`) and takes back when the run ends.

    eager    `TargetModel.forward` over a run's own cache, the host drafting level by level (a CPU's path)
    static   the target's steps over a static state leased from the engine's pool, the head's levels drafted
             in one call, both uncaptured
    graphs   the same, each captured once per size bucket in a CUDA graph and replayed
    auto     graphs on CUDA, eager on a CPU and on a ZeroGPU Space
"""

from __future__ import annotations

import os

import torch

from eagleviz.config import TreeConfig
from eagleviz.decoding.device_draft import DeviceDrafter
from eagleviz.models.kv_cache import KVCache
from eagleviz.models.static import BUCKETS, EagerSteps, StaticSteps, capacity_bucket
from eagleviz.trace import RunTrace

DECODE_PATHS = ("auto", "graphs", "static", "eager")


def zero_gpu() -> bool:
    """Whether this process serves a ZeroGPU Space (SPACES_ZERO_GPU set): a GPU is attached only inside each
    `spaces.GPU` call, never at start-up."""
    return bool(os.environ.get("SPACES_ZERO_GPU"))


def decode_path(path: str, device: torch.device | str) -> tuple[str, list[str]]:
    """The step path `path` resolves to on `device`, and the notes a run's trace carries about it. 'auto': CUDA
    graphs on CUDA, except on a ZeroGPU Space (SPACES_ZERO_GPU set), whose GPU is attached per call, so neither a
    graph captured in one call nor a static state kept on the GPU between calls can be trusted in the next:
    there each run's own cache, eagerly; on a CPU the eager forward too (its C layer needs no capture, and keeps
    its bit-for-bit sums)."""
    device = torch.device(device)
    if path not in DECODE_PATHS:
        raise ValueError(f"the decode path must be one of {DECODE_PATHS}, got {path!r}")
    if path == "graphs" and device.type != "cuda":
        raise ValueError("CUDA graphs need a CUDA device: choose the decode path 'static' or 'eager' on a CPU")
    if path == "auto":
        if device.type != "cuda":
            return "eager", []
        if zero_gpu():
            return "eager", ["On a ZeroGPU Space the GPU is attached per call, so each run decodes eagerly over its "
                             "own cache (no CUDA graphs, which could not outlive the call)."]
        path = "graphs"
    if path == "graphs":
        return path, [f"The target's steps replay CUDA graphs captured at {', '.join(map(str, BUCKETS))} tokens "
                      "over a static cache."]
    return path, ([f"The target's steps run uncaptured over a static cache (decode path '{path}')."]
                  if path == "static" else [])


def target_steps(engine, capacity: int, feature_layers: tuple[int, ...] | None) -> EagerSteps | StaticSteps:
    """The target's steps for one run of `capacity` slots: over the run's own cache (eager), or over a static
    state leased from the engine's pool (give it back with `release`)."""
    if engine.decode == "eager":
        return EagerSteps(engine.target, capacity, engine.attn_impl, feature_layers)
    capacity = capacity_bucket(capacity, engine.target.max_positions)
    return engine.pool.lease(("target", engine.attn_impl, feature_layers, capacity),
                             lambda: StaticSteps(engine.target, capacity, engine.attn_impl, feature_layers,
                                                 engine.make_graphs()))


def draft_state(engine, capacity: int, tree: TreeConfig) -> KVCache | DeviceDrafter:
    """The head's cache for one run: a `KVCache` the host drafts into level by level (eager), or, beside static
    target steps, a `DeviceDrafter` that drafts every level in one captured call."""
    if engine.decode == "eager":
        return engine.head.new_cache(capacity + tree.draft_expansion, engine.target.kv_dtype, engine.target.device)
    return engine.pool.lease(("draft", engine.attn_impl, capacity, tree.topk, tree.steps),
                             lambda: DeviceDrafter(engine, capacity, tree, engine.make_graphs()))


STATIC = (StaticSteps, DeviceDrafter)  # the states a pool lends, which capture as they go


def release(engine, run: RunTrace | None, *states) -> None:
    """A run's end: its static states go back to the pool; a capture that failed is said in the run's notes, and
    its decode path is then 'static' (uncaptured)."""
    for state in states:
        if isinstance(state, STATIC):
            if run is not None and state.fallback:
                run.decode = "static"
                if state.fallback not in run.notes:
                    run.notes.append(state.fallback)
            engine.pool.give_back(state)


def prepared(*states) -> int:
    """How many step sizes a run's static states have made ready: a cycle in which this grew captured a CUDA
    graph, which took longer than any later cycle of that size will (the `Ledger` leaves such a cycle out)."""
    return sum(state.prepared for state in states if isinstance(state, STATIC))


def static_states(*states) -> bool:
    """Whether any of a run's states is static (`prepared` can grow as it goes); a run on eager states alone
    never captures."""
    return any(isinstance(state, STATIC) for state in states)
