"""Shareable links: a run's prompt and knobs in a URL query string, read back as untrusted input.

    to_query(prompt, knobs, preset)          "?prompt=...&steps=4&topk=1&...": every knob written out, so a link
                                             reproduces the run even after the page's defaults change
    from_query(params, defaults, limits)     a `Shared`: the prompt, the knobs, the preset and gallery entry to
                                             open, the picture of that recorded run to show (cycle, phase,
                                             picked token), and one note per parameter that could not be used
    picture_query(entry, cycle, phase, token) "?gallery=story&cycle=3&phase=verify&token=2": a recorded run at one
                                             picture, for a room to open with no model work

A link is typed by anyone, so it is validated like any other input: each parameter on its own (a number
where a number belongs, finite, in the knob's range and within the server's limits, a known attention
implementation, draft source, preset or gallery entry, a 0/1 switch, given once), then the knobs together (`Knobs.configs`).
A value the engine takes but the page's slider does not reach (topk 16, T = 2) is held to the slider's end, with a
note: the page shows what will run.
The picture's parameters are checked here for their form (whole numbers, a phase's name) and against the
recorded run where it is opened (`eagleviz.app.navigation.picture`): a cycle, phase or token the run lacks. A bad
parameter falls back to its default and adds a one-line note; the rest of the link still applies. Reading
a link never raises, and a note never repeats arbitrary text from the link (it is shown on the page).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from urllib.parse import parse_qsl, quote, urlencode

from eagleviz.app import presets
from eagleviz.config import LIMITS, SOURCES
from eagleviz.errors import UserFacingError
from eagleviz.app.limits import Limits
from eagleviz.app.session import Knobs
from eagleviz.app.typed import RANGES
from eagleviz.visuals.phases import PHASES
from kernels.tree_attention import IMPLS

MAX_PARAMS = 32                  # a longer query is cut: no page needs more, and each one costs a note
MAX_NUMBER_CHARS = 24            # longer digit strings are refused before int() (no 4,300-digit parses)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_SHOWABLE = re.compile(r"[\w.+\-]{1,24}")
_GRADIO_PREFIX = "__"            # Gradio's own parameters (e.g. __theme): the page reads them, not this module
_INT_FIELDS = ("steps", "topk", "draft_tokens", "max_new_tokens", "seed")
_FLOAT_FIELDS = {"temperature": (0.0, 2.0, "[0, 2]"), "top_p": (0.0, 1.0, "(0, 1]")}  # range, as shown
PICTURE_PARAMS = ("cycle", "phase", "token")   # which picture of a recorded run (`gallery=`) to show
MAX_PICTURE_INDEX = 100_000      # above any run's cycles, frames or tree tokens: refused as a number


@dataclass(frozen=True)
class Shared:
    """What a link asks the page to show. `prompt` None: the link set none (or an unusable one), keep the
    page's. `preset`/`gallery`: a preset name of `eagleviz.app.presets` and a gallery entry id, validated."""

    prompt: str | None
    knobs: Knobs
    notes: tuple[str, ...] = ()
    preset: str | None = None
    gallery: str | None = None
    extra: tuple[tuple[str, str], ...] = ()   # parameters the caller reads itself (`passthrough`)
    picture: Picture | None = None            # with `gallery` only: the cycle, phase and token to show


@dataclass(frozen=True)
class Picture:
    """One picture of a recorded run: cycle `cycle` (None: the run's opening cycle), at `phase` (a name of
    `PHASES`, its last frame; or a frame number; None: the end state), with item `token` of the cycle's token
    list picked (None: none). Checked for form only; the run decides whether it has them."""

    cycle: int | None = None
    phase: str | int | None = None
    token: int | None = None


def to_query(prompt: str, knobs: Knobs, preset: str | None = None) -> str:
    """The link's query string, with the leading "?": the prompt (left out when blank: the link then keeps
    the page's), every knob, and the preset when given."""
    pairs = [("prompt", prompt)] if prompt.strip() else []
    for f in fields(Knobs):
        value = getattr(knobs, f.name)
        if f.name in _INT_FIELDS:
            value = str(int(value))
        elif f.name in _FLOAT_FIELDS:
            value = _float_text(float(value))
        elif f.name == "adaptive":
            value = "1" if value else "0"
        pairs.append((f.name, str(value)))
    if preset is not None:
        pairs.append(("preset", preset))
    return "?" + urlencode(pairs, quote_via=quote, safe="")


