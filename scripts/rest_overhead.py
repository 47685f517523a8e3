"""What a resting cycle's host work costs beside a plain step's, without the target's forward.

    python scripts/rest_overhead.py --temperature 1
    EAGLEVIZ_CPU=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python scripts/rest_overhead.py --temperature 0

The target's forward after the prefill is replaced by a stand-in that returns one real logits row (end of text
masked, so runs go the whole way) and its features at once; plain decoding and speculative decoding with the
head always resting (a plain step a cycle, no lookup) then run `--tokens` tokens each, alternating, `--repeats`
times, on one thread. Prints the median thread CPU time a token outside the forward: what the read-out, the
trace and the bookkeeping cost, measured so that other processes on the machine barely move it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding import policy
from eagleviz.decoding.load import load_engine
from eagleviz.models.target import TargetOutput
from eagleviz.prompts import mtbench_first_turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    engine = load_engine()
    ids = engine.encode_prompt(mtbench_first_turns(1)[0])
    real = engine.target.forward
    out = real(torch.tensor(ids), torch.arange(len(ids)), engine.target.new_cache(len(ids) + 8), None,
               feature_layers=engine.feature_layers)
    row = out.logits[-1:].clone()
    row[0, list(engine.target.eos_token_ids)] = -1e9
    feats = {True: out.features[-1:].clone(),
             False: real(torch.tensor(ids), torch.arange(len(ids)), engine.target.new_cache(len(ids) + 8), None,
                         feature_layers=None).features[-1:].clone()}

    def stand_in(tokens, positions, cache, tree_mask, *, logit_rows=slice(None), feature_layers=None, impl="torch"):
        if cache.length == 0:  # the prefill runs for real
            return real(tokens, positions, cache, tree_mask, logit_rows=logit_rows, feature_layers=feature_layers,
                        impl=impl)
        n = tokens.shape[0]
        cache.advance(n)
        return TargetOutput(logits=row.expand(n, -1).contiguous(),
                            features=feats[feature_layers is not None].expand(n, -1).contiguous())

    engine.target.forward = stand_in
    sampling = SamplingConfig(max_new_tokens=args.tokens, temperature=args.temperature)
    head_runs = policy.HeadRest.head_runs
    spent: dict[str, list[float]] = {"plain": [], "resting": []}
    for _ in range(args.repeats):
        for kind in spent:
            run = engine.new_run("", ids, None, sampling)
            if kind == "plain":
                steps = engine.plain(ids, sampling, run)
            else:
                policy.HeadRest.head_runs = lambda self: False
                steps = engine.speculate(ids, TreeConfig.create(source="eagle"), sampling, run)
            try:
                next(steps)  # the prefill's token
                start, first = time.thread_time(), len(run.output)
                for _ in steps:
                    pass
            finally:
                policy.HeadRest.head_runs = head_runs
            spent[kind].append((time.thread_time() - start) * 1e6 / (len(run.output) - first))
    plain, resting = (statistics.median(v) for v in spent.values())
    print(f"T = {args.temperature:g}: plain {plain:.0f} us a token outside the forward, a resting cycle {resting:.0f} "
          f"(+{resting - plain:.0f}); medians of {args.repeats} runs of {args.tokens} tokens, one thread")


if __name__ == "__main__":
    main()
