"""The generated text as (token, provenance) pairs for a highlighted-text view: one item per output token,
so that a click on an item names the token (and, through `selection.output_origin`, the cycle that
committed it).

Provenance comes from the trace's `OutputToken.source` ("draft" = an accepted draft token, "bonus" = the
target's own token, "prefill" = the token the prompt's forward produced, "target" = plain decoding), never
from searching the decoded text. Newlines are shown as a visible mark, an empty token as the empty-set sign.
"""

from __future__ import annotations

from eagleviz.trace import RunTrace

CATEGORY = {"draft": "accepted draft", "bonus": "bonus (target)", "prefill": "first token",
            "target": "plain (target)"}
# Lighter versions of the figures' accepted-blue and bonus-orange (style.ACCEPTED, style.BONUS), legible under text.
COLOURS = {"accepted draft": "#9CC3E0", "bonus (target)": "#F5CD80", "first token": "#D0D0D0"}


def shown(text: str) -> str:
    return text.replace("\n", "\u21b5") or "\u2205"


def output_tokens(run: RunTrace | None) -> list[tuple[str, str]]:
    """Item i is output token i: its text as shown and its provenance category."""
    if run is None:
        return []
    return [(shown(t.text), CATEGORY.get(t.source, t.source)) for t in run.output]
