"""The generated text as HTML, each token coloured by provenance, cycle boundaries marked, a tooltip per token.

Provenance comes from the trace's `OutputToken.source` ("draft" = an accepted draft token, "bonus" = the
target's own token, "prefill" = the token the prompt's forward produced, "target" = plain decoding), never
from searching the decoded text. Colour is doubled by an underline style for colour-blind readers.
"""

from __future__ import annotations

import html

from eagleviz.trace import RunTrace
from eagleviz.visuals.style import ACCEPTED, BONUS, INK, NEUTRAL

STYLE = {
    "draft": f"background:#D6E6F2;border-bottom:3px solid {ACCEPTED}",
    "bonus": f"background:#FBE7C0;border-bottom:3px dotted {BONUS}",
    "prefill": f"background:#EEEEEE;border-bottom:3px double {NEUTRAL}",
    "target": "background:#F4F4F4",
}
MEANING = {"draft": "accepted draft token", "bonus": "bonus token (from the target)",
           "prefill": "first token (from the prompt's forward)", "target": "plain decoding (one target forward)"}
SEPARATOR = f"<span title='cycle boundary' style='border-left:2px solid {INK};margin:0 2px'></span>"
CONTAINER = ("font-family:'DejaVu Sans Mono',monospace;font-size:15px;line-height:2.0;white-space:pre-wrap;"
             "word-break:break-word;padding:8px;border:1px solid #ccc;border-radius:6px;min-height:3em;"
             f"color:{INK};background:white")


def legend_html() -> str:
    items = "".join(f"<span style='{STYLE[k]};padding:0 4px;margin-right:10px'>{MEANING[k]}</span>"
                    for k in ("draft", "bonus", "prefill"))
    return (f"<div style='font-size:13px;margin-bottom:4px'>{items}"
            f"<span>{SEPARATOR} cycle boundary</span></div>")


def _token_html(text: str) -> str:
    shown = html.escape(text)
    if "\n" in text:
        shown = shown.replace("\n", "\u21b5\n")
    return shown or "\u2205"


def output_html(run: RunTrace | None, placeholder: str = "The output appears here as it is generated.") -> str:
    """The run's output so far; one span per token with its cycle and provenance in the tooltip."""
    if run is None or not run.output:
        return f"{legend_html()}<div style=\"{CONTAINER}\"><i style='color:{NEUTRAL}'>{placeholder}</i></div>"
    parts, last_cycle = [], None
    for k, tok in enumerate(run.output):
        if tok.cycle != last_cycle and tok.cycle >= 0 and k > 0:
            parts.append(SEPARATOR)
        last_cycle = tok.cycle
        where = f"cycle {tok.cycle}" if tok.cycle >= 0 else "before the first cycle"
        meaning = MEANING.get(tok.source, tok.source)
        tip = html.escape(f"token {k} \u00b7 {where} \u00b7 {meaning} \u00b7 id {tok.token}", quote=True)
        parts.append(f"<span title=\"{tip}\" data-cycle=\"{tok.cycle}\" data-source=\"{tok.source}\" "
                     f"style=\"{STYLE.get(tok.source, '')}\">{_token_html(tok.text)}</span>")
    return f"{legend_html()}<div style=\"{CONTAINER}\">{''.join(parts)}</div>"