def picture_query(entry: str, cycle: int, phase: str | int | None = None, token: int | None = None) -> str:
    """The link's query string to recorded run `entry` at one picture (see `Picture`), with the leading "?"."""
    pairs = [("gallery", entry), ("cycle", str(int(cycle)))]
    if phase is not None:
        pairs.append(("phase", str(phase)))
    if token is not None:
        pairs.append(("token", str(int(token))))
    return "?" + urlencode(pairs, quote_via=quote, safe="")


def _float_text(x: float) -> str:
    """The shortest text that reads back as `x` ("0", "0.8", "1e-05")."""
    text = repr(x)
    return text[:-2] if text.endswith(".0") else text


def _pairs(params: Mapping[str, str] | Iterable[tuple[str, str]] | str) -> list[tuple[str, str]]:
    """(name, value) pairs in link order. A query string is parsed here; a multi-valued mapping (Starlette's
    `request.query_params`) is read through `multi_items()` so that repeated parameters are seen."""
    if isinstance(params, str):
        return parse_qsl(params.removeprefix("?"), keep_blank_values=True, max_num_fields=None)
    if hasattr(params, "multi_items"):
        return [(str(k), str(v)) for k, v in params.multi_items()]
    if isinstance(params, Mapping):
        return [(str(k), str(v)) for k, v in params.items()]
    return [(str(k), str(v)) for k, v in params]


def from_query(params: Mapping[str, str] | Iterable[tuple[str, str]] | str, defaults: Knobs, limits: Limits,
               *, gallery_ids: Collection[str] | None = None, passthrough: Collection[str] = ()) -> Shared:
    """Read a link (see the module docstring). `defaults`: the page's knobs, used for every knob the link
    leaves out or gets wrong. `gallery_ids`: the known gallery entries (default: `eagleviz.app.gallery`'s).
    `passthrough`: parameter names the caller handles itself (e.g. a layout), returned in `extra`."""
    pairs = _pairs(params)
    notes: list[str] = []
    if len(pairs) > MAX_PARAMS:
        notes.append(f"The link has {len(pairs)} parameters; only the first {MAX_PARAMS} were read.")
        pairs = pairs[:MAX_PARAMS]
    counts = Counter(name for name, _ in pairs)
    known = {"prompt", "preset", "gallery", *PICTURE_PARAMS, *(f.name for f in fields(Knobs))}
    given: dict[str, str] = {}
    extra, repeated = [], set()
    for name, value in pairs:
        if name in passthrough:
            extra.append((name, value))
        elif name.startswith(_GRADIO_PREFIX):
            continue
        elif name not in known:
            notes.append(f"Unknown link parameter {_show(name)} ignored.")
        elif counts[name] == 1:
            given[name] = value
        elif name not in repeated:
            repeated.add(name)
            notes.append(f"Link parameter {name} is given {counts[name]} times; its default is used.")

    preset = _choice("preset", given.get("preset"), presets.by_name(), notes)
    ids = _gallery_ids() if gallery_ids is None and "gallery" in given else gallery_ids or ()
    gallery = _choice("gallery", given.get("gallery"), ids, notes)
    prompt = _prompt(given.get("prompt"), limits, notes)
    base = defaults
    if preset is not None:
        chosen = presets.by_name()[preset]
        prompt = chosen.prompt if prompt is None else prompt
        base = presets.knobs(chosen, defaults)
    knobs = _knobs(given, base, limits, notes)
    picture = _picture(given, gallery, notes)
    return Shared(prompt=prompt, knobs=knobs, notes=tuple(notes), preset=preset, gallery=gallery,
                  extra=tuple(extra), picture=picture)


def _picture(given: dict[str, str], gallery: str | None, notes: list[str]) -> Picture | None:
    """The picture's parameters, each of the right form, for a recorded run only (a live run is not there
    until someone runs it)."""
    named = [name for name in PICTURE_PARAMS if name in given]
    if not named:
        return None
    if gallery is None:
        notes.append(f"Link parameter {' and '.join(named)}: a picture needs a recorded run to show "
                     "(gallery=...); ignored.")
        return None
    values: dict[str, int | str | None] = {}
    for name in named:
        text = given[name].strip().lower()
        if name == "phase" and text in PHASES:
            values[name] = text
        elif _INTEGER.fullmatch(text) and len(text) <= 6 and 0 <= int(text) <= MAX_PICTURE_INDEX:
            values[name] = int(text)
        else:
            why = f"must be one of {', '.join(PHASES)} or a frame number" if name == "phase" else \
                "must be a whole number from 0"
            notes.append(f"Link parameter {name}={_show(given[name])} {why}; ignored.")
    return Picture(**values)


def _show(value: str) -> str:
    """A parameter's value as a note may quote it: short plain words and numbers only, never markup."""
    if _SHOWABLE.fullmatch(value):
        return f"'{value}'"
    return "(empty)" if not value else f"(a {len(value)}-character value)"


