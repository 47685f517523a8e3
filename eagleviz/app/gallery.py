"""The gallery: recorded runs shipped in assets/gallery/ that replay instantly, with no model work, so that a
room full of people on one CPU can step through a cycle while the queue for live runs is long.

    assets/gallery/index.json    {"version": 1, "entries": [GalleryEntry as a dict, ...]}
    assets/gallery/<id>.json     one RunTrace each, read through `eagleviz.app.session.read_trace` (validated)

`scripts/record_gallery.py` records them with the shipped head (each preset of `eagleviz.app.presets` as the page
runs it, and the counting preset with the textbook tree); re-run it whenever the head or the trace schema
changes. Each entry says which head, CPU and date produced it: the timings in a trace are that machine's.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from eagleviz.errors import UserFacingError
from eagleviz.paths import GALLERY
from eagleviz.app.session import Knobs, read_trace
from eagleviz.trace import RunTrace

GALLERY_DIR = GALLERY
INDEX_FILE = "index.json"
INDEX_VERSION = 1
OLDER_KNOBS = {"adaptive": False, "source": "eagle"}   # what an index from before these knobs recorded
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


class GalleryError(UserFacingError):
    """The gallery is missing or damaged, or an entry is not in it: one line for the page."""


@dataclass(frozen=True)
class GalleryEntry:
    id: str              # lowercase letters, digits and dashes: safe in a link (`?gallery=<id>`)
    title: str
    description: str     # one line with the run's measured tau (`describe`)
    file: str            # the trace's file name inside the gallery folder
    prompt: str
    knobs: Knobs         # the knobs the run was made with (set them to re-run it live)
    preset: str | None   # the `eagleviz.app.presets` name it was recorded from, if any
    head: str            # the draft head's name
    recorded: str        # ISO date
    cpu: str             # `eagleviz.models.loading.cpu_description()` of the recording machine

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, row) -> GalleryEntry:
        """An index row, checked field by field (the index is a file anyone can edit)."""
        names = [f.name for f in fields(cls)]
        if not isinstance(row, dict) or sorted(row) != sorted(names):
            raise ValueError(f"an entry must have exactly the fields {names}")
        kinds = {"knobs": dict, "preset": (str, type(None))}
        for name in names:
            if not isinstance(row[name], kinds.get(name, str)):
                raise ValueError(f"entry field {name!r} has the wrong type")
        if not _ID.fullmatch(row["id"]):
            raise ValueError(f"entry id {row['id']!r} is not lowercase letters, digits and dashes")
        if Path(row["file"]).name != row["file"] or not row["file"].endswith(".json"):
            raise ValueError(f"entry {row['id']}: file {row['file']!r} must be a .json name inside the gallery")
        defaults = Knobs()
        if not OLDER_KNOBS.keys() & row["knobs"].keys():  # recorded before cost-aware trees: a fixed EAGLE tree
            row = row | {"knobs": row["knobs"] | OLDER_KNOBS}
        if set(row["knobs"]) != {f.name for f in fields(Knobs)}:
            raise ValueError(f"entry {row['id']}: knobs must have exactly the fields {sorted(vars(defaults))}")
        for name, value in row["knobs"].items():
            kind = (int, float) if isinstance(getattr(defaults, name), float) else type(getattr(defaults, name))
            if (kind is bool) != isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"entry {row['id']}: knob {name} has the wrong type")
        knobs = Knobs(**row["knobs"])
        knobs.configs()
        return cls(**(row | {"knobs": knobs}))


def describe(run: RunTrace) -> str:
    """The one-line description of a recorded run: what it measured, from its trace."""
    s, sampling, tree = run.summary(), run.config["sampling"], run.config.get("tree")
    shape = f"tree {tree['steps']} / {tree['topk']} / {tree['draft_tokens']}" if tree else "plain decoding"
    return (f"tau {s['tau']:.2f}: {s['new_tokens']} new tokens in {s['num_cycles']} cycles, {shape}, "
            f"T = {sampling['temperature']:g}, {run.numerics}")


def entries(folder: str | Path = GALLERY_DIR) -> tuple[GalleryEntry, ...]:
    """The gallery's entries in index order. Raises GalleryError when the index is missing or damaged."""
    path = Path(folder) / INDEX_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise GalleryError(f"no gallery here: {path} is missing (scripts/record_gallery.py records it)") from exc
    except json.JSONDecodeError as exc:   # said in words: a visitor may read it, the parser's text is for coders
        raise GalleryError(f"the recorded runs' index {path.name} cannot be read: it is not valid JSON (line "
                           f"{exc.lineno}); scripts/record_gallery.py writes it again") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise GalleryError(f"the recorded runs' index {path.name} cannot be read on this server") from exc
    if not isinstance(data, dict) or data.get("version") != INDEX_VERSION or not isinstance(data.get("entries"), list):
        raise GalleryError(f"the gallery index {path} is not a version-{INDEX_VERSION} index")
    try:
        found = tuple(GalleryEntry.from_dict(row) for row in data["entries"])
    except (ValueError, TypeError, UserFacingError) as exc:
        raise GalleryError(f"the gallery index {path} is damaged: {str(exc)[:200]}") from exc
    ids = [e.id for e in found]
    if len(set(ids)) != len(ids):
        raise GalleryError(f"the gallery index {path} names an entry twice")
    return found


def entry(entry_id: str, folder: str | Path = GALLERY_DIR) -> GalleryEntry:
    """The entry with this id; an unknown id is refused with the known ones named."""
    known = entries(folder)
    for e in known:
        if e.id == entry_id:
            return e
    name = f" {entry_id!r}" if isinstance(entry_id, str) and _ID.fullmatch(entry_id) else " of that name"
    raise GalleryError(f"no gallery entry{name}; the gallery has {', '.join(e.id for e in known)}")


def load(entry_id: str, folder: str | Path = GALLERY_DIR) -> RunTrace:
    """The entry's recorded run, validated like an uploaded trace; no model is loaded. Each call reads the
    file and returns a new RunTrace (traces are mutable dataclasses; nothing is shared between callers)."""
    e = entry(entry_id, folder)
    path = Path(folder) / e.file
    try:
        return read_trace(path)
    except UserFacingError as exc:
        raise GalleryError(f"gallery entry {e.id!r} ({path.name}): {exc}") from exc
