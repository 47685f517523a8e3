"""Where eagleviz keeps files: the one ASSETS root that every shipped file's path derives from, and the
cache directory for what it computes on this machine. Stdlib only.

    ASSETS          the shipped head, recorded runs and measured results. In a checkout (or an editable
                    install) it is the repository's `assets/`; an installed wheel carries the same folder as
                    package data, `eagleviz/assets/` (pyproject.toml maps one onto the other)
    cache_dir()     EAGLEVIZ_CACHE, default ~/.cache/eagleviz: the dequantized embedded model, the compiled
                    CPU layer, `tune` and `bench` results
    Bundle          the layout of a portable bundle (`python -m eagleviz export-bundle`): what an offline machine
                    needs for the embedded model, in one folder
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _assets_root() -> Path:
    """The wheel's package data when present, else the checkout's `assets/` beside the package."""
    packaged = _PACKAGE / "assets"
    return packaged if packaged.is_dir() else _PACKAGE.parent / "assets"


ASSETS = _assets_root()
SHIPPED_HEAD = ASSETS / "eagle-smollm2-135m"
SHIPPED_BENCH = ASSETS / "bench"
GALLERY = ASSETS / "gallery"


def cache_dir() -> Path:
    """EAGLEVIZ_CACHE, default ~/.cache/eagleviz: where eagleviz keeps what it computes for this machine (the
    dequantized embedded model, the compiled CPU layer, `tune` and `bench` results)."""
    return Path(os.environ.get("EAGLEVIZ_CACHE", Path.home() / ".cache" / "eagleviz"))


@dataclass(frozen=True)
class Bundle:
    """A portable bundle's folders (docs/gpu-check.md): `--model BUNDLE` loads its target with its head, and
    the commands read its prompt sets where the packages that ship them are not installed.

        bundle.json             what is inside and how it was made
        target/                 the target: config, tokenizer, exactly packed weights (eagleviz.models.packed)
        head/                   the shipped draft head with its hot tokens
        prompts/mtbench.jsonl   MT-bench's 80 questions
        prompts/sharegpt.json   ShareGPT's first human turns (the training prompts), in ShareGPT's format
    """

    root: Path
    INDEX = "bundle.json"

    @classmethod
    def at(cls, path: str | os.PathLike) -> Bundle | None:
        """The bundle whose root is `path`, or None when `path` is not one."""
        root = Path(path)
        return cls(root) if (root / cls.INDEX).is_file() else None

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def head(self) -> Path:
        return self.root / "head"

    @property
    def mtbench(self) -> Path:
        return self.root / "prompts" / "mtbench.jsonl"

    @property
    def sharegpt(self) -> Path:
        return self.root / "prompts" / "sharegpt.json"
