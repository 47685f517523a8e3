"""What a GPU's host does around the captured steps, counted on a CPU: per plain step, per resting cycle and per
drafted cycle, the PyTorch operations that do work outside the replayed step and drafting (each a kernel launch
or a host-side tensor operation on a GPU), the counted reads of the device (`to_host`) and the reads that
bypass it (an `.item()`, a `float(tensor)`: each a synchronisation on a GPU).

Runs the static decode path (`--decode static`, the CUDA path's code, uncaptured) on random weights of the
embedded model's shape and a random EAGLE-3 head, replaying steps and draftings with the counting suspended, as
a CUDA graph's replay is one launch. A random head's drafts are never accepted, so the drafted row is the fixed
5/4/16 tree with the ledger off; the resting row rests the head on every cycle.

    python scripts/host_ops.py [--tokens 24]
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding import policy
from eagleviz.decoding.device_draft import DeviceDrafter
from eagleviz.decoding.engine import Engine
from eagleviz.models.draft import random_head
from eagleviz.models.host import counting_reads
from eagleviz.models.static import StaticSteps
from eagleviz.models.synthetic import random_target

FREE = ("view", "transpose", "unsqueeze", "select", "slice", "split", "chunk", "reshape", "diagonal", "alias",
        "detach", "lift_fresh", "to.dtype", "to.device", "expand", "t.default", "permute", "_unsafe_view",
        "resolve_")  # resolve_conj/neg: a CPU tensor's `tolist`


class Work(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.hidden = Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).removeprefix("aten.")
        if name.startswith(("_local_scalar_dense", "item")):
            self.hidden += 1
        elif not name.startswith(FREE):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def uncounted(cls) -> None:
    """Replays of `cls` (a static state) run with the counting suspended: on a GPU each is one graph launch."""
    replay = cls._replay

    def wrapped(self, b):
        step = replay(self, b)

        def run():
            with _disable_current_modes():
                return step()
        return run
    cls._replay = wrapped


def measure(engine: Engine, tree: TreeConfig | None, sampling: SamplingConfig, prompt: str) -> tuple:
    ids = engine.encode_prompt(prompt, chat=False)
    engine.generate(prompt, tree, sampling, chat=False)  # every size captured once: the counted run replays
    run = engine.new_run(prompt, ids, tree, sampling, chat=False)
    steps = engine.plain(ids, sampling, run) if tree is None else engine.speculate(ids, tree, sampling, run)
    next(steps)
    with Work() as work, counting_reads() as reads:
        n = sum(1 for _ in steps)
    return sum(work.ops.values()) / n, reads[0] / n, work.hidden / n, work.ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=24)
    args = p.parse_args()
    torch.manual_seed(0)
    uncounted(StaticSteps)
    uncounted(DeviceDrafter)
    target = random_target()
    engine = Engine(target, random_head(target, "eagle3", seed=0), "random", decode="static", compiled_sampling=False,
                    ledger=False)
    prompt = "Write a haiku about the sea."
    rows = []
    for temperature in (0.0, 1.0):
        sampling = SamplingConfig(temperature=temperature, max_new_tokens=args.tokens)
        rows.append(("plain step", temperature, *measure(engine, None, sampling, prompt)))
        rows.append(("drafted cycle, fixed 5/4/16", temperature,
                     *measure(engine, TreeConfig.create(5, 4, 16, adaptive=False, source="eagle"), sampling, prompt)))
        head_runs = policy.HeadRest.head_runs
        policy.HeadRest.head_runs = lambda self: False
        try:
            rows.append(("resting cycle", temperature,
                         *measure(engine, TreeConfig.create(source="eagle"), sampling, prompt)))
        finally:
            policy.HeadRest.head_runs = head_runs
    print("| what | T | operations outside the replays | counted reads | reads bypassing to_host |")
    print("|---|---:|---:|---:|---:|")
    for what, t, ops, reads, hidden, _ in rows:
        print(f"| {what} | {t:g} | {ops:.1f} | {reads:.2f} | {hidden:.2f} |")
    print()
    for what, t, _, _, _, ops in rows:
        print(f"{what}, T = {t:g}: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(8)))


if __name__ == "__main__":
    main()
