"""The app's presets: prompts chosen by measurement with the shipped head, each with the tree that shows its
lesson and a note saying what a run really shows.

Each preset carries its own tree (`Preset.tree`, steps / topk / draft tokens), always a branching one (topk >= 2)
and fixed (SGLang's tree, no cost-aware pruning: the picture is exactly what the knobs say), chosen from a
printout of every preset run with candidate trees (docs/performance.md, "Removed scripts": preset_trees.py).
This machine's fastest tree (`python -m eagleviz tune`, usually a small one on a CPU) is one click away on the
page and is what the race times.

Every note's claim is checked by `tests/test_presets.py`, which runs each preset with the shipped head as the
page does (its tree, the page's numerics, 48 new tokens): the ordering of tau, no degenerate loop, sensible
text, and the tau each note quotes. Re-run it whenever the head changes:

    python -m pytest tests/test_presets.py -q -s     # prints each preset's tau and text

The figures quoted in the notes (MEASURED_TAU) came from that printout with the target computing from the
model file's weight blocks (`--weights blocks`, the default on a CPU): there the products sum in one fixed
order on every CPU, so the test holds them to 0.05 wherever it runs from blocks, and to 0.5 in bf16 or fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from eagleviz.app.glossary import link_terms
from eagleviz.config import SamplingConfig, TreeConfig

PRESET_TOKENS = 48  # the page's default max new tokens: what a preset's claim is measured at


@dataclass(frozen=True)
class Preset:
    """A prompt with the tree and temperature it is run at and a note saying what it shows. `shows` is the
    claim the test checks: "high" (the highest tau of the presets), "code", "low" (the lowest tau at T = 0),
    "sampling" (T > 0), "near_tie" (EAGLE equals plain decoding from blocks where bf16 parts them) or "lookup" (prompt
    lookup's candidates, copied from the context, carry the run). `source`: where its candidates come from
    (`config.SOURCES`)."""

    name: str
    prompt: str
    note: str
    shows: str
    tree: tuple[int, int, int]      # steps, topk, draft tokens: a fixed tree with topk >= 2
    temperature: float = 0.0
    source: str = "eagle"

    def __post_init__(self):
        if self.tree[1] < 2:
            raise ValueError(f"preset {self.name!r}: its tree must branch (topk >= 2), got {self.tree}")

    @property
    def tree_label(self) -> str:
        return " / ".join(str(v) for v in self.tree)


PRESETS = (
    Preset("Counting (high acceptance)", "List the numbers from 1 to 15, one per line.",
           "Tree {tree} (the textbook tree). The target writes `1, 2, 3, ...`: once the pattern is set, the draft "
           "guesses it several tokens ahead, down more than one branch of its tree, and most cycles commit four "
           "tokens or more (tau about {high}). This is EAGLE at its best.", "high", (5, 4, 16)),
    Preset("Code", "Write a Python function that checks whether a number is prime.",
           "Tree {tree}. Keywords, indentation and repeated names are easy to guess; the names and numbers the "
           "target picks are not (tau about {code}). Watch the cycles where a whole keyword run is accepted, and "
           "those where a second or third child won.", "code", (4, 3, 10)),
    Preset("Explanation (low acceptance)", "Explain what a black hole is in two sentences.",
           "Tree {tree}: wide and shallow, four guesses per position. Open prose has many good next words, and the "
           "draft often bets on a different one than the target: tau about {low}, the lowest of these presets. "
           "Watch which depth the target says no at.", "low", (3, 4, 10)),
    Preset("Story, sampled at T = 0.8", "Tell me a short story about a dragon who is afraid of the dark.",
           "Tree {tree}. At T > 0 a drafted token is accepted when a uniform draw falls below p, the target's "
           "probability of it (the draft picked its top tokens deterministically, so min(1, p/q) has q = 1); a "
           "rejected token's mass leaves the residual the next sibling or the bonus token is drawn from: up to "
           "four siblings per node give up to four chances. The path panel shows p and the draw of every check (tau about "
           "{sampling}).", "sampling", (4, 4, 12), 0.8),
    Preset("Near-tie, exact from blocks", "Why is the sky blue?",
           "Tree {tree}. Run, then press Race: EAGLE and plain decoding write the same text, token for token (tau "
           "about {near_tie}). In bf16 they did not: on {near_tie_cpu}, after `the shorter wavelengths of light,` "
           "the target's two best next tokens, ` including` and ` particularly`, got the same bf16 logit; the "
           "verify forward (several tree tokens at once) and plain decoding (one token) rounded them differently, "
           "and the texts parted there. This page computes from the model file's weight blocks, where each "
           "token's logits are summed in one fixed order whatever else is in the batch, on every CPU: the "
           "algorithm is lossless, and so is this arithmetic.", "near_tie", (5, 4, 16)),
    Preset("Quoting (prompt lookup)",
           "Repeat this paragraph exactly: Speculative decoding lets a small model guess several tokens ahead. The "
           "large model checks all the guesses in one forward pass. Every guess it agrees with is kept, so the text "
           "is exactly what the large model would have written.",
           "Tree {tree}, candidates from the EAGLE head and from prompt lookup. The answer quotes the prompt, and "
           "lookup proposes what followed the last words the last time they appeared in the context: from cycle 1 "
           "on, those candidates (green in the tree) are accepted several at a time, and nearly every accepted "
           "token is one of them (tau about {lookup}; the head alone, draft source `eagle`, about {lookup_head}). "
           "They cost no model work to propose.", "lookup", (5, 4, 16), source="eagle+lookup"),
)

# Where the bf16 divergence the near-tie preset's note tells of was found: bf16 rounding depends on the CPU's
# bf16 units, so the test insists on it only on a CPU with this description (`cpu_description`).
NEAR_TIE_CPU = "AMD EPYC, AVX512, native bf16"

# The tau each note quotes, as tests/test_presets.py measured it with the shipped head (printed with -s): each
# preset's own tree, 48 new tokens, the target computing from its weight blocks (the same on every CPU).
MEASURED_TAU = {"high": 4.80, "code": 1.92, "low": 1.30, "sampling": 1.66, "near_tie": 1.60, "lookup": 3.71,
                "lookup_head": 1.53}   # lookup_head: the lookup preset with the head's candidates alone
MEASURED_WEIGHTS = "blocks"


def knobs(preset: Preset, base):
    """`base` (a session.Knobs) with the preset's tree (fixed), its draft source and its temperature."""
    steps, topk, draft_tokens = preset.tree
    return replace(base, steps=steps, topk=topk, draft_tokens=draft_tokens, temperature=preset.temperature,
                   adaptive=False, source=preset.source)


def by_name() -> dict[str, Preset]:
    return {p.name: p for p in PRESETS}


def note(preset: Preset) -> str:
    """The preset's note with the measured figures filled in, its first uses of a term linked to the glossary."""
    return link_terms(preset.note.format(near_tie_cpu=NEAR_TIE_CPU, tree=preset.tree_label,
                                         **{k: f"{v:.1f}" for k, v in MEASURED_TAU.items()}))


def matching(prompt: str, settings) -> Preset | None:
    """The preset whose prompt and knobs `settings` (a session.Knobs) and `prompt` still are: its prompt, its
    tree (fixed), its draft source and its temperature. The knobs a preset does not set (max new tokens, top-p,
    seed, attention) leave it selected; any other edit lets it go, so its note stops describing the page."""
    for preset in PRESETS:
        own = knobs(preset, settings)
        if (prompt == preset.prompt and own == replace(settings, temperature=own.temperature)
                and math.isclose(settings.temperature, preset.temperature, abs_tol=1e-9)):
            return preset
    return None


RESTORE = "One click restores a preset: its prompt, tree and temperature, after any edit."


def edited_note(name: str) -> str:
    """What the note says once the page's settings are no longer the preset's."""
    return (f"Settings changed since the preset **{name}**: its note no longer describes them. Click "
            f"**{name}** above to restore its prompt, tree and temperature.")


def prefill(engine) -> int:
    """Each preset's prompt prefilled now and kept whole by an engine that keeps prompts
    (`Engine.with_prompt_cache`): a class pressing Run on a preset then skips its prefill, as a prompt run again
    does (docs/performance.md entries 50 and 69). A run of one token each, with the features the head reads (the
    presets' own numerics, so the same tokens); returns how many prompts are kept after it."""
    if not engine.prompts.entries:
        return 0
    tree = TreeConfig.create() if engine.head is not None else None
    for preset in PRESETS:
        engine.generate(preset.prompt, tree, SamplingConfig(max_new_tokens=1))
    return sum(engine.prompts.get(engine.attn_impl, engine.encode_prompt(p.prompt), tree is not None) is not None
               for p in PRESETS)
