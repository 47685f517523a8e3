"""Tiny random-weight targets and heads for fast, exact tests of the engine's invariants (built by the same
code as `--model random`: eagleviz.models.synthetic)."""

from __future__ import annotations

import dataclasses
import os
import traceback
import weakref
from typing import NoReturn
from unittest import mock

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_unflatten

from eagleviz.decoding.costs import CostModel
from eagleviz.decoding.engine import Engine
from eagleviz.models.draft import random_head
from eagleviz.models.static import Replay
from eagleviz.models.synthetic import CharTokenizer, random_hf_model
from eagleviz.models.target import TargetModel
from kernels import capability


class TinyTokenizer(CharTokenizer):
    """Token i decodes to "<i>"; characters map onto ids 1..7."""

    def __init__(self):
        super().__init__(alphabet=7)


class ChatTinyTokenizer(TinyTokenizer):
    """TinyTokenizer with a chat template: every prompt opens with the same system line and user header."""

    chat_template = "system: be brief / user: {content} / assistant:"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        return self.chat_template.format(content=messages[-1]["content"])


def tiny_target(model_type: str = "llama", vocab: int = 32, seed: int = 0, layers: int = 4,
                dtype: torch.dtype = torch.float32, scale: float = 1.0, device: str = "cpu",
                chat: bool = False) -> TargetModel:
    """A randomly initialised Llama-family model (the same weights on any `device`). `scale` multiplies the LM
    head: larger = peakier outputs. `chat`: its tokenizer has a chat template (`ChatTinyTokenizer`)."""
    shape = {"model_type": model_type, "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "max_position_embeddings": 256, "tie_word_embeddings": False}
    hf = random_hf_model(shape, seed, dtype, lm_head_scale=scale)
    hf.to(device)
    return TargetModel(hf, ChatTinyTokenizer() if chat else TinyTokenizer(), f"tiny-{model_type}")


def tiny_engine(model_type: str = "llama", arch: str = "eagle1", seed: int = 0, head_std: float = 0.5,
                prefix_cache: bool = True, **kwargs) -> Engine:
    target = tiny_target(model_type, seed=seed, **kwargs)
    return Engine(target, random_head(target, arch, seed=seed + 1, std=head_std), "random",
                  prefix_cache=prefix_cache)


# A CPU-like price list (the verification curve `tune` measured for the shipped head, assets/bench/tuned.json):
# verifying a token costs ~5% of a step, so a cost-aware tree prunes, stops early and at times rests its head
CPU_COSTS = CostModel(verify=((1, 1.0), (2, 1.09), (4, 1.17), (8, 1.38), (16, 1.85), (32, 2.93), (64, 5.19)),
                      draft_level=0.07, overhead=0.1)


def unbuilt(what: str, error: str | None) -> NoReturn:
    """A compiled kernel is missing: where this machine has a C compiler that is a failure, with the compiler's
    message (`error`: the library's `last_error`), since a kernel that does not build is a bug that would
    otherwise pass as skips; without one, a skip that says so."""
    import pytest

    compiler = capability.c_compiler()
    if compiler is not None:
        pytest.fail(f"{what} did not build although this machine has a C compiler ({compiler}): "
                    f"{error or 'no error was recorded'}")
    pytest.skip(f"{what} needs a C compiler and none is here (CC={os.environ.get('CC', 'cc')!r})")


def compiled_or_fail(load, last_error, folder, what: str):
    """`load(folder)` of a compiled kernel library, or `unbuilt`."""
    built = load(folder)
    if built is None:
        unbuilt(what, last_error(folder))
    return built


class Recording:
    """`CudaGraphs.capture` on a CPU: the step runs `warmup` times, then its operations are recorded once
    (`make_fx`: the ATen operations over the step's own tensors, with their side effects, as the recording call
    of a capture) and every replay runs that record over the same buffers without running the step's Python
    again: a Python number the step read (its cache length, a count) stays what it was at the capture, and
    every replay rewrites the same output tensors (the first replay's), as in a CUDA graph. Like a CUDA graph,
    the record holds the tensors made before the capture by weak references to their memory alone (`_memory`):
    what keeps them is what the capture returns (`static.Replay`, holding the step), and a replay that reads
    memory freed since fails (on a GPU it would read whatever the allocator put there). Tensors the recorded call made itself are
    the graph's own (its memory pool). `freeze` False replays by calling the step again (steps whose kernels
    run in Triton's interpreter, which make_fx cannot record). `captures` counts the captures made."""

    captured = True

    def __init__(self, warmup: int = 2, freeze: bool = True):
        self.warmup, self.freeze, self.captures = warmup, freeze, 0

    def capture(self, fn):
        for _ in range(self.warmup):
            fn()
        self.captures += 1
        if not self.freeze:
            fn()
            return Replay(fn, fn)
        layout = {}

        def flat() -> list[torch.Tensor]:
            leaves, layout["spec"] = _flatten(fn())
            return leaves

        # make_fx makes a FakeTensorMode for each operation's value, and each took the Python stack: ~1/3 of a trace
        with mock.patch.object(traceback, "extract_stack", lambda *args, **kwargs: traceback.StackSummary()):
            graph = make_fx(flat)()
        # A constant the recorded call made (`torch.tensor(...)`, `as_tensor`, `from_numpy` in the step) is lifted
        # into the record by `lift_fresh_copy` (`frombuffer` and `from_dlpack` would not be: none is used); every
        # other one was made before the capture, and its memory lives while any tensor over it does (a view of a
        # state's buffer made for the step: the buffer; views of inference tensors do not name their base).
        own = {node.target for node in graph.graph.nodes if node.op == "get_attr" and node.users
               and all(user.target is torch.ops.aten.lift_fresh_copy.default for user in node.users)}
        addresses = {name: (weakref.ref(t), *_memory(t)) for name, t in graph._buffers.items() if name not in own}
        for name in addresses:
            del graph._buffers[name]
        outputs: list[torch.Tensor] = []

        def read(name: str) -> torch.Tensor:
            tensor, memory, (dtype, offset, size, stride) = addresses[name]
            if tensor() is not None:
                return tensor()
            assert memory is not None and not memory.expired(), (
                f"a replay read {name}, a tensor made before its capture and freed since: a CUDA graph would read "
                "whatever the allocator put there")
            storage = torch.UntypedStorage._new_with_weak_ptr(memory.cdata)
            return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)

        def replay():
            tensors = {name: read(name) for name in addresses}
            graph._buffers.update(tensors)
            try:
                new = graph()
            finally:
                for name in tensors:
                    del graph._buffers[name]
            if not outputs:
                outputs.extend(new)
            for out, value in zip(outputs, new):
                if out is not value:
                    out.copy_(value)
            return _unflatten(outputs, layout["spec"])

        return Replay(replay, fn)


