"""Draft-head training: data parsing, loss masks, the training-time-test mask, learning, save/load."""

from __future__ import annotations

import json

import pytest
import torch

from eagleviz.models.draft import load_head, save_head
from eagleviz.models.target import TargetModel
from eagleviz.prompts import first_turns, iter_records
from eagleviz.train import data as D
from eagleviz.train.batches import make_row, pack
from eagleviz.train.cache import ListKVCache
from eagleviz.train.features import FeatureShard, collect
from eagleviz.train.objectives import TargetParts, block_causal, ttt_loss, ttt_mask, valid_at
from eagleviz.train.trainer import Trainer, TrainConfig, lr_at, new_head
from eagleviz.train.vocab import coverage, draft_vocab, smallest_covering, token_counts

V = 96


@pytest.fixture(scope="module")
def tiny_target():
    """An 8-layer Llama small enough for CPU tests, with a peaked output distribution (a learnable target)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg)
    with torch.no_grad():
        hf.lm_head.weight.mul_(40.0)
    return TargetModel(hf.eval(), None, "tiny")


@pytest.fixture(scope="module")
def tiny_shard(tiny_target):
    gen = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(24):
        n = int(torch.randint(12, 40, (1,), generator=gen))
        samples.append(D.Sample(torch.randint(0, V, (n,), generator=gen).tolist(), [0] * 4 + [1] * (n - 4)))
    return collect(tiny_target, samples, max_len=64, batch_tokens=128)


def _parts(target) -> TargetParts:
    return TargetParts(embed=target.hf.model.embed_tokens.weight.detach(), lm_head=target.lm_head)


# ------------------------------------------------------------------ data

def test_truncated_json_array_yields_complete_records():
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
            for i in range(3)]
    text = json.dumps(recs, indent=2)
    cut = text[:text.rindex('"a2"') + 2]  # inside the last record
    assert [r["id"] for r in iter_records(cut)] == ["0", "1"]
    assert [r["id"] for r in iter_records(text)] == ["0", "1", "2"]
    assert first_turns(iter_records(text))[1] == ("q1", "a1")


def test_first_turns_skip_conversations_not_opened_by_a_human():
    recs = [{"conversations": [{"from": "gpt", "value": "hi"}]}, {"conversations": []},
            {"conversations": [{"from": "human", "value": "  "}]}, {"conversations": [{"from": "human", "value": "q"}]}]
    assert first_turns(iter(recs)) == [("q", "")]


def test_split_is_fixed_and_disjoint():
    a, b = D.split(100, 10, seed=3)
    assert (a, b) == D.split(100, 10, seed=3)
    assert len(b) == 10 and not set(a) & set(b) and sorted(a + b) == list(range(100))


def test_loss_mask_covers_exactly_the_assistant_answer():
    from eagleviz.models.loading import embedded_snapshot
    from transformers import AutoTokenizer

    from eagleviz.errors import UserFacingError

    try:
        snapshot = embedded_snapshot()
    except UserFacingError as exc:  # the embedded model package is not installed: nothing else is excused
        pytest.skip(str(exc))
    tok = AutoTokenizer.from_pretrained(str(snapshot))
    s = D.render(tok, "What is 2+2?", "It is 4.", eos_id=2)
    answer = [t for t, m in zip(s.ids, s.loss_mask) if m]
    context = [t for t, m in zip(s.ids, s.loss_mask) if not m]
    assert tok.decode(answer) == "It is 4.<|im_end|>"
    assert tok.decode(context).endswith("<|im_start|>assistant\n")
    assert s.ids[:len(context)] == D.prompt_ids(tok, "What is 2+2?")


# ------------------------------------------------------------------ features and packing

def test_features_equal_the_engine_forward(tiny_target, tiny_shard):
    sl = tiny_shard.sequence(5)
    ids = tiny_shard.ids[sl].long()
    n = ids.numel()
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    out = tiny_target.forward(ids, torch.arange(n), tiny_target.new_cache(n), causal,
                              feature_layers=tiny_target.eagle3_layers)
    torch.testing.assert_close(out.features.bfloat16(), tiny_shard.aux[sl], atol=2e-2, rtol=2e-2)
    out = tiny_target.forward(ids, torch.arange(n), tiny_target.new_cache(n), causal)
    torch.testing.assert_close(out.features.bfloat16(), tiny_shard.final[sl], atol=2e-2, rtol=2e-2)
    assert (out.logits.argmax(-1) == tiny_shard.top[sl]).float().mean() > 0.95


def test_packing_keeps_sequences_whole_and_apart(tiny_shard):
    lengths = [int(n) for n in tiny_shard.offsets.diff()]
    rows = pack(lengths, 80, seed=0)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 80 for r in rows if len(r) > 1)
    row = make_row(tiny_shard, rows[0])
    assert row.pos[0] == 0 and (row.pos[row.seq == 1] == torch.arange(lengths[rows[0][1]])).all()
    m = block_causal(row.seq)
    assert not m[row.seq == 1][:, row.seq == 0].any()


# ------------------------------------------------------------------ the training-time test

def test_ttt_mask_rows():
    seq = torch.tensor([0, 0, 0, 1, 1])
    r = seq.numel()
    assert ttt_mask(seq, 0).shape == (r, r)
    m = ttt_mask(seq, 2)
    assert m.shape == (r, 3 * r)
    # anchor 4 (second token of sequence 1): step-0 keys 3 and 4, then only its own keys at steps 1 and 2
    assert m[4].nonzero().flatten().tolist() == [3, 4, r + 4, 2 * r + 4]
    assert m[0].nonzero().flatten().tolist() == [0, r, 2 * r]


def test_valid_positions_stay_inside_the_answer_of_their_sequence():
    from eagleviz.train.batches import Row

    seq = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    mask = torch.tensor([0, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    n = seq.numel()
    row = Row(ids=torch.zeros(n, dtype=torch.long), pos=torch.zeros(n, dtype=torch.long), seq=seq, mask=mask,
              aux=torch.zeros(n, 3), final=torch.zeros(n, 1), top_ids=torch.zeros(n, 1, dtype=torch.long),
              top_p=torch.ones(n, 1))
    # step 0: anchor p predicts token p + 2
    assert valid_at(row, 0).nonzero().flatten().tolist() == [0, 1, 4]
    assert valid_at(row, 1).nonzero().flatten().tolist() == [0]


def test_list_cache_is_autograd_safe():
    cache = ListKVCache(1)
    k = torch.randn(3, 2, 4, requires_grad=True)
    cache.write(0, 0, k, k * 2)
    cache.advance(3)
    cache.write(0, 3, k[:1] * 3, k[:1])
    keys, values = cache.view(0, 4)
    (keys.sum() + values.sum()).backward()
    assert keys.shape == (4, 2, 4) and k.grad is not None and float(k.grad[0, 0, 0]) == 7.0


def test_unrolled_chain_does_not_depend_on_other_chains(tiny_target, tiny_shard):
    """Dropping anchors from the unroll (unroll_fraction < 1) must not change the kept anchors' results."""
    head = new_head(tiny_target, "eagle3")
    row = make_row(tiny_shard, pack([int(n) for n in tiny_shard.offsets.diff()], 128, 0)[0])
    parts = _parts(tiny_target)
    full = ttt_loss(head, row, parts, steps=3)
    gen = torch.Generator().manual_seed(0)
    part = ttt_loss(head, row, parts, steps=3, unroll_fraction=0.999, gen=gen)
    assert full.count == part.count and full.correct == part.correct
    torch.testing.assert_close(full.loss, part.loss)


