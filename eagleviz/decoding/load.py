"""The one place an Engine is built: target + draft head (`load_engine`), the head a model gets by default,
heads named by Hub id, the hot draft vocabulary, and the model/tree argument groups that `generate`, `bench`,
`tune` and `gpu-check` share."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from eagleviz.config import SOURCES, TreeConfig
from eagleviz.decoding import calibration
from eagleviz.decoding.costs import Prices, load_or_measure
from eagleviz.decoding.engine import Engine, runnable_impl
from eagleviz.decoding.steps import DECODE_PATHS, decode_path
from eagleviz.errors import UserFacingError
from eagleviz.models.draft import load_head, random_head
from eagleviz.models.hot_vocab import DEFAULT_HOT_SIZE, HOT_TOKENS_FILE, read_ranking, restrict
from eagleviz.models.loading import DTYPES, EMBEDDED, EMBEDDED_HUB_ID, KV_DTYPES, WEIGHTS, check_device, load_target
from eagleviz.models.static import MIN_CAPACITY
from eagleviz.models.synthetic import RANDOM_MODEL
from eagleviz.paths import SHIPPED_HEAD, Bundle
from kernels.tree_attention import IMPLS

RANDOM_HEAD = "random"
DEVICE_CYCLE_ENV = "EAGLEVIZ_DEVICE_CYCLE"  # "1": a GPU's drafted cycles chosen, verified and walked on the device


def device_cycle_wanted() -> bool:
    """Whether a loaded engine decides its drafted cycles on the device (`Engine`'s device_cycle; it applies over
    static steps only: a GPU), asked for with EAGLEVIZ_DEVICE_CYCLE=1. Off by default: on an H200 (the code of
    d074d59, docs/performance.md entry 61) the device's choice of a cost-aware tree's nodes was not a tree on the
    first drafted cycle, and runs that keep a lookup index read records that held no cycle, where the same code on
    a CPU is lossless; the host's choice and walk over the same captured steps is the default until a GPU passes
    `gpu-check`'s device_cycle section."""
    return os.environ.get(DEVICE_CYCLE_ENV, "") == "1"


def default_head(model: str) -> str:
    """The shipped head for the embedded model when present, a bundle's own head; otherwise a random head
    (still lossless)."""
    bundle = Bundle.at(model) if model not in (EMBEDDED, RANDOM_MODEL) else None
    if bundle is not None and (bundle.head / "config.json").exists():
        return str(bundle.head)
    if model in (EMBEDDED, EMBEDDED_HUB_ID) and (SHIPPED_HEAD / "config.json").exists():
        return str(SHIPPED_HEAD)
    return RANDOM_HEAD


def local_head(head: str | None) -> str | None:
    """A head given as a Hub id ("owner/name", not a local directory) is downloaded once into the Hub's cache
    (needs a network; a gated head needs a token); a directory, "random" or None is returned as is."""
    if head is None or head == RANDOM_HEAD or os.path.isdir(head) or head.count("/") != 1:
        return head
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(head, allow_patterns=["*.json", "*.safetensors", "*.bin"])
    except Exception as exc:  # network, gated repository, unknown id: one line for the user
        first = (str(exc).splitlines() or [""])[0][:200]
        raise UserFacingError(f"draft head {head!r} is not a directory here, and as a Hub id it could not be "
                              f"downloaded: {exc.__class__.__name__}: {first}") from exc


def load_engine(model: str = EMBEDDED, head: str | None = None, dtype: str = "auto", device: str = "cpu",
                attn_impl: str = "auto", draft_vocab: int | None = None, kv_dtype: str = "auto", progress=None,
                weights: str = "auto", decode: str = "auto"):
    """Target + draft head -> Engine. head: a directory, a Hub id (`local_head`), "random" (a random head) or
    None (`default_head(model)`).

    draft_vocab: draft among the N most frequent tokens (`eagleviz.models.hot_vocab`, needs the head's
    hot-tokens.json); None uses DEFAULT_HOT_SIZE when the head ships a ranking, 0 the whole draft vocabulary.
    The engine's cost-aware trees value nodes with the head's calibration (calibration.json, or the table
    fitted for a target computing from blocks: `calibration.file_for`; EAGLE-2's assumption without one) and
    price them with this machine's costs, measured once and kept (`eagleviz.decoding.costs`), read or measured
    when a cost-aware tree first needs them (`Prices`: plain decoding and fixed trees measure nothing; `progress`
    hears when they are measured). weights: how the target's linears compute
    (`eagleviz.models.loading.choose_weights`). decode: how the target's steps run (`Engine`'s decode:
    CUDA graphs on a GPU by default)."""
    try:  # before minutes of loading
        runnable_impl(attn_impl, check_device(device))
        decode_path(decode, check_device(device))
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    head = local_head(head)  # before minutes of loading the target
    target = load_target(model, dtype, device, kv_dtype, weights)
    head = head or default_head(model)
    arch = "eagle3" if model == RANDOM_MODEL else "eagle1"  # --model random proves the EAGLE-3 path
    draft = random_head(target, arch) if head == RANDOM_HEAD else load_head(head, target)
    name = "random (untrained)" if head == RANDOM_HEAD else Path(head).name
    head_dir = None if head == RANDOM_HEAD else Path(head)
    draft, name = _hot_vocabulary(draft, name, head_dir, draft_vocab)
    try:
        engine = Engine(target, draft, name, attn_impl, calibration=calibration.read(head_dir, target.weights),
                        decode=decode, device_cycle=device_cycle_wanted())
    except ValueError as exc:  # e.g. the Triton kernel asked for on a CPU, a damaged calibration.json
        raise UserFacingError(str(exc)) from exc
    unpriced = engine
    engine = engine.with_policy(costs=Prices(lambda: load_or_measure(unpriced, progress)))
    if engine.decode == "graphs":  # captured now, not inside the first runs
        if progress is not None:
            progress("capturing the CUDA graphs of plain decoding and of the default tree")
        for tree in (None, TreeConfig.create()):
            engine.prepare(MIN_CAPACITY, tree)
    return engine