def _memory(t: torch.Tensor) -> tuple:
    """A weak reference to the memory under t, and how t views it (None for a tensor whose memory PyTorch does not
    show, such as oneDNN's packed weights: t itself is then what must live)."""
    try:
        return StorageWeakRef(t.untyped_storage()), (t.dtype, t.storage_offset(), t.size(), t.stride())
    except NotImplementedError:
        return None, (None, None, None, None)


class Counting(Recording):
    """`Recording` that counts the replays of what it captured."""

    def __init__(self):
        super().__init__()
        self.replays = 0

    def capture(self, fn):
        replay = super().capture(fn)

        def counted():
            self.replays += 1
            return replay()

        return counted


def _flatten(out) -> tuple[list, tuple]:
    """A step's result (a dataclass of tensors, or a pytree) as tensors and how to rebuild it."""
    if dataclasses.is_dataclass(out):
        names = [f.name for f in dataclasses.fields(out)]
        leaves, spec = tree_flatten([getattr(out, n) for n in names])
        return leaves, (type(out), names, spec)
    leaves, spec = tree_flatten(out)
    return leaves, (None, None, spec)


def _unflatten(leaves: list, layout: tuple):
    kind, names, spec = layout
    values = tree_unflatten(list(leaves), spec)
    return values if kind is None else kind(**dict(zip(names, values)))


def reverse_kept(monkeypatch) -> None:
    """A device cycle's record read with its verified nodes reversed: a choice out of verification order, as a
    device that chose wrongly would write it (a tree of one node, or none, stays a tree)."""
    from eagleviz.decoding import device_cycle

    parse = device_cycle.parse

    def reversed_kept(flat, shape, m):
        parts, at = parse(flat, shape, m)
        parts = list(parts)
        parts[4] = parts[4][::-1]
        return tuple(parts), at

    monkeypatch.setattr(device_cycle, "parse", reversed_kept)
