"""From conversations to a trained head: samples -> cached feature shards -> draft vocabulary -> Trainer.

Everything slow is cached under `cache_dir` and resumable: self-distilled answers (one JSON-lines shard per
240 prompts), target features (one shard per 200 sequences). A cache directory is keyed by its settings
(answer source, max_len), so changing them never mixes incompatible shards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from eagleviz.train import data as D
from eagleviz.train.features import FeatureShard, collect
from eagleviz.train.vocab import coverage, draft_vocab, smallest_covering, token_counts

SEQS_PER_SHARD = 200
DRAFT_VOCAB_SIZES = (4096, 8192, 16384)
ANSWER_SOURCES = ("original", "self", "sampled")
SAMPLED_TEMPERATURE = 1.0


@dataclass(frozen=True)
class DataConfig:
    """data: "sharegpt" or a FILE in ShareGPT format; answers: one source or several joined by "+", each
    conversation appearing once per source: "original" (the file's answers), "self" (the target's greedy
    answers, generated and cached), "sampled" (the target's answers sampled at T = 1, generated and cached);
    "both" means "original+self". heldout: conversations kept out of training. first_conversation: skip
    that many training conversations (a later stage trains on prompts an earlier one never saw); its answers
    and features are cached apart from those of a run starting at 0."""

    data: str = "sharegpt"
    answers: str = "original"
    max_conversations: int = 1600
    first_conversation: int = 0
    max_len: int = 512
    heldout: int = 200
    seed: int = 0

    def __post_init__(self):
        names = self.sources
        if not names or any(n not in ANSWER_SOURCES for n in names) or len(set(names)) < len(names):
            raise ValueError(f"answers must be 'both' or distinct sources from {ANSWER_SOURCES} joined by '+', "
                             f"got {self.answers!r}")
        if self.first_conversation < 0:
            raise ValueError(f"first_conversation must be >= 0, got {self.first_conversation}")

    @property
    def sources(self) -> tuple[str, ...]:
        """The answer sources to train on, each cached on its own."""
        return ("original", "self") if self.answers == "both" else tuple(self.answers.split("+"))

    @property
    def cache_suffix(self) -> str:
        """Appended to the answer and feature cache directories of a run that skips conversations."""
        return f"-from{self.first_conversation}" if self.first_conversation else ""

    def chosen(self, train_idx: list[int]) -> list[int]:
        """The training conversations this run uses, in order."""
        return train_idx[self.first_conversation:self.first_conversation + self.max_conversations]


def train_samples(target, cfg: DataConfig, prompts: list[tuple[str, str]], train_idx: list[int], cache: Path,
                  progress=None, source: str = "original") -> list[D.Sample]:
    """The training conversations with the answers of `source` (one of cfg.sources)."""
    eos = min(target.eos_token_ids)
    if source == "original":
        return [D.render(target.tokenizer, prompts[i][0], prompts[i][1], eos)
                for i in cfg.chosen(train_idx) if prompts[i][1].strip()]
    temperature = SAMPLED_TEMPERATURE if source == "sampled" else 0.0
    answers_dir = cache / (("answers" if source == "self" else f"answers-sampled-T{temperature:g}") + cfg.cache_suffix)
    asked = [prompts[i][0] for i in cfg.chosen(train_idx)]
    D.generate_answers(target, asked, answers_dir, temperature=temperature, seed=cfg.seed, progress=progress)
    return D.read_answers(answers_dir, len(asked))


def build_features(target, samples: list[D.Sample], out_dir: Path, max_len: int, progress=None) -> FeatureShard:
    """Feature shards of `samples` (SEQS_PER_SHARD sequences each); shards already on disk are reused."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, len(samples), SEQS_PER_SHARD):
        chunk = samples[s:s + SEQS_PER_SHARD]
        paths.append(out_dir / f"shard-{s // SEQS_PER_SHARD:05d}-{len(chunk)}.pt")  # a grown tail shard is redone
        if not paths[-1].exists():
            collect(target, chunk, max_len, batch_tokens=1024).save(paths[-1])
        if progress is not None:
            progress.update(len(chunk))
    return FeatureShard.cat([FeatureShard.load(p) for p in paths])


HELDOUT_ANSWERS = ("original", "self")


def heldout_features(target, cfg: DataConfig, prompts, held_idx: list[int], cache: Path,
                     answers: str = "original", progress=None) -> FeatureShard:
    """Features of the held-out conversations (the same split for every run) with their original answers, or
    with the target's own greedy answers ("self": the text greedy decoding reads, generated once and cached)."""
    if answers not in HELDOUT_ANSWERS:
        raise ValueError(f"held-out answers must be one of {HELDOUT_ANSWERS}, got {answers!r}")
    tag = "" if answers == "original" else f"-{answers}"
    path = cache / f"heldout-{cfg.heldout}{tag}-L{cfg.max_len}.pt"
    if path.exists():
        return FeatureShard.load(path)
    if answers == "self":
        answers_dir = cache / f"answers-heldout-{cfg.heldout}"
        asked = [prompts[i][0] for i in held_idx]
        D.generate_answers(target, asked, answers_dir, progress=progress)
        samples = D.read_answers(answers_dir, len(asked))
    else:
        eos = min(target.eos_token_ids)
        samples = [D.render(target.tokenizer, prompts[i][0], prompts[i][1], eos)
                   for i in held_idx if prompts[i][1].strip()]
    shard = collect(target, samples, cfg.max_len)
    cache.mkdir(parents=True, exist_ok=True)
    shard.save(path)
    return shard


def choose_vocab(shard: FeatureShard, vocab_size: int, eos_ids, size: int | None, min_coverage: float = 0.99):
    """(d2t, t2d, report): the draft vocabulary from the answer tokens of `shard`; size None picks the
    smallest of DRAFT_VOCAB_SIZES covering `min_coverage` of them."""
    counts = token_counts(shard.ids, shard.mask, vocab_size)
    size = size or smallest_covering(counts, DRAFT_VOCAB_SIZES, min_coverage)
    d2t, t2d = draft_vocab(counts, size, always=tuple(sorted(eos_ids)))
    report = {f"coverage_{n}": round(coverage(counts, n), 4) for n in DRAFT_VOCAB_SIZES} | {"draft_vocab_size": size}
    return d2t, t2d, report


def write_hot_tokens(head, shard: FeatureShard, head_dir: Path, source: str) -> Path:
    """Rank the EAGLE-3 head's draft vocabulary by its frequency among the answer tokens of `shard` and write
    the head's hot-tokens.json (eagleviz.models.hot_vocab)."""
    from eagleviz.models.hot_vocab import draft_target_ids, rank_tokens, write_ranking

    counts = token_counts(shard.ids, shard.mask, head.config.vocab_size)
    return write_ranking(head_dir, rank_tokens(counts, draft_target_ids(head).cpu()), source, int(counts.sum()))


def rank_answer_tokens(target, head, head_dir: Path, data: str, conversations: int, heldout: int,
                       seed: int = 0) -> tuple[Path, int]:
    """hot-tokens.json for an existing head: count the answer tokens (target tokenizer) of the first
    `conversations` training conversations of `data`, the held-out split excluded as in training."""
    from eagleviz.models.hot_vocab import draft_target_ids, rank_tokens, write_ranking

    prompts = D.load_prompts(data)
    train_idx, _ = D.split(len(prompts), heldout, seed)
    counts = torch.zeros(head.config.vocab_size, dtype=torch.long)
    for i in train_idx[:conversations]:
        ids = target.tokenizer(prompts[i][1], add_special_tokens=False)["input_ids"]
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=counts.numel())[:counts.numel()]
    source = f"{data} answers of {min(conversations, len(train_idx))} training conversations"
    counted = int(counts.sum())
    return write_ranking(head_dir, rank_tokens(counts, draft_target_ids(head).cpu()), source, counted), counted


