"""How far the weight blocks move the embedded model's next-token distributions from fp32: `python -m eagleviz
int8-accuracy`.

For each MT-bench first turn (--prompts, 80: all), the fp32 model (dense linears over the dequantized weights)
decodes --tokens greedy tokens; then each variant reads the same tokens in one teacher-forced forward, and at
every generated position its next-token distribution is compared with fp32's: top-1 agreement, KL(fp32 ||
variant) in nats, and the largest logit difference. Variants: the weight blocks with fp32 activations (the
summation order alone) and with int8 activations (the blocks path's default: what decoding runs on a CPU).

`--out` writes JSON with the numerics version it was measured with (`kernels.numerics`);
`assets/bench/int8-accuracy.json` is the committed one, which the README quotes and `tests/test_numerics.py`
holds to today's C code. Each finished prompt goes to a journal beside --out (an interrupted run resumes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from eagleviz.journal import Journal

ACTIVATIONS = ("fp32", "int8")


def logits_of(target, ids: torch.Tensor) -> torch.Tensor:
    """Every position's logits, in one forward over `ids`."""
    cache = target.new_cache(ids.shape[0] + 1)
    mask = torch.ones(ids.shape[0], ids.shape[0], dtype=torch.bool).tril()
    return target.forward(ids, torch.arange(ids.shape[0]), cache, mask).logits


def compare_prompt(ref, variants: dict, prompt: str, tokens: int) -> dict:
    """One prompt: fp32 greedy decoding, then each variant's agreement, KL and largest logit difference."""
    ids = torch.tensor(ref.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                         add_generation_prompt=True, return_dict=False)).flatten()
    cache = ref.new_cache(ids.shape[0] + tokens + 1)
    mask = torch.ones(ids.shape[0], ids.shape[0], dtype=torch.bool).tril()
    out = ref.forward(ids, torch.arange(ids.shape[0]), cache, mask, logit_rows=slice(-1, None)).logits
    for _ in range(tokens):
        ids = torch.cat([ids, out[-1].argmax().view(1)])
        out = ref.forward(ids[-1:], torch.tensor([ids.shape[0] - 1]), cache, None).logits
    start = ids.shape[0] - tokens - 1  # the positions that predicted the generated tokens
    want = logits_of(ref, ids)[start:-1]
    logp = torch.log_softmax(want.double(), -1)
    record = {}
    for name, target in variants.items():
        got = logits_of(target, ids)[start:-1]
        logq = torch.log_softmax(got.double(), -1)
        record[name] = {"agree": (got.argmax(-1) == want.argmax(-1)).double().mean().item(),
                        "kl": (logp.exp() * (logp - logq)).sum(-1).mean().item(),
                        "max_diff": (got - want).abs().max().item()}
    return record


def measure(prompts: list[str], tokens: int, journal: Path | None = None, progress=print) -> dict:
    from eagleviz.models.loading import cpu_description, load_target
    from eagleviz.models.quantized import find_blocks
    from eagleviz.models.target import TargetModel
    from eagleviz.perf.provenance import provenance
    from kernels.numerics import numerics_version

    ref = load_target("embedded", dtype="float32", weights="dense")
    blocks = find_blocks(ref.hf.state_dict())
    variants = {act: TargetModel(ref.hf, ref.tokenizer, ref.name, blocks=blocks, activations=act)
                for act in ACTIVATIONS}
    header = {"prompts": prompts, "tokens": tokens, "numerics": numerics_version()}
    log = Journal(journal, header, "int8-accuracy", progress)
    records = log.run(len(prompts), lambda i: compare_prompt(ref, variants, prompts[i], tokens))
    result = {"numerics": header["numerics"], "prompts": len(prompts), "tokens": tokens, "cpu": cpu_description(),
              "variants": {act: {"top1_agreement": round(statistics.mean(r[act]["agree"] for r in records), 4),
                                 "mean_kl_nats": float(f"{statistics.mean(r[act]['kl'] for r in records):.3g}"),
                                 "max_logit_diff": round(max(r[act]["max_diff"] for r in records), 4)}
                           for act in ACTIVATIONS},
              "date": time.strftime("%Y-%m-%d"), "machine": provenance()}
    log.close()
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m eagleviz int8-accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=80, help="the first N MT-bench first turns (80: all)")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None,
                   help="write the result there (assets/bench/int8-accuracy.json is the committed one)")
    args = p.parse_args(argv)
    from eagleviz.prompts import mtbench_first_turns

    if args.threads:
        torch.set_num_threads(args.threads)
    journal = args.out.with_suffix(".journal.jsonl") if args.out else None
    result = measure(mtbench_first_turns(args.prompts), args.tokens, journal)
    result["command"] = "python -m eagleviz int8-accuracy " + " ".join(argv)
    for name, v in result["variants"].items():
        print(f"blocks, {name} activations: top-1 agreement {v['top1_agreement']:.2%}, mean KL "
              f"{v['mean_kl_nats']:.3g} nats, largest logit difference {v['max_logit_diff']}")
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0