def _hot_vocabulary(draft, name: str, head_dir: Path | None, size: int | None):
    """The head restricted to its hot draft vocabulary as asked (see `load_engine`), and its display name."""
    if size == 0:
        return draft, name
    if size is not None and size < 0:
        raise UserFacingError(f"--draft-vocab must be 0 (whole draft vocabulary) or positive, got {size}")
    try:
        ranking = read_ranking(head_dir) if head_dir is not None else None
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    usable = ranking is not None and draft.config.arch == "eagle3"
    if size is None:
        if not usable:
            return draft, name
        size = DEFAULT_HOT_SIZE
    elif not usable:
        why = ("it is an EAGLE-1 head (it drafts with the target's LM head)" if draft.config.arch != "eagle3" else
               f"it has no {HOT_TOKENS_FILE}; make one with `python -m eagleviz hot-tokens --head {head_dir}`")
        raise UserFacingError(f"--draft-vocab {size}: the head cannot draft from a hot vocabulary: {why}")
    small = restrict(draft, ranking, size)
    if small is draft:
        return draft, name
    return small, f"{name} ({small.config.draft_vocab_size:,} of {draft.config.draft_vocab_size:,} draft tokens)"


DEFAULT_TREE = TreeConfig()


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=EMBEDDED, help="'embedded' (offline SmolLM2-135M-Instruct), 'random' (random "
                   "weights of its shape), a directory (a bundle from export-bundle among them) or a Hub id")
    p.add_argument("--head", default=None,
                   help="draft head: a directory or a Hub id, downloaded once (default: the shipped head, or 'random')")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--attn-impl", default="auto", choices=IMPLS,
                   help="tree attention: auto (Triton on CUDA, PyTorch elsewhere), torch, or triton (CUDA, or "
                        "TRITON_INTERPRET=1)")
    p.add_argument("--kv-dtype", default="auto", choices=KV_DTYPES,
                   help="dtype of the KV caches and attention: auto measures whether fp32 is faster than the model's "
                        "dtype on this CPU, model keeps the model's, float32 forces fp32")
    p.add_argument("--weights", default="auto", choices=WEIGHTS,
                   help="how the target's linears compute: blocks = straight from the model file's Q4_1/Q8_0 blocks "
                        "(CPU, int8 activations, a token's logits the same in any batch: EAGLE equals plain decoding "
                        "bit for bit), dense = widened weights in --dtype; auto = blocks on a CPU with a C compiler "
                        "when the model is stored in blocks (the embedded model) and --dtype is auto, else dense")
    p.add_argument("--decode", default="auto", choices=DECODE_PATHS,
                   help="how the target's steps run: graphs = CUDA graphs captured over a static cache (GPU), static "
                        "= the same steps uncaptured, eager = the forward over each run's own cache; auto = graphs on "
                        "a GPU, eager on a CPU and on a ZeroGPU Space")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="draft among the N most frequent tokens (the head's hot-tokens.json); 0: the whole draft "
                        f"vocabulary (default: {DEFAULT_HOT_SIZE} when the head ships a ranking)")


def add_tree_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=DEFAULT_TREE.steps, help="speculative_num_steps: drafting depth")
    p.add_argument("--topk", type=int, default=DEFAULT_TREE.topk, help="speculative_eagle_topk: branching")
    p.add_argument("--draft-tokens", type=int, default=DEFAULT_TREE.draft_tokens,
                   help="speculative_num_draft_tokens: verification budget, root included")
    p.add_argument("--fixed-tree", dest="adaptive", action="store_false",
                   help="SGLang's fixed tree: exactly --steps levels and --draft-tokens verified (default: a "
                        "cost-aware tree, for which the three knobs are upper bounds)")
    p.add_argument("--draft-source", default=DEFAULT_TREE.source, choices=SOURCES,
                   help="candidates from the EAGLE head, from prompt lookup (the context's recurring text, no "
                        "model work), or both merged")


def tree_from_args(args) -> TreeConfig:
    """The TreeConfig that `add_tree_args`' options describe (a ValueError when a knob is out of range)."""
    return TreeConfig.create(args.steps, args.topk, args.draft_tokens, adaptive=args.adaptive,
                             source=args.draft_source)
