#!/usr/bin/env python3
"""Which switch changes how a GPU's drafted cycle decided on the device fails: one process per switch, each
loading the random target of SmolLM2-135M's shape with the shipped head (bf16, no files needed), then greedy runs
of plain decoding and of three trees with `EAGLEVIZ_DEVICE_CYCLE=1`, the head drafting every cycle. A run's tokens
against plain decoding's (bf16: a first difference can be rounding), or the error it ended with.

    python scripts/device_cycle_switches.py --out switches.json          # on a GPU machine, ~2-3 minutes

Switches: base; blocking (CUDA_LAUNCH_BLOCKING=1: every kernel waits, no race survives); headplain (the head's
levels on PyTorch's operations, not the layer kernels); nolayerk (no Triton layer kernels anywhere); uncaptured
(static steps without CUDA graphs); noahead (no cycle launched ahead of the last one's books); torchattn (PyTorch's
attention). docs/performance.md entry 61 has what an H200 said."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SWITCHES = ("base", "blocking", "headplain", "nolayerk", "uncaptured", "noahead", "torchattn")
PROMPT = "Write a Python function that returns the factorial of n, with a docstring."


def one(switch: str, tokens: int) -> dict:
    """The runs of one switch, in this process."""
    import torch

    from eagleviz.config import SamplingConfig, TreeConfig
    from eagleviz.decoding.engine import Engine
    from eagleviz.models.target import TargetModel

    if switch == "nolayerk":
        TargetModel._layer_kernels = lambda self, wanted: False
    if switch == "headplain":  # before the load, which captures the head's levels
        from eagleviz.models.draft import DraftHead

        made = DraftHead.for_drafting
        DraftHead.for_drafting = (lambda self, pack=None, ops=None, block_ops=None, int8=True, layer_kernels=False:
                                  made(self, pack, ops, block_ops, int8, False))
    from eagleviz.decoding.load import load_engine

    start = time.time()
    engine = load_engine("random", "assets/eagle-smollm2-135m", dtype="bfloat16", device="cuda",
                         attn_impl="torch" if switch == "torchattn" else "auto",
                         decode="static" if switch == "uncaptured" else "auto")  # (the load captures graphs)
    engine = engine.with_ledger(False).with_device_cycle(True)
    if switch == "noahead":
        Engine._drafts_next = lambda self, r: False
    out = {"switch": switch, "head_kernels": engine.head.layer_kernels, "target_kernels": engine.target.layer_kernels,
           "attn": engine.attn_impl}
    sampling = SamplingConfig(max_new_tokens=tokens)
    trees = {"6-8-64": TreeConfig.create(6, 8, 64, adaptive=False, source="eagle"),
             "5-4-16": TreeConfig.create(5, 4, 16, adaptive=False, source="eagle"),
             "5-4-16+lookup": TreeConfig.create(5, 4, 16, adaptive=False),
             "default": TreeConfig.create(source="eagle")}
    with torch.inference_mode():
        plain = engine.generate(PROMPT, None, sampling).token_ids
        for name, tree in trees.items():
            try:
                ids = engine.generate(PROMPT, tree, sampling).token_ids
                first = next((i for i, (a, b) in enumerate(zip(ids, plain)) if a != b), None)
                out[name] = {"equal": ids == plain, "first_difference": first}
            except Exception as exc:  # the failure is the finding
                out[name] = {"error": f"{exc.__class__.__name__}: {str(exc)[:400]}",
                             "evidence": getattr(exc, "evidence", None)}  # a mismatch's: DeviceCycle.evidence
    out["seconds"] = round(time.time() - start, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switch", choices=SWITCHES, default=None, help="run one switch in this process")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--limit-s", type=int, default=30, help="each switch's process")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.switch:
        print(json.dumps(one(args.switch, args.tokens)))
        return 0
    report = {"command": "python scripts/device_cycle_switches.py " + " ".join(argv or sys.argv[1:]), "switches": []}
    for switch in SWITCHES:
        env = dict(os.environ, EAGLEVIZ_DEVICE_CYCLE="1", PYTHONPATH=os.getcwd())
        if switch == "blocking":
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        try:
            done = subprocess.run([sys.executable, __file__, "--switch", switch, "--tokens", str(args.tokens)],
                                  env=env, capture_output=True, text=True, timeout=args.limit_s)
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else {
                "switch": switch, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        except subprocess.TimeoutExpired:
            row = {"switch": switch, "error": f"over {args.limit_s} s"}
        report["switches"].append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
