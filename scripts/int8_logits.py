"""How far int8 activations move the embedded model's logits from the fp32 reference, on MT-bench prompts.

    python scripts/int8_logits.py --limit 80 --tokens 64 --threads 2

For each prompt, the fp32 model (dense linears, the dequantized weights) decodes greedily; then each variant
reads the same tokens in one teacher-forced forward, and at every generated position we compare its
next-token distribution with fp32's: top-1 agreement, KL(fp32 || variant) in nats, and the largest logit
difference. Variants: the weight blocks with fp32 activations (`--weights blocks`, summation order only) and
with int8 activations (the default of the blocks path). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from eagleviz.models.loading import cpu_description, load_target
from eagleviz.models.quantized import find_blocks
from eagleviz.models.target import TargetModel
from eagleviz.prompts import load_prompts


def logits_of(target: TargetModel, ids: torch.Tensor) -> torch.Tensor:
    cache = target.new_cache(ids.shape[0] + 1)
    mask = torch.ones(ids.shape[0], ids.shape[0], dtype=torch.bool).tril()
    return target.forward(ids, torch.arange(ids.shape[0]), cache, mask).logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=80)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ref = load_target("embedded", dtype="float32", weights="dense")
    blocks = find_blocks(ref.hf.state_dict())
    variants = {act: TargetModel(ref.hf, ref.tokenizer, ref.name, blocks=blocks, activations=act)
                for act in ("fp32", "int8")}
    stats = {name: {"agree": [], "kl": [], "max_diff": []} for name in variants}
    for prompt in load_prompts("mtbench")[:args.limit]:
        ids = torch.tensor(ref.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                             add_generation_prompt=True, return_dict=False))
        ids = ids.flatten()
        cache = ref.new_cache(ids.shape[0] + args.tokens + 1)
        mask = torch.ones(ids.shape[0], ids.shape[0], dtype=torch.bool).tril()
        out = ref.forward(ids, torch.arange(ids.shape[0]), cache, mask, logit_rows=slice(-1, None)).logits
        for _ in range(args.tokens):  # fp32 greedy decoding
            ids = torch.cat([ids, out[-1].argmax().view(1)])
            out = ref.forward(ids[-1:], torch.tensor([ids.shape[0] - 1]), cache, None).logits
        start = ids.shape[0] - args.tokens - 1  # the positions that predicted the generated tokens
        want = logits_of(ref, ids)[start:-1]
        logp = torch.log_softmax(want.double(), -1)
        for name, target in variants.items():
            got = logits_of(target, ids)[start:-1]
            logq = torch.log_softmax(got.double(), -1)
            stats[name]["agree"].append((got.argmax(-1) == want.argmax(-1)).double().mean().item())
            stats[name]["kl"].append((logp.exp() * (logp - logq)).sum(-1).mean().item())
            stats[name]["max_diff"].append((got - want).abs().max().item())
    result = {"cpu": cpu_description(), "prompts": args.limit, "tokens": args.tokens,
              "variants": {name: {"top1_agreement": round(statistics.mean(s["agree"]), 4),
                                  "mean_kl_nats": float(f"{statistics.mean(s['kl']):.3g}"),
                                  "max_logit_diff": round(max(s["max_diff"]), 4)} for name, s in stats.items()}}
    for name, v in result["variants"].items():
        print(f"blocks, {name} activations: top-1 agreement {v['top1_agreement']:.2%}, mean KL {v['mean_kl_nats']:.3g} "
              f"nats, largest logit difference {v['max_logit_diff']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
