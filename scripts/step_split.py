"""A resting cycle's host work beside plain decoding's step, with parts of it left out in a third arm.

    OMP_WAIT_POLICY=ACTIVE python scripts/step_split.py 1            # temperature
    V=I OMP_WAIT_POLICY=ACTIVE python scripts/step_split.py 1        # the third arm without the context's index

Plain decoding and two runs of the default advance a step each in turn over the same engine and prompt (8
MT-bench prompts, 128 tokens, 2 threads); each step's forward and read-out are timed and the rest of the step
is its time less those. In the third arm (`stub`) the parts named by V are no-ops: L the ledgers, C the run's
price correction, I the context's index (extend and match), N the rest note, P the capture check, K the phase
clock. Prints each arm's mean/median microseconds a step outside its forward and read-out (resting cycles only).
"""
import os
import statistics
import sys
import time

import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine
from eagleviz.decoding import engine as em, policy as pol, costs as co, lookup as lk
from eagleviz.models import static
from eagleviz.prompts import mtbench_first_turns


def main() -> None:
    torch.set_num_threads(2)
    e = load_engine()
    STUB = [False]
    what = os.environ.get("V", "")
    def wrap(obj, name, stub):
        real = getattr(obj, name)
        def f(*a, **k):
            return stub(*a, **k) if STUB[0] else real(*a, **k)
        setattr(obj, name, f)
    if "L" in what: wrap(pol.Ledger, "observe", lambda self, *a, **k: True)
    if "C" in what: wrap(co.RunCosts, "rest", lambda self, *a: None); wrap(co.RunCosts, "observe", lambda self, *a: False)
    if "I" in what: wrap(lk.SuffixIndex, "extend", lambda self, t: None); wrap(lk.SuffixIndex, "match", lambda self, *a, **k: None)
    if "N" in what: wrap(pol.HeadRest, "note", lambda self: "x")
    if "P" in what: wrap(em, "prepared", lambda *a: 0)
    if "K" in what:
        class K:
            def __init__(self, d): pass
            def lap(self): pass
            def read(self, names): return {"draft": 0.0, "verify": 1.0, "accept": 0.0, "rewind": 0.0}
        real_pc = em.PhaseClock
        em.PhaseClock = lambda d: K(d) if STUB[0] else real_pc(d)
    cur = {"f": 0.0, "r": 0.0}
    real_fwd = static.EagerSteps.forward
    def fwd(self, *a, **k):
        t = time.perf_counter(); r = real_fwd(self, *a, **k); cur["f"] += time.perf_counter() - t; return r
    static.EagerSteps.forward = fwd
    real_ro = em.Engine._read_out
    def ro(self, *a, **k):
        t = time.perf_counter(); r = real_ro(self, *a, **k); cur["r"] += time.perf_counter() - t; return r
    em.Engine._read_out = ro
    s = SamplingConfig(max_new_tokens=128, temperature=float(sys.argv[1]))
    tree = TreeConfig.create()
    other = {"plain": [], "spec": [], "stub": []}
    for i, p in enumerate(mtbench_first_turns(8)):
        ids = e.encode_prompt(p)
        gens = {"plain": e.plain(ids, s, e.new_run("", ids, None, s)), "spec": e.speculate(ids, tree, s, e.new_run("", ids, tree, s)),
                "stub": e.speculate(ids, tree, s, e.new_run("", ids, tree, s))}
        live = list(gens)[i % 3:] + list(gens)[:i % 3]
        n = 0
        while live:
            for arm in list(live):
                cur["f"] = cur["r"] = 0.0
                STUB[0] = arm == "stub"
                t = time.perf_counter()
                try: x = next(gens[arm])
                except StopIteration: live.remove(arm); continue
                finally: STUB[0] = False
                dt = time.perf_counter() - t
                if n > 0 and (arm == "plain" or (len(x.tokens) == 1 and x.draft_levels == 0)):
                    other[arm].append((dt - cur["f"] - cur["r"]) * 1e6)
            n += 1
    print(what, " ".join(f"{arm} {statistics.mean(v):.0f}/{statistics.median(v):.0f}" for arm, v in other.items()))


if __name__ == "__main__":
    main()