def _choice(name: str, value: str | None, known: Collection[str], notes: list[str]) -> str | None:
    if value is None:
        return None
    if value in known:
        return value
    plural = {"preset": "presets", "gallery": "gallery entries"}[name]
    notes.append(f"Link parameter {name}={_show(value)} is not one of this page's {plural}; ignored.")
    return None


def _gallery_ids() -> tuple[str, ...]:
    from eagleviz.app import gallery

    try:
        return tuple(e.id for e in gallery.entries())
    except UserFacingError:
        return ()


def _prompt(value: str | None, limits: Limits, notes: list[str]) -> str | None:
    if value is None:
        return None
    if not value.strip():
        notes.append("The link's prompt is empty; the page's prompt is kept.")
        return None
    if len(value) > limits.max_prompt_chars:
        notes.append(f"The link's prompt has {len(value):,} characters, above this server's limit of "
                     f"{limits.max_prompt_chars:,}; the page's prompt is kept.")
        return None
    if "\x00" in value:
        notes.append("The link's prompt contains a NUL character; the page's prompt is kept.")
        return None
    return value


def _int_range(name: str, limits: Limits) -> tuple[int, int, str]:
    """The integers a knob may take on this server, and where the upper bound comes from."""
    if name == "max_new_tokens":
        return 1, limits.max_new_tokens, " (this server's limit)"
    if name == "seed":
        return 0, 2**63 - 1, ""
    lo, hi = LIMITS[name]
    if name == "draft_tokens" and limits.max_draft_tokens < hi:
        return lo, limits.max_draft_tokens, " (this server's limit)"
    return lo, hi, ""


def _parse(name: str, text: str, limits: Limits) -> tuple[int | float | str | None, str]:
    """(the knob's value, ""), (None, why it cannot be used), or (the end of the page's range, why that is used
    instead: a value the engine takes, above where the page's slider stops)."""
    text = text.strip()
    if name == "attn_impl":
        return (text, "") if text in IMPLS else (None, f"must be one of {', '.join(IMPLS)}")
    if name == "source":
        return (text, "") if text in SOURCES else (None, f"must be one of {', '.join(SOURCES)}")
    if name == "adaptive":
        return {"1": (True, ""), "0": (False, "")}.get(text, (None, "must be 0 or 1"))
    integer = name in _INT_FIELDS
    if len(text) > MAX_NUMBER_CHARS or not (_INTEGER if integer else _DECIMAL).fullmatch(text):
        if text.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            return None, "must be a finite number"
        return None, "must be a whole number" if integer else "must be a number"
    value = int(text) if integer else float(text)
    if not math.isfinite(value):  # 1e999
        return None, "must be a finite number"
    if value < 0:
        return None, "must not be negative"
    if name in RANGES:  # a knob with the page's own range: what a link gives is held to the slider's ends
        lo, hi = RANGES[name]
        if value > hi:
            return hi, f"is above the page's range, which ends at {hi:g}: {hi:g} is used"
        if value < lo and name == "top_p" and value > 0:  # the engine would take it, the slider starts above it
            return lo, f"is below the page's range, which starts at {lo:g}: {lo:g} is used"
        if value < lo:
            return None, f"must be in [{lo:g}, {hi:g}]"
        return value, ""
    if integer:
        lo, hi, why = _int_range(name, limits)
        return (value, "") if lo <= value <= hi else (None, f"must be in [{lo}, {hi}]{why}")
    lo, hi, shown = _FLOAT_FIELDS[name]
    inside = (lo < value <= hi) if name == "top_p" else (lo <= value <= hi)
    return (value, "") if inside else (None, f"must be in {shown}")


def _knobs(given: dict[str, str], base: Knobs, limits: Limits, notes: list[str]) -> Knobs:
    """`base` with each usable knob of the link; then the knobs together must make a valid configuration."""
    changes = {}
    for f in fields(Knobs):
        if f.name not in given:
            continue
        value, why = _parse(f.name, given[f.name], limits)
        if value is None:
            notes.append(f"Link parameter {f.name}={_show(given[f.name])} {why}; "
                         f"the default {getattr(base, f.name)} is used.")
        else:
            notes += [f"Link parameter {f.name}={_show(given[f.name])} {why}."] if why else []
            changes[f.name] = value
    knobs = replace(base, **changes)
    try:
        knobs.configs()
    except UserFacingError as exc:
        notes.append(f"The link's knobs do not make a valid configuration ({exc}); the defaults are used.")
        return base
    return knobs
