"""Hand-built, self-consistent traces for figure tests: any tree shape and any accept length, no model.

The construction follows the engine's rules: EAGLE-2 expansion (top-k children of the k best frontier
nodes), reranking to draft_tokens - 1 candidates closed under ancestors, verification slots by depth then
score, and a walk that accepts the best child at each depth until `accept` tokens are accepted.
"""

from __future__ import annotations

import math
import random

from eagleviz.trace import CycleTrace, KVMap, NodeCheck, OutputToken, RunTrace, TreeNode

WORDS = [" the", " cat", " sat", " on", " mat", "\n", " and", " ran", " away", " fast", "def", " x", "(", ")",
         ":", " return", " 1", " +", " 2", " =", " 3", " dog", " big", " red"]


def _tok(i: int) -> tuple[int, str]:
    return 100 + i, WORDS[i % len(WORDS)]


def _candidates(steps: int, topk: int, rng: random.Random):
    """EAGLE-2 expansion with random draft log-probabilities: (parents, depths, logprobs, scores, expanded)."""
    parents, depths, lps, scores, expanded = [], [], [], [], []

    def add(parent: int) -> list[int]:
        raw = sorted((rng.random() + 0.05 for _ in range(topk)), reverse=True)
        total = sum(raw) * (1.0 + rng.random())
        ids = []
        for r in raw:
            ids.append(len(parents))
            parents.append(parent)
            depths.append(1 if parent < 0 else depths[parent] + 1)
            lps.append(math.log(r / total))
            scores.append((0.0 if parent < 0 else scores[parent]) + lps[-1])
            expanded.append(False)
        return ids

    level = add(-1)
    for _ in range(1, steps):
        frontier = sorted(level, key=lambda i: (-scores[i], i))[:topk]
        level = []
        for node in frontier:
            expanded[node] = True
            level += add(node)
    return parents, depths, lps, scores, expanded


def _rerank(parents, depths, scores, budget: int) -> list[int]:
    kept: set[int] = set()
    for i in sorted(range(len(parents)), key=lambda i: (-scores[i], depths[i], i)):
        if len(kept) == budget:
            break
        if parents[i] < 0 or parents[i] in kept:
            kept.add(i)
    return sorted(kept, key=lambda i: (depths[i], -scores[i], i))


def _ancestors(parents: list[int], s: int) -> set[int]:
    out = set()
    while s >= 0:
        out.add(s)
        s = parents[s]
    return out


