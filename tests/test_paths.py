"""eagleviz/paths.py: one ASSETS root from which every shipped file's path derives, and the cache directory."""

from __future__ import annotations

import re
from pathlib import Path

from eagleviz import paths

PACKAGE = Path(paths.__file__).resolve().parent


def test_assets_hold_what_the_package_reads():
    assert (paths.SHIPPED_HEAD / "config.json").is_file()
    assert (paths.SHIPPED_BENCH / "tuned.json").is_file()
    assert (paths.GALLERY / "index.json").is_file()
    assert all(p.parent == paths.ASSETS for p in (paths.SHIPPED_HEAD, paths.SHIPPED_BENCH, paths.GALLERY))


def test_cache_dir_follows_eagleviz_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLEVIZ_CACHE", str(tmp_path))
    assert paths.cache_dir() == tmp_path
    monkeypatch.delenv("EAGLEVIZ_CACHE")
    assert paths.cache_dir() == Path.home() / ".cache" / "eagleviz"


def test_no_module_finds_a_file_by_counting_folders_up_from_itself():
    """`Path(__file__).parents[N]` breaks silently when a file moves one folder deeper: paths.py is the only
    module that locates the assets."""
    offenders = [str(f.relative_to(PACKAGE)) for f in PACKAGE.rglob("*.py")
                 if re.search(r"__file__\)?(\.resolve\(\))?\.parents\[", f.read_text())]
    assert offenders == []
