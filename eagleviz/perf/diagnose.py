"""Where a draft head's guesses miss: `python -m eagleviz diagnose-head`.

For each MT-bench question, both turns: the first as asked, the second with the target's own answer to the first
as context (the conversation through the chat template: MT-bench's second turns lean on the first answer, as a
chat does). Each runs a chain of 5 at T = 0 (the EAGLE papers' setting, `CHAIN`), whose tokens are plain greedy
decoding's; every cycle's accept length is kept, and from them:

    first      the share of cycles whose first draft token was accepted (a chain's first guess: what a cost-aware
               tree's first level pays on)
    tau        tokens committed per cycle (accepted + the bonus)

split by MT-bench category and turn, by where in the answer the cycle began (`POSITIONS`), and on the prompts of
--prompts (`assets/bench/diagnose-prompts.jsonl`: the page's presets' prompts, which `tests/test_diagnose.py`
holds equal to them). Each question goes to a journal beside --out as it finishes (an interrupted run resumes),
with progress and an ETA. `assets/bench/head-diagnosis.json` is the committed result; `docs/training.md` quotes it.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.journal import Journal

CHAIN = TreeConfig.create(5, 1, 6, adaptive=False, source="eagle")
POSITIONS = (0, 16, 32, 64)   # the answer's token where a position bucket starts: [0, 16), [16, 32), ...


def chain_run(engine, ids: list[int], prompt: str, tokens: int):
    """The chain's greedy run over prompt ids `ids` (already rendered)."""
    sampling = SamplingConfig(max_new_tokens=tokens)
    run = engine.new_run(prompt, ids, CHAIN, sampling)
    for _ in engine.speculate(ids, CHAIN, sampling, run):
        pass
    return run


def conversation_ids(engine, turns: list[str], answers: list[str]) -> list[int]:
    """The chat template over the user's turns with the target's answers between them, ready for the next answer."""
    tok = engine.target.tokenizer
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def question(engine, turns: list[str], tokens: int) -> list[list[int]]:
    """The accept length of every cycle of each turn (the second after the target's answer to the first)."""
    lengths, answers = [], []
    for i, turn in enumerate(turns[:2]):
        run = chain_run(engine, conversation_ids(engine, turns[:i + 1], answers), turn, tokens)
        kept = run.output[:-1] if run.stop_reason == "eos" else run.output   # the answer, without its end token
        answers.append("".join(t.written for t in kept))
        lengths.append([c.accept_length for c in run.cycles])
    return lengths


def summary(lengths: list[list[int]]) -> dict:
    """First-guess acceptance and tau over the cycles of several runs (each a list of accept lengths)."""
    cycles = [a for run in lengths for a in run]
    n = len(cycles)
    return {"cycles": n, "first": round(sum(a >= 1 for a in cycles) / n, 4) if n else None,
            "tau": round(sum(a + 1 for a in cycles) / n, 4) if n else None}


def by_position(lengths: list[list[int]]) -> dict:
    """`summary` per position bucket: a cycle counts where its first new token falls in the answer."""
    buckets = defaultdict(list)
    for run in lengths:
        at = 0
        for a in run:
            start = max(p for p in POSITIONS if p <= at)
            buckets[start].append(a)
            at += a + 1
    ends = [*POSITIONS[1:], None]
    return {f"{p}-{'' if e is None else e - 1}": summary([buckets[p]]) for p, e in zip(POSITIONS, ends)}


def diagnose(engine, questions: list[dict], prompts: list[str], tokens: int, journal: Path | None = None,
             progress=print) -> dict:
    """Every question's two turns (resumed from `journal`), then `prompts` (one turn each); the splits above."""
    from eagleviz.perf.bench import machine_info

    header = {"questions": [q["question_id"] for q in questions], "tokens": tokens, "head": engine.head_name,
              "prompts": prompts}
    log = Journal(journal, header, "diagnose-head", progress)
    done = log.run(len(questions), lambda i: question(engine, questions[i]["turns"], tokens))
    prompt_runs = [[c.accept_length for c in chain_run(engine, engine.encode_prompt(p), p, tokens).cycles]
                   for p in prompts]
    categories = sorted({q["category"] for q in questions})
    turn = {t: [q[t] for q in done if len(q) > t] for t in (0, 1)}
    result = {
        "head": engine.head_name, "tree": [CHAIN.steps, CHAIN.topk, CHAIN.draft_tokens], "temperature": 0.0,
        "tokens": tokens, "questions": len(questions),
        "turn": {str(t + 1): summary(turn[t]) for t in (0, 1)},
        "category": {c: {str(t + 1): summary([q[t] for q, meta in zip(done, questions)
                                              if meta["category"] == c and len(q) > t]) for t in (0, 1)}
                     for c in categories},
        "position": {str(t + 1): by_position(turn[t]) for t in (0, 1)},
        "prompts": {p[:60]: summary([r]) for p, r in zip(prompts, prompt_runs)},
        "machine": machine_info(engine)}
    log.close()
    return result


def main(argv: list[str]) -> int:
    from eagleviz.decoding.load import add_model_args, load_engine

    p = argparse.ArgumentParser(prog="python -m eagleviz diagnose-head", description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=80, help="the first N MT-bench questions (80: all)")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per turn")
    p.add_argument("--prompts", default=None,
                   help="more prompts, one turn each: a file (.jsonl with a \"prompt\" field, or one a line); the "
                        "committed result's are assets/bench/diagnose-prompts.jsonl, the page's presets'")
    p.add_argument("--out", type=Path, default=None,
                   help="write the result there (assets/bench/head-diagnosis.json is the committed one)")
    add_model_args(p)
    args = p.parse_args(argv)
    from eagleviz.prompts import load_prompts, mtbench_path

    rows = [json.loads(line) for line in mtbench_path().read_text().splitlines() if line.strip()]
    engine = load_engine(args.model, args.head, args.dtype, args.device, args.attn_impl, kv_dtype=args.kv_dtype,
                         weights=args.weights, decode=args.decode)
    journal = args.out.with_suffix(".journal.jsonl") if args.out else None
    extra = load_prompts(args.prompts) if args.prompts else []
    result = diagnose(engine, rows[:args.questions], extra, args.tokens, journal)
    result["command"] = "python -m eagleviz diagnose-head " + " ".join(argv)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0
