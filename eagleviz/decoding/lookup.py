"""Free candidates: continuations the context already wrote (prompt lookup, suffix matching).

An answer often repeats its prompt or itself: a quoted sentence, a renamed variable, a list whose items share
their form. When the last n tokens of the context (prompt + committed output) occurred earlier, the tokens that
followed that earlier occurrence are a guess that costs no model work. The engine adds such a continuation to
the draft tree as a branch below the root (merging with the head's own nodes where they agree) and the target
verifies it in the same forward; greedy verification and speculative sampling accept any tree, so the output
is unchanged (a lookup token is a deterministic proposal, like the head's top-k children).

`SuffixIndex` keeps, for every n-gram of length 1..max_ngram, the position where it last ended, updated as
tokens are committed, so a match costs a few dictionary lookups whatever the context's length.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

MAX_NGRAM = 3


class Match(NamedTuple):
    """A continuation: `tokens` followed the latest earlier occurrence of the context's last `ngram` tokens."""

    tokens: tuple[int, ...]
    ngram: int


class SuffixIndex:
    """The n-grams of one run's context, by where they last ended. Owned by one run (no shared state).

    `extend` only appends: the n-grams of new tokens are indexed by the next `match`, all at once (a run whose
    lookups rest appends a token a cycle and indexes them when it next looks; a cycle's lone token, indexed
    after the target's forward had swept the CPU's caches, cost ~40 us of the ~7 ms step)."""

    def __init__(self, tokens: Iterable[int] = (), max_ngram: int = MAX_NGRAM):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be at least 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        # n-gram -> end position of its latest occurrence before the current end of the context
        self._last: dict[tuple[int, ...], int] = {}
        self._pending: tuple[tuple[tuple[int, ...], int], ...] = ()  # the suffixes ending at the last token
        self._indexed = 0  # tokens whose n-grams are in `_last` / `_pending`
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(map(int, tokens))

    def _index(self) -> None:
        context, last, most = self.tokens, self._last, self.max_ngram
        for end in range(self._indexed, len(context)):
            last.update(self._pending)  # n-grams that ended at the previous last token become "earlier"
            t = context[end]
            if most == 3 and end >= 2:  # the default, as tuple displays
                a, b = context[end - 2], context[end - 1]
                self._pending = (((t,), end), ((b, t), end), ((a, b, t), end))
            else:
                self._pending = tuple((tuple(context[end - n + 1:end + 1]), end)
                                      for n in range(1, min(most, end + 1) + 1))
        self._indexed = len(context)

    def match(self, length: int, min_ngram: int = 1) -> Match | None:
        """The continuation of the longest suffix (max_ngram down to min_ngram tokens) that occurred earlier:
        up to `length` tokens that followed its latest earlier occurrence. None when no suffix recurs."""
        if length < 1:
            return None
        if self._indexed < len(self.tokens):
            self._index()
        for gram, _ in reversed(self._pending):  # longest first
            if len(gram) < min_ngram:
                break
            end = self._last.get(gram)
            if end is not None:
                follow = self.tokens[end + 1:end + 1 + length]
                if follow:
                    return Match(tuple(follow), len(gram))
        return None


class Foresight:
    """A drafter that knows the answer: it proposes the next tokens of a reference output (a plain run's), as
    `SuffixIndex` proposes what followed an earlier n-gram. Every proposal is what the target will choose, so a
    greedy run accepts all of them: the tokens per cycle a perfect drafter would reach, at no drafting cost.
    It measures the engine's ceiling on a machine (`python -m eagleviz ceiling`) and tests batch invariance end
    to end (a token whose logits moved with its tree would be rejected). Owned by one run, like `SuffixIndex`."""

    def __init__(self, reference: list[int], prompt_length: int, tokens: Iterable[int] = ()):
        self.reference = list(reference)
        self.start = prompt_length  # the context's token there is the reference's first
        self.tokens: list[int] = []
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(int(t) for t in tokens)

    def match(self, length: int, min_ngram: int = 1) -> Match | None:
        """The reference's next `length` tokens (fewer at its end), while the context still equals the reference
        so far, else None. Reported as a match of MAX_NGRAM tokens (a sure one); `min_ngram` is `SuffixIndex`'s
        and has no meaning here."""
        done = len(self.tokens) - self.start  # reference tokens the context already holds
        if length < 1 or done < 0 or self.tokens[self.start:] != self.reference[:done]:
            return None  # the run left the reference: nothing is known beyond that point
        follow = self.reference[done:done + length]
        return Match(tuple(follow), MAX_NGRAM) if follow else None
