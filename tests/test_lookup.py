"""eagleviz/decoding/lookup.py: the continuation of the longest recurring suffix, its latest earlier occurrence,
kept incrementally as tokens are committed."""

from __future__ import annotations

import random

import pytest

from eagleviz.decoding.lookup import MAX_NGRAM, Foresight, Match, SuffixIndex


def brute_force(tokens: list[int], max_ngram: int, length: int) -> Match | None:
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for end in range(len(tokens) - 2, n - 2, -1):  # latest earlier occurrence first
            if tokens[end - n + 1:end + 1] == suffix:
                return Match(tuple(tokens[end + 1:end + 1 + length]), n)
    return None


def test_the_longest_recurring_suffix_gives_what_followed_it():
    index = SuffixIndex([1, 2, 3, 4, 9, 2, 3])
    assert index.match(3) == Match((4, 9, 2), 2)


def test_the_latest_earlier_occurrence_wins():
    index = SuffixIndex([5, 1, 5, 2, 5])
    assert index.match(2) == Match((2, 5), 1)


def test_no_match_and_short_continuations():
    assert SuffixIndex([1, 2, 3]).match(4) is None
    assert SuffixIndex([7, 7]).match(5) == Match((7,), 1)   # a repeated token predicts itself
    assert SuffixIndex([1, 2, 1, 2]).match(0) is None


def test_min_ngram_refuses_short_matches():
    index = SuffixIndex([1, 2, 9, 3, 2])
    assert index.match(2) == Match((9, 3), 1)
    assert index.match(2, min_ngram=2) is None


@pytest.mark.parametrize("seed", range(20))
def test_incremental_index_agrees_with_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(rng.randrange(2, 12))]
    index = SuffixIndex(tokens[:2], max_ngram=3)
    for t in tokens[2:]:
        index.extend([t])
    for _ in range(15):
        chunk = [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        tokens += chunk
        index.extend(chunk)
        assert index.match(4) == brute_force(tokens, 3, 4)


def test_max_ngram_must_be_positive():
    with pytest.raises(ValueError):
        SuffixIndex([1], max_ngram=0)


def test_foresight_proposes_the_reference_while_the_context_follows_it():
    prompt = [7, 8, 9]
    index = Foresight([1, 2, 3, 4], len(prompt), prompt + [1])
    assert index.match(2) == Match((2, 3), MAX_NGRAM)
    index.extend([2, 3])
    assert index.match(5) == Match((4,), MAX_NGRAM)
    index.extend([4])
    assert index.match(1) is None  # the reference is spent
    assert index.match(0) is None


def test_foresight_stops_proposing_once_the_context_leaves_the_reference():
    index = Foresight([1, 2, 3, 4], 2, [5, 5, 1])
    index.extend([9])
    assert index.match(2) is None