@pytest.mark.parametrize("arch,objective", [("eagle3", "ttt"), ("eagle1", "eagle1")])
def test_a_few_steps_reduce_the_loss(tiny_target, tiny_shard, tmp_path, arch, objective):
    d2t = t2d = None
    if arch == "eagle3":
        d2t, t2d = draft_vocab(token_counts(tiny_shard.top.long(), tiny_shard.mask, V), 64)
    head = new_head(tiny_target, arch, d2t, t2d)
    cfg = TrainConfig(arch=arch, objective=objective, row_len=128, max_steps=40, lr=3e-3, warmup=2,
                      eval_every=40, eval_rows=2, ttt_steps=3, autocast=False)
    trainer = Trainer(cfg, head, _parts(tiny_target), tiny_shard, tiny_shard, tmp_path)
    trainer.run()
    first, last = trainer.history[0]["heldout"], trainer.history[-1]["heldout"]
    assert last["loss"] < first["loss"] - 0.05
    assert last["acc"][0] > first["acc"][0]
    assert (tmp_path / "curve.html").stat().st_size < 200_000


def test_resume_continues_the_same_run(tiny_target, tiny_shard, tmp_path):
    cfg = TrainConfig(arch="eagle1", objective="eagle1", row_len=128, max_steps=6, warmup=1, eval_every=3,
                      eval_rows=1, autocast=False)
    parts = _parts(tiny_target)
    a = Trainer(cfg, new_head(tiny_target, "eagle1"), parts, tiny_shard, tiny_shard, tmp_path / "a")
    a.run()
    b = Trainer(cfg, new_head(tiny_target, "eagle1"), parts, tiny_shard, tiny_shard, tmp_path / "b")
    b.run(minutes=0)  # one step, then checkpoint
    c = Trainer(cfg, new_head(tiny_target, "eagle1", seed=1), parts, tiny_shard, tiny_shard, tmp_path / "b")
    c.load()
    assert c.step == 1
    c.run()
    for (name, pa), pc in zip(a.head.named_parameters(), c.head.parameters()):
        torch.testing.assert_close(pa, pc, msg=name)


