"""Kernels a GPU would launch for one plain decode step of SmolLM2-135M's shape, counted on a CPU.

Runs the target's static step (`eagleviz.models.static`) on random weights of the embedded model's shape, once
with PyTorch's operations and once with the fused layer kernels (`kernels.layer_ops`, in Triton's
interpreter), and counts PyTorch's operations that do work (views, no-op casts and detaches launch nothing) plus
each Triton launch. `tests/test_static.py` holds the same counts to their budgets on a tiny model.

    python scripts/launch_count.py
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is decorated

from collections import Counter  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from eagleviz.models import layers  # noqa: E402
from eagleviz.models.static import StaticSteps, Uncaptured  # noqa: E402
from eagleviz.models.synthetic import EMBEDDED_SHAPE, CharTokenizer, random_hf_model  # noqa: E402
from eagleviz.models.target import TargetModel  # noqa: E402
from kernels import layer_ops  # noqa: E402
from kernels import tree_attention as ta  # noqa: E402

FREE = ("view", "transpose", "unsqueeze", "select", "slice", "split", "chunk", "reshape", "diagonal", "alias",
        "detach", "lift_fresh", "to.dtype", "to.device", "expand", "t.default", "permute", "_unsafe_view")


class Work(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).removeprefix("aten.")
        if not name.startswith(FREE):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def counted(launches: Counter, name: str, fn):
    def launch(*args, **kwargs):
        launches[name] += 1
        with _disable_current_modes():  # the interpreter's own copies are no GPU kernels
            return fn(*args, **kwargs)
    return launch


@torch.inference_mode()
def count(target: TargetModel, impl: str) -> tuple[int, Counter]:
    steps = StaticSteps(target, 64, impl, None, Uncaptured())
    steps.forward([1, 2], [0, 1], torch.ones(2, 2, dtype=torch.bool).tril())
    steps.forward([3], [2], None)
    launches, mode = Counter(), Work()
    originals = (layer_ops.add_rms_norm, layer_ops.silu_mul, layers.rope_store, ta._launch)
    layer_ops.add_rms_norm, layer_ops.silu_mul = (counted(launches, "add_rms_norm", originals[0]),
                                                  counted(launches, "silu_mul", originals[1]))
    layers.rope_store, ta._launch = counted(launches, "rope_store", originals[2]), counted(launches, "attention",
                                                                                             originals[3])
    try:
        with mode:
            steps.forward([4], [3], None)
    finally:
        layer_ops.add_rms_norm, layer_ops.silu_mul, layers.rope_store, ta._launch = originals
    return sum(mode.ops.values()) + sum(launches.values()), launches


def main() -> None:
    hf = random_hf_model(EMBEDDED_SHAPE | {"tie_word_embeddings": False}, 0)
    layers_n = EMBEDDED_SHAPE["num_hidden_layers"]
    plain = TargetModel(hf, CharTokenizer(), "random", fused=False)
    fused = TargetModel(hf, CharTokenizer(), "random", fused=False, layer_kernels=True)
    unfused_total, _ = count(plain, "torch")
    fused_total, launches = count(fused, "triton")
    print(f"SmolLM2-135M's shape, {layers_n} layers, one plain step:")
    print(f"  PyTorch's operations: {unfused_total} ({unfused_total / layers_n:.1f} a layer with what surrounds them)")
    print(f"  fused layer kernels and the Triton attention: {fused_total} launches ({dict(launches)})")


if __name__ == "__main__":
    main()
