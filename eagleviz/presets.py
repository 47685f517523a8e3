"""The app's presets: prompts chosen by measurement with the shipped head, each labelled with what a run
really shows.

Every label's claim is checked by `tests/test_presets.py`, which runs each preset with the shipped head as
the page does (bf16 or fp32 as the CPU decides, the default tree, 48 new tokens): the ordering of tau, no
degenerate loop, sensible text. Re-run it whenever the head changes:

    python -m pytest tests/test_presets.py -q -s     # prints each preset's tau and text

The figures quoted in the notes (MEASURED_TAU) came from that printout on the project's machine; another
CPU rounds bf16 differently, so a run elsewhere may differ slightly (the test allows 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

PRESET_TOKENS = 48  # the page's default max new tokens: what a preset's claim is measured at


@dataclass(frozen=True)
class Preset:
    """A prompt with the temperature it is run at and a note saying what it shows. `shows` is the claim the
    test checks: "high" (the highest tau of the presets), "code", "low" (the lowest tau at T = 0) or
    "sampling" (T > 0)."""

    name: str
    prompt: str
    note: str
    shows: str
    temperature: float = 0.0


PRESETS = (
    Preset("Counting (high acceptance)", "List the numbers from 1 to 15, one per line.",
           "The target writes `1, 2, 3, ...`: once the pattern is set, the draft guesses it several tokens ahead "
           "and most cycles commit several tokens (tau about {high} with the page's default tree; the textbook "
           "tree 5 / 4 / 16 reaches about {high_textbook}). This is EAGLE at its best.", "high"),
    Preset("Code", "Write a Python function that checks whether a number is prime.",
           "Keywords, indentation and repeated names are easy to guess; the names and numbers the target picks "
           "are not (tau about {code}). Watch the cycles where a whole keyword run is accepted.", "code"),
    Preset("Explanation (low acceptance)", "Explain photosynthesis in two sentences.",
           "Open prose has many good next words, and the draft often bets on a different one than the target: "
           "tau about {low}, the lowest of these presets. Watch which depth the target says no at.", "low"),
    Preset("Story, sampled at T = 0.8", "Tell me a short story about a dragon who is afraid of the dark.",
           "At T > 0 a drafted token is accepted when a uniform draw falls below p, the target's probability of "
           "it (the draft picked its top tokens deterministically, so min(1, p/q) has q = 1); a rejected "
           "token's mass leaves the residual the next sibling or the bonus token is drawn from. The path panel "
           "shows p and the draw of every check (tau about {sampling}).", "sampling", 0.8),
)

# The tau each note quotes, as tests/test_presets.py measured it with the shipped head (printed with -s):
# the page's default tree (assets/bench/tuned.json: 4 / 1 / 5 on the project's CPU), 48 new tokens, bf16;
# "high_textbook" is the counting preset with the textbook tree 5 / 4 / 16.
MEASURED_TAU = {"high": 3.2, "high_textbook": 4.4, "code": 1.6, "low": 1.3, "sampling": 1.3}


def by_name() -> dict[str, Preset]:
    return {p.name: p for p in PRESETS}


def note(preset: Preset) -> str:
    """The preset's note with the measured figures filled in."""
    return preset.note.format(**{k: f"{v:.1f}" for k, v in MEASURED_TAU.items()})
