"""A one-token forward with and without the head's features (EAGLE-3's captured layers), alternated.

    OMP_WAIT_POLICY=ACTIVE python scripts/features_cost.py

300 rounds over one prompt's cache: the decoder stack alone with and without capture, then the whole forward
with and without `feature_layers`. Prints the medians in ms.
"""
import statistics
import time

import torch

from eagleviz.decoding.load import load_engine
from eagleviz.prompts import mtbench_first_turns


def main() -> None:
    torch.set_num_threads(2)
    e = load_engine()
    t = e.target
    ids = e.encode_prompt(mtbench_first_turns(1)[0])
    caches = {k: t.new_cache(len(ids) + 200) for k in ("none", "cap")}
    for k, c in caches.items():
        t.forward(torch.tensor(ids), torch.arange(len(ids)), c, None, feature_layers=e.feature_layers)
    res = {"none": [], "cap": [], "fwd_none": [], "fwd_cap": []}
    for it in range(300):
        for k in ("none", "cap"):
            c = caches[k]
            h = t._embed(torch.tensor([42]))
            cos, sin = t._rotary(h, torch.tensor([[c.length]]))
            cos, sin = cos[0].contiguous(), sin[0].contiguous()
            t0 = time.perf_counter()
            t._stack.run(h, cos, sin, c.k, c.v, c.length, None, e.feature_layers if k == "cap" else None, 2)
            res[k].append(time.perf_counter() - t0)
        for k in ("none", "cap"):
            c = caches[k]
            c.length = len(ids) + 10
            t0 = time.perf_counter()
            t.forward(torch.tensor([42]), torch.tensor([c.length]), c, None, feature_layers=e.feature_layers if k == "cap" else None)
            res["fwd_" + k].append(time.perf_counter() - t0)
            c.length = len(ids) + 10
    for k, v in res.items(): print(k, f"{statistics.median(v)*1e3:.3f}")


if __name__ == "__main__":
    main()
