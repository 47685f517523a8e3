"""The generated text as (token, provenance) pairs for a highlighted-text view: one item per output token,
so that a click on an item names the token (and, through `selection.output_origin`, the cycle that
committed it).

Provenance comes from the trace's `OutputToken.source` ("draft" = an accepted draft token, "bonus" = the
target's own token, "prefill" = the token the prompt's forward produced, "target" = plain decoding), never
from searching the decoded text. The text keeps its line breaks and indentation: a newline is shown as a
visible mark followed by the line break itself (the highlighted-text view starts a new line there, and the
mark keeps a newline-only token visible and clickable), spaces are kept as they are (the page's CSS sets
`white-space: pre-wrap` and a monospace font), and an empty token is shown as the empty-set sign. A character
spelled over several byte tokens (an emoji) is shown whole on the token that finishes it, the tokens before it
as "‹part›". The
end-of-text token that ended a run (the trace's stop reason "eos": it is the last output token) is shown in
words, not as the tokenizer's marker (`<|im_end|>`).
"""

from __future__ import annotations

from eagleviz.trace import RunTrace

CATEGORY = {"draft": "accepted draft", "bonus": "bonus (target)", "prefill": "first token",
            "target": "plain (target)"}
# Lighter versions of the figures' accepted-blue and bonus-orange (style.ACCEPTED, style.BONUS), legible under text.
COLOURS = {"accepted draft": "#9CC3E0", "bonus (target)": "#F5CD80", "first token": "#D0D0D0"}


NEWLINE = "\u21b5"
END_MARK = "[end of answer]"
PART_MARK = "\u2039part\u203a"   # a token holding the first bytes of a character that a later token finishes


def is_end(run: RunTrace, i: int) -> bool:
    """Output token i is the end-of-text token that ended the run."""
    return run.stop_reason == "eos" and i == len(run.output) - 1


def readable(run: RunTrace, i: int) -> str:
    """Output token i's text, the end-of-text token in words; a token that only begins a character (its bytes
    finished by a later token: `OutputToken.piece`) as PART_MARK, the one that finishes it as the character."""
    if is_end(run, i):
        return END_MARK
    token = run.output[i]
    return PART_MARK if token.piece == "" else token.written


def shown(text: str) -> str:
    """A token's text as the view shows it: each newline after a visible mark, nothing else changed."""
    return text.replace("\n", NEWLINE + "\n") or "\u2205"


def output_tokens(run: RunTrace | None) -> list[tuple[str, str]]:
    """Item i is output token i: its text as shown and its provenance category."""
    if run is None:
        return []
    return [(shown(readable(run, i)), CATEGORY.get(t.source, t.source)) for i, t in enumerate(run.output)]
