"""Record the gallery (eagleviz/app/gallery.py): each preset of eagleviz/app/presets.py run as the page runs it (the
shipped head, the CPU's dtype, the preset's own tree, the presets' 48 new tokens), and the counting preset
with this CPU's fastest tree (`tune`: on a CPU a small one, often a chain); one trace file per entry and an
index.json.

    python scripts/record_gallery.py                   # into assets/gallery/
    python scripts/record_gallery.py --out DIR

Re-run it when the head, a preset or the trace schema changes. Traces are written as compact JSON (no
spaces): what `RunTrace.to_json` writes, less its separators' spaces; each must stay under MAX_BYTES.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from dataclasses import replace
from pathlib import Path

from eagleviz.app import gallery, presets
from eagleviz.decoding.load import RANDOM_HEAD, default_head, load_engine
from eagleviz.models.loading import cpu_description
from eagleviz.app.session import EngineHub, Knobs, fastest_tree, generate, read_trace
from eagleviz.trace import RunTrace

MAX_BYTES = 500_000   # a sampled run with a 12-token tree records each check's residual: ~450 kB


def slug(name: str) -> str:
    """A preset's name as an entry id: "Counting (high acceptance)" -> "counting"."""
    return re.sub(r"[^a-z0-9]+", "-", re.split(r"[(,]", name)[0].lower()).strip("-")


def planned(base: Knobs) -> list[tuple[str, str, presets.Preset, Knobs]]:
    """(id, title, preset, knobs) per entry, in the gallery's order."""
    out = [(slug(p.name), p.name, p, presets.knobs(p, base)) for p in presets.PRESETS]
    fastest = fastest_tree()
    if fastest is not None:
        high = next(p for p in presets.PRESETS if p.shows == "high")
        t = fastest.tree
        out.insert(1, (slug(high.name) + "-fastest-tree", f"{high.name}, this CPU's fastest tree {fastest.label}",
                       high, replace(presets.knobs(high, base), steps=t.steps, topk=t.topk,
                                     draft_tokens=t.draft_tokens)))
    return out


def write(run: RunTrace, path: Path) -> int:
    """The trace as compact JSON; returns its size in bytes after checking that it reads back as a trace."""
    path.write_text(json.dumps(run.to_dict(), ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    read_trace(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{path.name} has {size} bytes, above {MAX_BYTES}: record fewer tokens")
    return size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=gallery.GALLERY_DIR)
    args = p.parse_args()
    if default_head("embedded") == RANDOM_HEAD:
        raise SystemExit("no shipped head: the gallery shows the trained head")
    args.out.mkdir(parents=True, exist_ok=True)
    hub = EngineHub(load_engine())
    page = Knobs(max_new_tokens=presets.PRESET_TOKENS)
    cpu, today = cpu_description(), datetime.date.today().isoformat()
    rows = []
    for entry_id, title, preset, knobs in planned(page):
        run = generate(hub, preset.prompt, knobs)
        size = write(run, args.out / f"{entry_id}.json")
        row = gallery.GalleryEntry(id=entry_id, title=title, description=gallery.describe(run),
                                   file=f"{entry_id}.json", prompt=preset.prompt, knobs=knobs, preset=preset.name,
                                   head=run.head, recorded=today, cpu=cpu)
        rows.append(row.to_dict())
        print(f"{entry_id}: {row.description} ({size / 1000:.0f} kB)", flush=True)
    index = {"version": gallery.INDEX_VERSION, "entries": rows}
    (args.out / gallery.INDEX_FILE).write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    gallery.entries(args.out)


if __name__ == "__main__":
    main()
