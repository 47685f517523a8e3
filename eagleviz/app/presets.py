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
    test checks: "high" (the highest tau of the presets), "code", "low" (the lowest tau at T = 0),
    "sampling" (T > 0) or "near_tie" (in bf16, EAGLE and plain decoding part at a tied top-2)."""

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
    Preset("Near-tie in bf16", "What are the primary colors?",
           "Run, then press Race. After `These three colors are essential` the target's two best next tokens, "
           "` for` and ` in`, get the same bf16 logit: the verify forward (several tree tokens at once) and plain "
           "decoding (one token) round differently, so EAGLE commits ` for`, plain decoding ` in`, and the texts "
           "part there (tau about {near_tie}). In fp32 the two are identical token for token: the algorithm is "
           "lossless, bf16 arithmetic is not bit-exact. Found on {near_tie_cpu}; a CPU that runs fp32, or "
           "rounds this tie alike in both forwards, shows identical texts.", "near_tie"),
)

# Where the near-tie preset's divergence was found: bf16 rounding depends on the CPU's bf16 units, so the
# test insists on the divergence only on a CPU with this description (`cpu_description`) and skips elsewhere.
NEAR_TIE_CPU = "AMD EPYC, AVX512, native bf16"

# The tau each note quotes, as tests/test_presets.py measured it with the shipped head (printed with -s):
# the page's default tree (assets/bench/tuned.json: 4 / 1 / 5 on the project's CPU), 48 new tokens, bf16;
# "high_textbook" is the counting preset with the textbook tree 5 / 4 / 16.
MEASURED_TAU = {"high": 3.2, "high_textbook": 4.4, "code": 1.6, "low": 1.3, "sampling": 1.3, "near_tie": 1.7}


def by_name() -> dict[str, Preset]:
    return {p.name: p for p in PRESETS}


def note(preset: Preset) -> str:
    """The preset's note with the measured figures filled in."""
    return preset.note.format(near_tie_cpu=NEAR_TIE_CPU, **{k: f"{v:.1f}" for k, v in MEASURED_TAU.items()})