def init_head(target, path: str | Path, arch: str, hot: int | None = None, add_layers: int = 0):
    """A trainable fp32 copy of the head in `path` (weights and, for EAGLE-3, its draft vocabulary); given
    `hot`, only the rows of its `hot` most frequent draft tokens (its hot-tokens.json), so that the head
    trains in the vocabulary the engine drafts in; given `add_layers`, deeper by that many decoder layers
    (`grow`), starting as exactly the same function."""
    from eagleviz.errors import UserFacingError
    from eagleviz.models.draft import load_head
    from eagleviz.models.hot_vocab import HOT_TOKENS_FILE, read_ranking, restrict

    head = load_head(path, target)
    if head.config.arch != arch:
        raise UserFacingError(f"--init {path} is an {head.config.arch} head, but --arch is {arch}")
    if hot is not None and hot < head.config.draft_vocab_size:
        if arch != "eagle3":
            raise UserFacingError("--draft-vocab with --init needs an EAGLE-3 head")
        ranking = read_ranking(path)
        if ranking is None:
            raise UserFacingError(f"--draft-vocab {hot}: {path} has no {HOT_TOKENS_FILE} to rank its draft "
                                  "vocabulary (write one with `python -m eagleviz hot-tokens --head ...`)")
        head = restrict(head, ranking, hot)
    if add_layers:
        head = grow(head, add_layers, target)
    return head.float().train()


