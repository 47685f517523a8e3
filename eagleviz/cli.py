"""Command line: `python -m eagleviz generate | train-head | eval-head | hot-tokens | calibrate | bench | tune |
gpu-check | export-bundle`.

Errors the user can act on (bad knobs, empty prompt, missing model package, a head that does not fit)
print one line to stderr and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from eagleviz.config import SamplingConfig
from eagleviz.decoding.load import add_model_args, add_tree_args, tree_from_args
from eagleviz.errors import UserFacingError

def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="decode one prompt with EAGLE (or plain decoding with --baseline)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--no-chat", dest="chat", action="store_false", help="do not apply the chat template")
    add_tree_args(p)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    add_model_args(p)
    p.add_argument("--baseline", action="store_true", help="plain target-only decoding, same model and sampling")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", type=Path, default=None, help="write the full run trace as JSON to this file")


def run_generate(args) -> int:
    from eagleviz.decoding.load import load_engine
    from eagleviz.perf.provenance import provenance

    if not args.prompt.strip():
        raise UserFacingError("the prompt is empty")
    try:
        tree = None if args.baseline else tree_from_args(args)
        sampling = SamplingConfig(args.temperature, args.top_p, args.max_new_tokens, args.seed)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    for note in (tree.adjustments if tree else ()):
        print(f"note: {note}", file=sys.stderr)
    engine = load_engine(args.model, args.head, args.dtype, args.device, args.attn_impl, args.draft_vocab,
                         args.kv_dtype, weights=args.weights, decode=args.decode)
    run = engine.generate(args.prompt, tree, sampling, chat=args.chat)
    if run.decode != engine.decode:  # a capture failed: the run took another path than the one asked
        print(f"warning: the steps ran {run.decode}, not {engine.decode}: {' '.join(run.notes[len(engine.notes):])}",
              file=sys.stderr)
    summary = run.summary()
    text = engine.target.tokenizer.decode(run.token_ids, skip_special_tokens=True)
    if args.trace:
        args.trace.write_text(run.to_json())
    if args.json:
        print(json.dumps({"text": text, "token_ids": run.token_ids, "num_cycles": summary["num_cycles"],
                          "accept_lengths": summary["accept_lengths"], "tau": summary["tau"],
                          "acceptance_by_depth": summary["acceptance_by_depth"],
                          "tokens_per_s": summary["tokens_per_s"], "wall_s": summary["wall_s"],
                          "stop_reason": run.stop_reason, "config": run.config, "dtype": run.dtype,
                          "kv_dtype": run.kv_dtype, "cpu_layer": run.cpu_layer, "weights": run.weights,
                          "attn_impl": run.attn_impl, "head": run.head, "decode": run.decode,
                          "notes": run.notes, "machine": run.machine,
                          "provenance": provenance(engine.target.device)}, ensure_ascii=False))
    else:
        print(text)
        mode = "plain" if tree is None else f"EAGLE steps={tree.steps} topk={tree.topk} draft_tokens={tree.draft_tokens}"
        print(f"[{mode}] {summary['new_tokens']} tokens in {summary['wall_s']:.2f} s = "
              f"{summary['tokens_per_s']:.1f} tokens/s; tau {summary['tau']:.2f} over {summary['num_cycles']} cycles; "
              f"{run.dtype}, head: {run.head or '-'}", file=sys.stderr)
    return 0


def _delegating_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)


def _delegate(name: str, rest: list[str]) -> int:
    """Subcommands with their own argument parsers live next to the code they drive."""
    if name == "calibrate":
        from eagleviz.train import calibrate

        entry = calibrate.main
    elif name in ("train-head", "eval-head", "hot-tokens"):
        from eagleviz.train import cli as train_cli

        entry = {"train-head": train_cli.train_head_main, "eval-head": train_cli.eval_head_main,
                 "hot-tokens": train_cli.hot_tokens_main}[name]
    elif name == "gpu-check":
        from eagleviz.perf import gpu_check

        entry = gpu_check.main
    elif name == "export-bundle":
        from eagleviz.perf import bundle

        entry = bundle.main
    elif name == "bench":
        from eagleviz.perf import bench

        entry = bench.bench_main
    elif name == "ceiling":
        from eagleviz.perf import ceiling

        entry = ceiling.ceiling_main
    elif name == "fingerprint":
        from eagleviz.perf import fingerprint

        entry = fingerprint.main
    elif name == "lossless":
        from eagleviz.perf import lossless

        entry = lossless.main
    elif name == "int8-accuracy":
        from eagleviz.perf import int8_accuracy

        entry = int8_accuracy.main
    elif name == "diagnose-head":
        from eagleviz.perf import diagnose

        entry = diagnose.main
    else:
        from eagleviz.perf import tune

        entry = tune.tune_main
    return entry(rest) or 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m eagleviz", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _delegating_parser(sub, "train-head", "train an EAGLE draft head for a target model")
    _delegating_parser(sub, "eval-head", "measure a draft head: tau, n-alpha, top-1 accuracy")
    _delegating_parser(sub, "diagnose-head", "where a head's guesses miss: by MT-bench category, turn and position")
    _delegating_parser(sub, "hot-tokens", "rank a head's draft vocabulary by frequency (its hot-tokens.json)")
    _delegating_parser(sub, "calibrate", "fit how often the target accepts what the head believes (calibration.json)")
    _delegating_parser(sub, "bench", "speed against plain decoding and peers, side by side")
    _delegating_parser(sub, "ceiling", "what a perfect drafter would reach here, and the acceptance a head would need")
    _delegating_parser(sub, "tune", "sweep the tree knobs and report the fastest configuration")
    _delegating_parser(sub, "gpu-check", "on a CUDA GPU: the kernel, losslessness and speed, in one JSON report")
    _delegating_parser(sub, "export-bundle", "write the model, head and prompts an offline machine needs to one folder")
    _delegating_parser(sub, "fingerprint", "one hash of the greedy tokens the default path writes (the same on every CPU)")
    _delegating_parser(sub, "lossless", "greedy EAGLE equals plain decoding bit for bit on MT-bench, every tree (JSON)")
    _delegating_parser(sub, "int8-accuracy", "how far the weight blocks move the logits from fp32 on MT-bench (JSON)")
    return parser


DELEGATED = ("train-head", "eval-head", "hot-tokens", "calibrate", "bench", "ceiling", "tune", "gpu-check", "export-bundle",
             "fingerprint", "lossless", "int8-accuracy", "diagnose-head")


def _one_line(message, category, filename, lineno, line=None) -> str:
    """A warning as the command line shows it: one line, no source location (they are notes for the user)."""
    text = str(message)
    if text.startswith("eagleviz: "):
        return f"note: {text.removeprefix('eagleviz: ')}\n"
    return _plain_warning(message, category, filename, lineno, line)


_plain_warning = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    warnings.formatwarning = _one_line
    try:
        if argv and argv[0] in DELEGATED:  # their own parsers see every option, including the leading ones
            return _delegate(argv[0], argv[1:])
        args = build_parser().parse_args(argv)
        return run_generate(args)
    except UserFacingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
