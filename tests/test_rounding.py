"""eagleviz/perf/rounding.py: the bound that judges greedy EAGLE parting from plain decoding in fp16/bf16, on
constructed logits: two paths whose errors are no larger than the dtype's measured one are always explained where
they part, whatever the logits; a path that moved a logit by more than rounding can (a wrong engine) is caught
wherever its token is not a near-tie of the exact logits; and the report's fields."""

import torch

from eagleviz.perf.rounding import Parting, parting


def _noise(gen: torch.Generator, shape, size: float) -> torch.Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * size


def test_two_paths_within_the_dtypes_error_are_explained_wherever_they_part():
    """10,000 positions of exact logits crowded with near-ties; plain decoding and the verification each add an error
    of at most E to every logit, the dtype's third computation errs by E at most (and reaches it somewhere): every
    parting is explained. Then the other side: a position whose two tokens are 2E + a hair apart in the exact logits
    can only part if a path erred by more than E, and is not explained."""
    gen = torch.Generator().manual_seed(0)
    vocab, error, parted = 64, 0.05, 0
    for _ in range(10_000):
        exact = torch.randn(vocab, generator=gen, dtype=torch.float64) * 0.1
        plain = int((exact + _noise(gen, vocab, error)).argmax())
        speculative = int((exact + _noise(gen, vocab, error)).argmax())
        own = exact + _noise(gen, vocab, error)
        own[0] = exact[0] + error  # the third computation's largest error is E
        if plain != speculative:
            parted += 1
            p = parting(3, plain, speculative, own, exact)
            assert p.explained, p
            assert abs(p.dtype_error - error) < 1e-12 and abs(p.reference_gap) <= 2 * error
    assert parted > 1000  # the positions were close enough to part often
    exact = torch.zeros(vocab, dtype=torch.float64)
    exact[5], exact[9] = 1.0, 1.0 - 2 * error - 1e-6
    assert not parting(0, 5, 9, exact + error, exact).explained  # E = 0.05 everywhere: 0.1 + 1e-6 is out of reach
    assert parting(0, 5, 9, exact + 2 * error, exact).explained  # a dtype twice as coarse could part them


def test_a_wrong_engine_is_caught_where_its_token_is_not_a_near_tie():
    """A verification that read a stale cache row or a wrong mask: its logits move by far more than rounding (here a
    shift of 1.0 to 3.0 on every logit, an order of magnitude over the dtype's error). Among the positions where it
    parts from plain decoding, every one whose tokens are more than 2E apart in the exact logits is failed, and that
    is nearly all of them."""
    gen = torch.Generator().manual_seed(1)
    vocab, error, caught, parted = 64, 0.05, 0, 0
    for _ in range(2_000):
        exact = torch.randn(vocab, generator=gen, dtype=torch.float64)
        plain = int((exact + _noise(gen, vocab, error)).argmax())
        speculative = int((exact + _noise(gen, vocab, 1.0 + 2.0 * torch.rand(1, generator=gen).item())).argmax())
        if plain != speculative:
            parted += 1
            p = parting(0, plain, speculative, exact + _noise(gen, vocab, error), exact)
            assert p.explained == (abs(p.reference_gap) <= p.bound)
            caught += not p.explained
    assert parted > 1000 and caught / parted > 0.9


def test_the_report_row_says_which_tokens_parted_and_why():
    own = torch.tensor([0.0, 2.0, 1.98, -1.0], dtype=torch.bfloat16)  # its own logits, widened exactly below
    reference = torch.tensor([0.0, 2.0, 1.99, -1.0])
    p = parting(7, 1, 2, own.float(), reference)
    assert isinstance(p, Parting) and (p.position, p.plain, p.speculative) == (7, 1, 2)
    row = p.row()
    assert set(row) == {"position", "plain", "speculative", "reference_gap", "dtype_error", "bound", "explained"}
    assert abs(row["reference_gap"] - 0.01) < 1e-6 and row["bound"] == 2 * row["dtype_error"]
    assert row["explained"] is (0.01 <= row["bound"] + 1e-12)