def test_saved_head_loads_with_the_engine_loader(tiny_target, tiny_shard, tmp_path):
    d2t, t2d = draft_vocab(token_counts(tiny_shard.ids, tiny_shard.mask, V), 32, always=(0,))
    head = new_head(tiny_target, "eagle3", d2t, t2d)
    save_head(head, tmp_path)
    loaded = load_head(tmp_path, tiny_target)
    assert loaded.config.draft_vocab_size == 32 and t2d[0]
    assert torch.equal(loaded.d2t, d2t) and torch.equal(loaded.t2d, t2d)
    torch.testing.assert_close(loaded.lm_head.weight.float(), head.lm_head.weight.bfloat16().float())


def test_init_head_warm_starts_from_a_saved_head(tiny_target, tiny_shard, tmp_path):
    from eagleviz.errors import UserFacingError
    from eagleviz.train.pipeline import init_head

    d2t, t2d = draft_vocab(token_counts(tiny_shard.ids, tiny_shard.mask, V), 32, always=(0,))
    save_head(new_head(tiny_target, "eagle3", d2t, t2d, seed=3), tmp_path)
    head = init_head(tiny_target, tmp_path, "eagle3")
    assert head.training and all(p.dtype == torch.float32 for p in head.parameters())
    assert torch.equal(head.d2t, d2t) and torch.equal(head.t2d, t2d)
    before = head.lm_head.weight.clone()
    cfg = TrainConfig(arch="eagle3", objective="ttt", row_len=128, max_steps=2, warmup=1, eval_every=2, eval_rows=1,
                      autocast=False)
    Trainer(cfg, head, _parts(tiny_target), tiny_shard, tiny_shard, tmp_path / "run").run()
    assert not torch.equal(before, head.lm_head.weight)
    with pytest.raises(UserFacingError, match="eagle3 head"):
        init_head(tiny_target, tmp_path, "eagle1")


# ------------------------------------------------------------------ vocabulary and schedule

def test_draft_vocabulary_maps_back_to_target_ids():
    counts = torch.tensor([5, 0, 9, 1, 7, 0])
    d2t, t2d = draft_vocab(counts, 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 4] and t2d.tolist() == [1, 0, 1, 0, 1, 0]
    assert coverage(counts, 3) == pytest.approx(21 / 22)
    assert smallest_covering(counts, (1, 2, 3, 4), 0.95) == 3


def test_schedule_warms_up_then_decays():
    cfg = TrainConfig(lr=1e-3, warmup=10, min_lr_ratio=0.1)
    assert lr_at(cfg, 0, 100) == pytest.approx(1e-4)
    assert lr_at(cfg, 9, 100) == pytest.approx(1e-3)
    assert lr_at(cfg, 100, 100) == pytest.approx(1e-4)
    assert lr_at(cfg, 50, 100) < lr_at(cfg, 20, 100)