def synthetic_cycle(index: int = 0, steps: int = 3, topk: int = 2, draft_tokens: int = 6, accept: int = 1,
                    sampling: bool = False, prefix: int = 20, seed: int = 0) -> CycleTrace:
    """One cycle; `accept` is capped by the depth the verified tree reaches along best children."""
    rng = random.Random(seed)
    parents_c, depths_c, lps, scores, expanded = _candidates(steps, topk, rng)
    kept = _rerank(parents_c, depths_c, scores, draft_tokens - 1)
    slot_of = {n: s + 1 for s, n in enumerate(kept)}
    root_tok, root_text = _tok(index)
    tokens = [root_tok] + [_tok(n + 1)[0] for n in kept]
    texts = [root_text] + [_tok(n + 1)[1] for n in kept]
    parents = [-1] + [0 if parents_c[n] < 0 else slot_of[parents_c[n]] for n in kept]
    depths = [0] + [depths_c[n] for n in kept]
    T = len(tokens)
    kids = [[s for s in range(T) if parents[s] == p] for p in range(T)]
    mask = [[int(j in _ancestors(parents, i)) for j in range(T)] for i in range(T)]
    bonus_tok, bonus_text = _tok(index + 7)
    path, checks = [0], []
    target = list(tokens)  # target argmax per slot, filled below
    qs = [1.0] + [math.exp(lps[n]) for n in kept]
    while True:
        cur, tried = path[-1], kids[path[-1]]
        if len(path) - 1 < accept and tried:
            s = tried[0]
            target[cur] = tokens[s]
            checks.append(_check(s, depths[s], tokens[s], texts[s], qs[s], True, tokens[s], texts[s], sampling, rng))
            path.append(s)
            continue
        target[cur] = bonus_tok
        for s in tried:
            checks.append(_check(s, depths[s], tokens[s], texts[s], qs[s], False, bonus_tok, bonus_text, sampling,
                                 rng))
        break
    target_texts = [bonus_text if t == bonus_tok else texts[tokens.index(t)] for t in target]
    moves = [(prefix + s, prefix + i) for i, s in enumerate(path) if s != i]
    n_expanded = sum(expanded)
    root_top = []
    if sampling:
        root_top = [(bonus_tok, bonus_text, 0.5)] + [(t, x, 0.4 / (k + 2)) for k, (t, x) in
                                                     enumerate(zip(tokens[1:4], texts[1:4]))]
    return CycleTrace(
        index=index,
        nodes=[TreeNode(id=i, parent=parents_c[i], depth=depths_c[i], token=_tok(i + 1)[0], text=_tok(i + 1)[1],
                        prob=math.exp(lps[i]), score=scores[i], expanded=expanded[i], kept=i in slot_of,
                        slot=slot_of.get(i, -1)) for i in range(len(parents_c))],
        verify_nodes=[-1] + kept, tokens=tokens, texts=texts, parents=parents,
        positions=[prefix + d for d in depths], mask=mask, target_tokens=target, target_texts=target_texts,
        target_probs=[0.9] * T, checks=checks, path=path, bonus_token=bonus_tok, bonus_text=bonus_text,
        bonus_source="residual" if sampling and kids[path[-1]] else "target", accept_length=len(path) - 1,
        committed=[tokens[s] for s in path[1:]] + [bonus_tok],
        kv_target=KVMap(before=prefix, appended=list(range(prefix, prefix + T)), moves=moves,
                        after=prefix + len(path)),
        kv_draft=KVMap(before=prefix, appended=list(range(prefix, prefix + n_expanded)), moves=[], after=prefix),
        timings_ms={"draft": 20.0 + index, "verify": 40.0, "accept": 1.0, "rewind": 0.1}, root_top=root_top)


def _check(slot, depth, token, text, q, accepted, target_token, target_text, sampling, rng) -> NodeCheck:
    if not sampling:
        return NodeCheck(slot=slot, depth=depth, token=token, text=text, p=0.9 if accepted else 0.0, q=q,
                         accept_prob=1.0 if accepted else 0.0, uniform=None, accepted=accepted,
                         target_token=target_token, target_text=target_text)
    p = 0.6 if accepted else 0.1
    u = rng.uniform(0, p) if accepted else rng.uniform(p, 1)
    residual = [] if accepted else [(target_token, target_text, 0.7), (token + 1000, " other", 0.2)]
    return NodeCheck(slot=slot, depth=depth, token=token, text=text, p=p, q=q, accept_prob=p, uniform=u,
                     accepted=accepted, target_token=target_token, target_text=target_text, residual_top=residual)


def synthetic_run(cycles: list[CycleTrace], temperature: float = 0.0, prompt: str = "a test prompt") -> RunTrace:
    """A run made of the given cycles, with a consistent output (prefill token, then each cycle's commits)."""
    first = cycles[0] if cycles else None
    run = RunTrace(prompt=prompt, prompt_tokens=(first.kv_target.before if first else 5),
                   config={"sampling": {"temperature": temperature, "top_p": 1.0, "max_new_tokens": 64, "seed": 0},
                           "speculative": True, "tree": {"steps": 3, "topk": 2, "draft_tokens": 6, "adjustments": []}},
                   seed=0, device="cpu", dtype="float32", attn_impl="torch", model="synthetic", head="synthetic")
    run.output.append(OutputToken(token=first.tokens[0] if first else 1, text=first.texts[0] if first else "x",
                                  cycle=-1, source="prefill"))
    for c in cycles:
        for s in c.path[1:]:
            run.output.append(OutputToken(token=c.tokens[s], text=c.texts[s], cycle=c.index, source="draft"))
        run.output.append(OutputToken(token=c.bonus_token, text=c.bonus_text, cycle=c.index, source="bonus"))
    run.cycles = list(cycles)
    run.wall_s, run.prefill_ms, run.stop_reason = 0.5, 10.0, "max_new_tokens"
    return run
