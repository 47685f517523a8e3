"""Where eagleviz keeps files: the one ASSETS root that every shipped file's path derives from, and the
cache directory for what it computes on this machine. Stdlib only.

    ASSETS          the shipped head, recorded runs and measured results. In a checkout (or an editable
                    install) it is the repository's `assets/`; an installed wheel carries the same folder as
                    package data, `eagleviz/assets/` (pyproject.toml maps one onto the other)
    cache_dir()     EAGLEVIZ_CACHE, default ~/.cache/eagleviz: the dequantized embedded model, the compiled
                    CPU layer, `tune` and `bench` results
"""

from __future__ import annotations

import os
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