def test_feature_shard_round_trip(tiny_shard, tmp_path):
    tiny_shard.save(tmp_path / "s.pt")
    back = FeatureShard.load(tmp_path / "s.pt")
    both = FeatureShard.cat([back, back])
    assert both.num_sequences == 2 * tiny_shard.num_sequences
    assert torch.equal(both.ids[tiny_shard.num_tokens:], tiny_shard.ids)
    assert int(both.offsets[-1]) == 2 * tiny_shard.num_tokens


def test_answer_sources():
    from eagleviz.train.pipeline import DataConfig

    assert DataConfig(answers="both").sources == ("original", "self")
    assert DataConfig(answers="self").sources == ("self",)
    assert DataConfig(answers="self+sampled").sources == ("self", "sampled")
    for bad in ("mine", "self+self", "", "self+"):
        with pytest.raises(ValueError, match="answers must be"):
            DataConfig(answers=bad)


def _first_tokens(hf, prompt: list[int], n: int, temperature: float, seed: int) -> list[int]:
    torch.manual_seed(seed)
    return [a[0] for a in D.answer_batch(hf, 0, frozenset({V - 1}), [prompt] * n, 1, temperature)]


def test_sampled_answers_follow_the_tempered_target_without_truncation(tiny_target):
    """At T = 40 the tiny target's logits (scaled by 40) are flat enough that a top-k of 50 (the library's
    default) or a top-p would visibly cut the tail: the first answer tokens must follow softmax(logits / T)."""
    from scipy.stats import chisquare

    prompt, n = [3, 17, 42, 8], 4000
    with torch.no_grad():
        logits = tiny_target.hf(torch.tensor([prompt])).logits[0, -1].float()
    p = torch.softmax(logits / 40.0, dim=-1)
    assert float(p.sort(descending=True).values[50:].sum()) > 0.1  # the tail a default top-k would drop
    assert float(p.min()) * n >= 5
    obs = torch.bincount(torch.tensor(_first_tokens(tiny_target.hf, prompt, n, 40.0, 0)), minlength=V).double()
    exp = p.double() / p.double().sum() * n
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3
    assert _first_tokens(tiny_target.hf, prompt, 64, 40.0, 0) == _first_tokens(tiny_target.hf, prompt, 64, 40.0, 0)