def resumed_head(ckpt: Path, arch: str):
    """An fp32 head shaped like the one saved in a training checkpoint (weights not loaded)."""
    from eagleviz.models.draft import DraftConfig, DraftHead

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    layers = 1 + len({k.split(".")[1] for k in state["head"] if k.startswith("layers.")}) if arch == "eagle3" else 1
    return DraftHead(DraftConfig.from_hf(state["head_config"], arch, layers)).float().train()


def grow(head, add_layers: int, target):
    """`head` with `add_layers` more decoder layers after its last one. Each new layer's attention and MLP
    inputs start from the target's last layer (features a decoder layer of this model computes) and its
    two output projections (o_proj, down_proj) at zero, so each new layer adds nothing yet: the deeper head
    computes exactly what `head` computed, and training moves it from there."""
    import dataclasses

    from eagleviz.models.draft import DraftHead

    if add_layers < 0:
        raise ValueError(f"add_layers must be >= 0, got {add_layers}")
    c = head.config
    config = dataclasses.replace(c, num_layers=c.num_layers + add_layers)
    deeper = DraftHead(config).to(head.lm_head.weight.dtype if c.arch == "eagle3" else head.fc.weight.dtype)
    missing, unexpected = deeper.load_state_dict(head.state_dict(), strict=False)
    assert not unexpected, unexpected
    source = target.hf.model.layers[-1]
    with torch.no_grad():
        for layer in deeper.blocks[c.num_layers:]:
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(layer.self_attn, name).weight.copy_(getattr(source.self_attn, name).weight)
            for name in ("gate_proj", "up_proj"):
                getattr(layer.mlp, name).weight.copy_(getattr(source.mlp, name).weight)
            layer.input_layernorm.weight.copy_(source.input_layernorm.weight)
            layer.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight)
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return deeper


def cache_name(target_name: str) -> str:
    """A directory name for a target's cached data ("HuggingFaceTB/SmolLM2-135M-Instruct" ->
    "smollm2-135m-instruct")."""
    return re.sub(r"[^a-z0-9.]+", "-", target_name.lower().rsplit("/", 1)[-1]).strip("-")


def target_parts(target):
    from eagleviz.train.objectives import TargetParts

    for p in target.hf.parameters():
        p.requires_grad_(False)
    return TargetParts(embed=target.hf.model.embed_tokens.weight.detach(), lm_head=target.lm_head)


def set_threads(threads: int = 0) -> None:
    """Intra-op threads: `threads`, or every core the process may run on when 0. On a CPU shared with other
    busy processes, 1 thread can be several times faster than 2 (OpenMP threads spin waiting for each other)."""
    import os

    torch.set_num_threads(threads or max(1, len(os.sched_getaffinity(0))))
