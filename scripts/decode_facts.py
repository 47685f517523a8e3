"""The measurements behind three statements of the docs about a decode step on this CPU, in one command.

    OMP_WAIT_POLICY=ACTIVE python scripts/decode_facts.py --threads 2            # all three
    python scripts/decode_facts.py --only step                                    # one of step|agreement|fused

step       a plain decode step (one token over a 200-token prefix) against its matrix products alone: the
           model's own packed products (q|k|v, o, gate|up, down per layer, and the LM head) called in the same
           order on one row, so "the rest" is what the step spends around them (README, "Speed").
agreement  how often greedy EAGLE (tree 3/4/8) equals our greedy plain loop token for token in bf16, with the
           attention in the model's dtype and in fp32, on the first N MT-bench prompts (README, "Lossless").
fused      how far the compiled CPU layer's bf16 logits are from the PyTorch layer's, step by step along a
           greedy decode of the factorial prompt of docs/performance.md entry 20.

Medians are printed with the command line, for pasting next to the figure they support.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.models.loading import load_target
from eagleviz.models.target import TargetModel
from eagleviz.prompts import load_prompts
from eagleviz.train.data import prompt_ids

FACTS = ("step", "agreement", "fused")
PROMPT = "Write a Python function that returns the factorial of n, with a docstring."


def _ms(fn, repeats: int) -> float:
    """Median milliseconds of `fn()` over `repeats` calls, after 5 warm-up calls."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def step_split(target: TargetModel, prefix: int = 200, repeats: int = 50) -> dict:
    ids = torch.randint(0, target.vocab_size, (prefix,))
    cache = target.new_cache(prefix + 1)
    target.forward(ids, torch.arange(prefix), cache, torch.ones(prefix, prefix, dtype=torch.bool).tril(),
                   logit_rows=None)

    def step():
        cache.length = prefix
        target.forward(ids[:1], torch.tensor([prefix]), cache, None)

    row = torch.randn(1, target.hidden_size).to(target.dtype)
    mlp_row = torch.randn(1, target.config.intermediate_size).to(target.dtype)
    products = []
    for attn, gate_up, down in zip(target._attn, target._gate_up, target._down):
        products += [(attn.qkv, row), (attn.o_proj, row), (gate_up, row), (down, mlp_row)]
    products.append((target.unembed, row))

    def products_only():
        for dense, x in products:
            dense(x)

    step_ms, products_ms = _ms(step, repeats), _ms(products_only, repeats)
    return {"step_ms": step_ms, "products_ms": products_ms, "rest_ms": step_ms - products_ms,
            "products": len(products)}


def agreement(limit: int, max_new_tokens: int) -> dict:
    tree = TreeConfig.create(3, 4, 8, adaptive=False)
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    prompts = load_prompts("mtbench", limit)
    out = {}
    for kv in ("model", "float32"):
        engine = load_engine(kv_dtype=kv)
        if engine.target.dtype == torch.float32:
            return {"note": "the model runs in fp32 on this CPU: greedy EAGLE equals plain decoding exactly"}
        same = sum(engine.generate(p, tree, sampling).token_ids == engine.generate(p, None, sampling).token_ids
                   for p in prompts)
        out[str(engine.target.kv_dtype).removeprefix("torch.")] = f"{same} of {len(prompts)}"
    return out


@torch.inference_mode()
def fused_logit_diff(steps: int = 30) -> dict:
    fused = load_target(kv_dtype="float32")
    if fused.ops is None or fused.dtype != torch.bfloat16:
        return {"note": "the compiled layer does not run here in bf16 (no compiler, or an fp32 model)"}
    plain = TargetModel(fused.hf, fused.tokenizer, fused.name, kv_dtype=torch.float32, fused=False)
    ids = prompt_ids(fused.tokenizer, PROMPT)
    caches = {m: m.new_cache(len(ids) + steps + 1) for m in (fused, plain)}
    n = len(ids)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    logits = {m: m.forward(torch.tensor(ids), torch.arange(n), caches[m], causal,
                           logit_rows=slice(-1, None)).logits[0] for m in (fused, plain)}
    diffs = []
    for _ in range(steps):
        diffs.append(float((logits[fused] - logits[plain]).abs().max()))
        token = int(logits[plain].argmax())  # both follow the PyTorch layer's greedy path
        pos = caches[plain].length
        logits = {m: m.forward(torch.tensor([token]), torch.tensor([pos]), caches[m], None).logits[0]
                  for m in (fused, plain)}
    return {"steps": steps, "median_max_abs_diff": statistics.median(diffs), "max_abs_diff": max(diffs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=FACTS, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--limit", type=int, default=20, help="agreement: MT-bench prompts")
    p.add_argument("--max-new-tokens", type=int, default=96, help="agreement: new tokens per prompt")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("python scripts/decode_facts.py " + " ".join(sys.argv[1:]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for fact in (args.only,) if args.only else FACTS:
        if fact == "step":
            target = load_target()
            result = step_split(target)
            result["dtype"] = str(target.dtype).removeprefix("torch.")
        elif fact == "agreement":
            result = agreement(args.limit, args.max_new_tokens)
        else:
            result = fused_logit_diff()
        print(f"{fact}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in result.items()))


if __name__ == "__main__":
    main()