def test_greedy_answers_are_the_argmax_continuation(tiny_target):
    prompt = [5, 9, 11]
    answer = D.answer_batch(tiny_target.hf, 0, frozenset({V - 1}), [prompt, [7] + prompt], 6)[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in answer:
            ids.append(int(tiny_target.hf(torch.tensor([ids])).logits[0, -1].argmax()))
    assert answer == ids[len(prompt):]


def test_read_answers_stops_at_the_prompts_asked_for(tmp_path):
    for name, prompts in (("00000", (0, 1, 2)), ("00001", (3, 4, 5)), ("00002-1", (6,))):
        lines = [json.dumps({"prompt": i, "ids": [7, 8, 9 + i], "answer_start": 2}) for i in prompts]
        (tmp_path / f"answers-{name}.jsonl").write_text("\n".join(lines) + "\n")
    assert [s.ids[-1] - 9 for s in D.read_answers(tmp_path, 4, shard_size=3)] == [0, 1, 2, 3]
    assert [s.ids[-1] - 9 for s in D.read_answers(tmp_path, 7, shard_size=3)] == list(range(7))
    assert D.read_answers(tmp_path, 2, shard_size=3)[1].loss_mask == [0, 0, 1]
    with pytest.raises(FileNotFoundError, match="answers-00002-2"):  # the tail shard of a smaller run
        D.read_answers(tmp_path, 8, shard_size=3)


# ------------------------------------------------------------------ later stages: new prompts, hot vocabulary, dense target

def test_first_conversation_skips_the_prompts_of_earlier_stages():
    from eagleviz.train.pipeline import DataConfig

    idx = list(range(100, 120))
    assert DataConfig(max_conversations=5).chosen(idx) == idx[:5]
    later = DataConfig(max_conversations=5, first_conversation=4)
    assert later.chosen(idx) == idx[4:9] and later.cache_suffix == "-from4"
    assert DataConfig().cache_suffix == ""  # a run from 0 keeps the cache directories it always had
    with pytest.raises(ValueError, match="first_conversation"):
        DataConfig(first_conversation=-1)


def test_dense_target_is_the_target_distribution_over_the_draft_vocabulary(tiny_target, tiny_shard):
    from eagleviz.train.objectives import dense_targets

    d2t, t2d = draft_vocab(token_counts(tiny_shard.top.long(), tiny_shard.mask, V), 48)
    head = new_head(tiny_target, "eagle3", d2t, t2d)
    row = make_row(tiny_shard, [0, 1, 2])
    p, in_vocab = dense_targets(head, row, _parts(tiny_target))
    rows = head.to_target_ids(torch.arange(48))
    full = torch.softmax(tiny_target.lm_head(row.final.to(tiny_target.dtype)).float(), dim=-1)
    torch.testing.assert_close(p, full[:, rows] / full[:, rows].sum(-1, keepdim=True), atol=1e-5, rtol=1e-4)
    assert torch.equal(in_vocab, t2d[row.top])
    # the top-8 target is the dense one cut to 8 tokens: where those 8 hold all the mass, the losses agree
    peaked = ttt_loss(head, row, _parts(tiny_target), steps=2, target_dist="dense")
    sparse = ttt_loss(head, row, _parts(tiny_target), steps=2, target_dist="top8")
    assert peaked.correct == sparse.correct and peaked.count == sparse.count
    assert abs(float(peaked.loss.detach()) - float(sparse.loss.detach())) < 0.1 * float(sparse.loss.detach())
    with pytest.raises(ValueError, match="target_dist"):
        ttt_loss(head, row, _parts(tiny_target), steps=1, target_dist="kl")
    with pytest.raises(ValueError, match="eagle3"):
        TrainConfig(arch="eagle1", objective="ttt", target_dist="dense")


def test_dense_target_trains(tiny_target, tiny_shard, tmp_path):
    d2t, t2d = draft_vocab(token_counts(tiny_shard.top.long(), tiny_shard.mask, V), 64)
    cfg = TrainConfig(arch="eagle3", objective="ttt", target_dist="dense", row_len=128, max_steps=40, lr=3e-3,
                      warmup=2, eval_every=40, eval_rows=2, ttt_steps=3, autocast=False)
    trainer = Trainer(cfg, new_head(tiny_target, "eagle3", d2t, t2d), _parts(tiny_target), tiny_shard, tiny_shard,
                      tmp_path)
    trainer.run()
    first, last = trainer.history[0]["heldout"], trainer.history[-1]["heldout"]
    assert last["loss"] < first["loss"] - 0.05 and last["acc"][0] > first["acc"][0]


def test_init_head_keeps_only_the_hot_rows(tiny_target, tiny_shard, tmp_path):
    from eagleviz.errors import UserFacingError
    from eagleviz.models.hot_vocab import draft_target_ids, write_ranking
    from eagleviz.train.pipeline import init_head

    d2t, t2d = draft_vocab(token_counts(tiny_shard.ids, tiny_shard.mask, V), 32, always=(0,))
    full = new_head(tiny_target, "eagle3", d2t, t2d, seed=3)
    save_head(full, tmp_path)
    with pytest.raises(UserFacingError, match="hot-tokens.json"):
        init_head(tiny_target, tmp_path, "eagle3", hot=8)
    ranking = draft_target_ids(full).flip(0).tolist()  # any order: the 8 last draft rows rank first
    write_ranking(tmp_path, ranking, "test", 0)
    head = init_head(tiny_target, tmp_path, "eagle3", hot=8)
    assert head.training and head.config.draft_vocab_size == 8
    assert sorted(draft_target_ids(head).tolist()) == sorted(ranking[:8])
    assert int(head.t2d.sum()) == 8
    loaded = load_head(tmp_path, tiny_target)
    torch.testing.assert_close(head.lm_head.weight, loaded.lm_head.weight[24:].float())
    assert init_head(tiny_target, tmp_path, "eagle3", hot=64).config.draft_vocab_size == 32  # nothing to cut


def test_heldout_answers_are_original_or_the_targets_own(tiny_target, tmp_path):
    from eagleviz.train.pipeline import DataConfig, heldout_features

    with pytest.raises(ValueError, match="held-out answers"):
        heldout_features(tiny_target, DataConfig(), [], [], tmp_path, answers="sampled")


def test_a_deeper_eagle3_head_grows_from_a_trained_one_and_round_trips(tiny_target, tiny_shard, tmp_path):
    """--add-layers: the grown head computes exactly what the one-layer head did (zero output projections),
    trains, saves with its extra layers and loads back with the engine's loader, deeper."""
    from eagleviz.decoding.engine import Engine
    from eagleviz.train.pipeline import grow, init_head, resumed_head

    d2t, t2d = draft_vocab(token_counts(tiny_shard.ids, tiny_shard.mask, V), 32, always=(0,))
    one = new_head(tiny_target, "eagle3", d2t, t2d, seed=3)
    save_head(one, tmp_path / "one")
    deep = init_head(tiny_target, tmp_path / "one", "eagle3", add_layers=2)
    assert deep.config.num_layers == 3 and len(deep.blocks) == 3
    row = make_row(tiny_shard, [0, 1])
    parts = _parts(tiny_target)
    base = init_head(tiny_target, tmp_path / "one", "eagle3")
    a, b = ttt_loss(base, row, parts, steps=3), ttt_loss(deep, row, parts, steps=3)
    torch.testing.assert_close(a.loss, b.loss)
    assert a.correct == b.correct
    cfg = TrainConfig(arch="eagle3", objective="ttt", row_len=128, max_steps=3, warmup=1, eval_every=3, eval_rows=1,
                      autocast=False)
    trainer = Trainer(cfg, deep, parts, tiny_shard, tiny_shard, tmp_path / "run")
    trainer.run()
    assert float(deep.blocks[2].mlp.down_proj.weight.abs().sum()) > 0  # the new layers learn
    back = load_head(tmp_path / "run" / "head", tiny_target)
    assert back.config.num_layers == 3 and resumed_head(tmp_path / "run" / "ckpt.pt", "eagle3").config.num_layers == 3
    assert back.new_cache(8, torch.float32, "cpu").k.shape[0] == 3  # a KV layer per decoder layer
    from eagleviz.config import SamplingConfig, TreeConfig

    from tiny import TinyTokenizer

    target = TargetModel(tiny_target.hf, TinyTokenizer(), "tiny")
    engine, tree, sampling = Engine(target, back, "deep"), TreeConfig.create(3, 2, 6), SamplingConfig(max_new_tokens=10)
    ids = [1, 2, 3, 4]
    spec, plain = engine.new_run("x", ids, tree, sampling), engine.new_run("x", ids, None, sampling)
    list(engine.speculate(ids, tree, sampling, spec))  # drafts through all three layers
    list(engine.plain(ids, sampling, plain))
    assert spec.token_ids == plain.token_ids and len(spec.cycles) > 0
    with pytest.raises(ValueError, match="add_layers"):
        grow(one, -1, tiny_target)


def test_eval_head_quick_is_the_fast_proxy_and_explicit_flags_win(monkeypatch, capsys):
    from eagleviz.train import cli as train_cli
    from eagleviz.train import evaluate

    seen = []
    monkeypatch.setattr(evaluate, "evaluate_head", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr(evaluate, "format_report", lambda report: "")
    train_cli.eval_head_main(["--quick", "--head", "h"])
    quick = seen[-1]
    assert (quick.limit, quick.chain, quick.heldout_answers, quick.draft_vocab) == (10, False, "self", 4096)
    train_cli.eval_head_main(["--quick", "--head", "h", "--limit", "3", "--draft-vocab", "0",
                              "--heldout-answers", "original"])
    assert (seen[-1].limit, seen[-1].draft_vocab, seen[-1].heldout_answers) == (3, 0, "original")
    train_cli.eval_head_main(["--head", "h"])
    last = seen[-1]
    assert (last.limit, last.chain, last.heldout_answers, last.draft_vocab) == (None, True, "original", 0)
