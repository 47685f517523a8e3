"""Training conversations for a draft head: ShareGPT first turns, answered by the target itself.

The EAGLE papers train on ShareGPT. EAGLE-3 regenerates the answers with the target: the head then learns
the distribution it will have to predict at decoding time, not the style of the original answers. Here the
target answers each first human turn, greedily or sampled at T = 1 (the contexts a head meets when decoding
samples), in batches, and the answers are cached on disk in shards of JSON lines, so that an interrupted
generation resumes where it stopped.

A sample is (ids, loss_mask): the chat-template rendering of one user turn and the assistant's answer;
loss_mask[i] is 1 when token i belongs to the answer (the head is trained to predict those tokens only).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eagleviz.prompts import conversations

load_prompts = conversations  # the training prompts: ShareGPT's first turns, or a FILE in its format


@dataclass(frozen=True)
class Sample:
    """One training sequence. ids: token ids; loss_mask: 1 on answer tokens, same length."""

    ids: list[int]
    loss_mask: list[int]

    def __post_init__(self):
        if len(self.ids) != len(self.loss_mask):
            raise ValueError(f"ids ({len(self.ids)}) and loss_mask ({len(self.loss_mask)}) differ in length")


def split(n: int, held_out: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """A fixed shuffle of range(n) cut into (train indices, held-out indices)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held_out = min(held_out, n // 2)
    return order[held_out:], order[:held_out]


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The chat-template rendering of one user turn, ending with the assistant header (as the engine does)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render(tokenizer, prompt: str, answer: str, eos_id: int) -> Sample:
    """A user turn and a given answer (e.g. ShareGPT's own), the answer closed by the end-of-turn token."""
    head = prompt_ids(tokenizer, prompt)
    tail = tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos_id]
    return Sample(head + tail, [0] * len(head) + [1] * len(tail))


# ------------------------------------------------------------------ self-distilled answers

def _shard_path(out_dir: Path, index: int, count: int, shard_size: int) -> Path:
    """A full shard is answers-NNNNN.jsonl; a tail shard of fewer prompts carries its count."""
    tail = "" if count == shard_size else f"-{count}"
    return out_dir / f"answers-{index:05d}{tail}.jsonl"


def _covering_shard(out_dir: Path, index: int, count: int, shard_size: int) -> Path | None:
    """An existing shard number `index` holding at least its first `count` prompts (a full shard, or a tail
    shard of a run that asked for as many or more), or None: a run asking for more prompts than a cached tail
    shard holds regenerates it instead of silently training on fewer."""
    for c in [shard_size] + list(range(shard_size - 1, count - 1, -1)):
        path = _shard_path(out_dir, index, c, shard_size)
        if path.exists():
            return path
    return None


@torch.inference_mode()
def answer_batch(hf_model, pad_id: int, eos_ids: frozenset[int], prompts: list[list[int]],
                 max_new_tokens: int, temperature: float = 0.0) -> list[list[int]]:
    """The target's answers to a batch of tokenized prompts (left padding): greedy at temperature 0, else
    sampled from softmax(logits / temperature) with no top-k or top-p truncation (torch's global RNG). Each
    answer ends at its first end-of-turn token (kept) or at max_new_tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
    out = hf_model.generate(input_ids=ids.to(hf_model.device), attention_mask=mask.to(hf_model.device),
                            max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=sorted(eos_ids),
                            **sampling)
    answers = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        answers.append(row[:cut])
    return answers


def generate_answers(target, prompts: list[str], out_dir: Path, *, shard_size: int = 240, batch_size: int = 64,
                     max_prompt_len: int = 256, max_new_tokens: int = 256, temperature: float = 0.0, seed: int = 0,
                     progress=None, deadline: float | None = None) -> int:
    """Answer `prompts` with the target (greedy, or sampled at `temperature`), shard by shard; shards already
    on disk are skipped (resume). Sampling reseeds torch with seed + shard index before each shard, so a
    resumed run writes the shards an uninterrupted one would. No new shard starts after `deadline`
    (time.monotonic()); returns how many of the prompts, from the first, have their shard on disk.

    Prompts whose rendering exceeds max_prompt_len tokens are skipped. Within a shard the prompts are sorted
    by length so that a batch wastes little padding. A shard is written to a temporary file and renamed when
    complete, so a killed run never leaves half a shard.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = target.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(target.eos_token_ids)
    for s in range(0, len(prompts), shard_size):
        count = min(shard_size, len(prompts) - s)
        if _covering_shard(out_dir, s // shard_size, count, shard_size) is not None:
            if progress is not None:
                progress.update(count)
            continue
        if deadline is not None and time.monotonic() > deadline:
            return s
        rendered = [prompt_ids(tok, p) for p in prompts[s:s + shard_size]]
        order = sorted((i for i, r in enumerate(rendered) if len(r) <= max_prompt_len), key=lambda i: len(rendered[i]))
        torch.manual_seed(seed + s // shard_size)
        lines = []
        for b in range(0, len(order), batch_size):
            batch = order[b:b + batch_size]
            answers = answer_batch(target.hf, pad_id, target.eos_token_ids, [rendered[i] for i in batch],
                                   max_new_tokens, temperature)
            for i, ans in zip(batch, answers):
                lines.append(json.dumps({"prompt": s + i, "ids": rendered[i] + ans, "answer_start": len(rendered[i])}))
            if progress is not None:
                progress.update(len(batch))
        if progress is not None:
            progress.update(len(rendered) - len(order))
        path = _shard_path(out_dir, s // shard_size, count, shard_size)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(path)
    return len(prompts)


def read_answers(out_dir: Path, prompts: int, shard_size: int = 240) -> list[Sample]:
    """The self-distilled answers to the first `prompts` prompts, as samples (loss on the answer tokens).
    Shards cached for a larger run are read only up to `prompts`, so a run trains on what it asked for."""
    samples = []
    for index in range(-(-prompts // shard_size)):
        count = min(shard_size, prompts - index * shard_size)
        path = _covering_shard(out_dir, index, count, shard_size)
        if path is None:
            raise FileNotFoundError(f"missing answers shard {_shard_path(out_dir, index, count, shard_size)}: "
                                    "generate_answers first")
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            start = rec["answer_start"]
            if rec["prompt"] < prompts and len(rec["ids"]) > start:
                samples.append(Sample(rec["ids"], [0] * start + [1] * (len(rec["ids"]) - start)))
    return samples
