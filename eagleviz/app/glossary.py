"""The words a learner meets on the page, each said once in plain words, and the first use of each in a text
linked to it.

    TERMS            the glossary: anchor, name, the ways the page writes the term, its meaning
    markdown()       the glossary section, one anchored entry per term
    link_terms(text) `text` (Markdown) with the first use of each term linked to its entry ("#g-tau")
    LINKS_JS         on the page: a click on such a link opens the glossary and brings the entry into sight, and
                     shows a button back to where the word was clicked

The developer's glossary (exact definitions, as the trace records them) is `eagleviz.trace`'s docstring; this one
says the same things for someone seeing speculative decoding for the first time, and adds the words of the
page around the trace (prefill, bf16, logit, frontier, lookup, the cost-aware tree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANCHOR_PREFIX = "g-"
BACK_ID = "glossary-back"   # the button that returns from an entry to the word that was clicked


@dataclass(frozen=True)
class Term:
    anchor: str              # "g-tau": the entry's id on the page
    name: str                # as the entry is titled
    words: tuple[str, ...]   # how the page writes it, longest first (matched case-insensitively, whole words)
    meaning: str


TERMS = (
    Term("g-tau", "tau (\u03c4) and accept length", ("accept length", "tau", "\u03c4"),
         "**Accept length**: how many drafted tokens the target kept in one cycle. **Tau**: the tokens a cycle "
         "commits on average, the bonus token included (mean accept length + 1). Tau 3 means three tokens for each "
         "forward of the big model instead of one. Engines count differently: SGLang's *accept len* includes the "
         "bonus token (it is tau); this page calls the tokens one cycle commits, bonus included, *tokens per "
         "cycle* (the Compare section's histogram), never accept length."),
    Term("g-alpha", "alpha (\u03b1) and acceptance rate", ("acceptance rate", "alpha", "0-\u03b1", "\u03b1"),
         "The share of drafted tokens at one depth of the tree that the target accepts, counting only those whose "
         "parent was accepted. Deeper guesses are accepted less often."),
    Term("g-prefill", "prefill", ("prefill",),
         "The big model's first forward over the whole prompt at once: it fills the KV cache and gives the first "
         "token. Decoding, cycle by cycle, starts after it."),
    Term("g-kv", "KV cache", ("KV cache", "KV"),
         "The keys and values the attention layers computed for every token so far, kept so that a new token "
         "does not recompute the whole text. Verification writes the tree's tokens into it; the rewind keeps the "
         "accepted ones and drops the rest."),
    Term("g-bf16", "bf16", ("bf16", "bfloat16"),
         "Numbers stored in 16 bits with the range of 32-bit floats but only about 3 significant digits: half the "
         "memory, faster on many chips, and two ways of computing the same sum may round differently (the near-tie "
         "preset shows one)."),
    Term("g-logit", "logit", ("logits", "logit"),
         "The model's raw score for each token of its vocabulary, before softmax turns the scores into "
         "probabilities. The highest logit is the greedy choice."),
    Term("g-residual", "residual", ("residual",),
         "At a temperature above 0: once a drafted token is rejected, its probability is taken out of the target's "
         "distribution and the rest scaled back to 1. The next sibling is checked against this residual, or the "
         "bonus token is drawn from it; that is what keeps the text distributed exactly as the target's."),
    Term("g-frontier", "frontier", ("frontier",),
         "The nodes of the draft tree that may still grow at the next draft level: the most probable leaves so "
         "far (topk of them)."),
    Term("g-draft-tree", "draft tree", ("draft tree",),
         "The continuations the small draft model guesses in one cycle, as a tree: the root is the last committed "
         "token, each node a guessed next token, siblings are alternatives. steps is its depth, topk the children "
         "per node, draft tokens how many nodes go to the target."),
    Term("g-verification", "verification", ("verification", "verify"),
         "The big model's one forward over all the tree's tokens at once, each seeing only its own ancestors (the "
         "tree attention mask): it gives the target's choice after every node of the tree."),
    Term("g-bonus", "bonus token", ("bonus token", "bonus"),
         "The token the target adds itself after the accepted path, its own choice there: every cycle commits at "
         "least one token, even when every guess is rejected."),
    Term("g-rejection-sampling", "rejection sampling", ("rejection sampling", "speculative sampling"),
         "The accept rule at a temperature above 0: a drafted token is kept when a uniform draw u falls below p, "
         "the target's probability of it (the draft's top tokens are chosen, not sampled); after a rejection the "
         "next token comes from the residual. The output has exactly the target's distribution."),
    Term("g-cost-aware", "cost-aware tree", ("cost-aware tree", "cost-aware"),
         "A tree shaped each cycle by what pays on this machine: a node is added while the tokens it is expected "
         "to bring are worth more than the verification time it costs (from measured prices). The three tree "
         "knobs become upper bounds."),
    Term("g-lookup", "prompt lookup", ("prompt lookup", "lookup"),
         "Candidates copied from the text so far: after the last few tokens, what followed them the last time "
         "they appeared. They cost no model work and shine when the answer quotes the prompt."),
)


def markdown() -> str:
    """The glossary section: one entry per term, each with the anchor its links point to."""
    return "\n\n".join(f'<a id="{t.anchor}"></a>**{t.name}**: {t.meaning}' for t in TERMS)


# Where a term is not linked: code spans, existing links (and images), headings, HTML tags.
_SKIP = re.compile(r"`[^`]*`|!?\[[^\]]*\]\([^)]*\)|<[^>]+>|^#{1,6} .*$", re.MULTILINE)
_PATTERNS = tuple((t, re.compile(r"(?<![\w-])(" + "|".join(re.escape(w) for w in t.words) + r")(?![\w-])",
                                  re.IGNORECASE)) for t in TERMS)


def link_terms(text: str) -> str:
    """`text` with the first use of each glossary term linked to its entry (`[tau](#g-tau)`), outside code
    spans, links and HTML. Longer terms win where two overlap ("draft tree" before "draft")."""
    if not text:
        return text
    spans = [(m.start(), m.end()) for m in _SKIP.finditer(text)]
    taken: list[tuple[int, int, Term]] = []
    for term, pattern in _PATTERNS:
        if f"](#{term.anchor})" in text:   # linked already
            continue
        for m in pattern.finditer(text):
            a, b = m.span(1)
            if any(s <= a < e for s, e in spans) or any(a < e and s < b for s, e, _ in taken):
                continue
            taken.append((a, b, term))
            break
    for a, b, term in sorted(taken, key=lambda x: x[0], reverse=True):
        text = f"{text[:a]}[{text[a:b]}](#{term.anchor}){text[b:]}"
    return text


# Gradio's Markdown opens links in a new tab, and the glossary's accordion hides its entries until opened: a
# click on a term is answered here instead, the entry shown where the glossary is, lit until GLOSSARY_LIT_MS after
# the scroll to it has come to rest (a busy machine's smooth scroll can take longer than the light would last).
GLOSSARY_LIT_MS = 2500
LINKS_JS = f"""() => {{
  document.addEventListener('click', (e) => {{
    const a = e.target.closest && e.target.closest('a[href^="#{ANCHOR_PREFIX}"]');
    if (!a) return;
    e.preventDefault(); e.stopPropagation();
    // the way back: a button at the window's bottom left returns to where the reader clicked the word
    const from = window.scrollY;
    let back = document.getElementById('{BACK_ID}');
    if (!back) {{
      back = document.createElement('button');
      back.id = '{BACK_ID}'; back.type = 'button'; back.textContent = '\u21a9 Back to the text';
      document.body.appendChild(back);
    }}
    back.onclick = () => {{ window.scrollTo({{top: Number(back.dataset.from), behavior: 'smooth'}});
                           back.hidden = true; }};
    back.dataset.from = String(from); back.hidden = false;
    const id = a.getAttribute('href').slice(1), head = document.querySelector('#glossary .label-wrap');
    if (head && !head.classList.contains('open')) head.click();
    const show = (tries) => {{
      const t = document.getElementById(id), entry = t && (t.closest('p') || t.parentElement);
      if (entry && entry.getBoundingClientRect().height > 0) {{
        entry.scrollIntoView({{behavior: 'smooth', block: 'center'}});
        entry.classList.add('ev-glossary-hit');
        let last = NaN, still = 0, looks = 200;   // at rest: three looks 50 ms apart in one place (10 s at most)
        const rest = () => {{
          const top = entry.getBoundingClientRect().top;
          still = top === last ? still + 1 : 0;
          last = top;
          if (still < 3 && looks-- > 0) return setTimeout(rest, 50);
          setTimeout(() => entry.classList.remove('ev-glossary-hit'), {GLOSSARY_LIT_MS});
        }};
        setTimeout(rest, 50);
      }} else if (tries > 0) setTimeout(() => show(tries - 1), 50);
    }};
    show(60);
  }}, true);
  return [];
}}"""
CSS = (".ev-glossary-hit {background: #FFF3C4; transition: background 0.3s} #glossary p {margin: 0 0 8px} "
       f"#{BACK_ID} {{position: fixed; left: 12px; bottom: 12px; z-index: 1100; padding: 6px 12px; "
       "border-radius: 6px; border: 1px solid #999; background: #fff; color: #222; font-size: 15px; "
       "box-shadow: 0 2px 8px rgba(0, 0, 0, 0.2); cursor: pointer} "
       f"#{BACK_ID}[hidden] {{display: none}}")
