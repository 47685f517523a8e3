"""Two settings compared (eagleviz/visuals/compare.py): tokens per cycle (SGLang's accept len), vLLM's acceptance
histogram and acceptance rate per position, counted from hand-made traces and checked against numbers worked out
by hand; then the page's Compare handler (eagleviz/app/handlers.py) on a tiny random engine."""

from __future__ import annotations

import pytest

from eagleviz.app.handlers import Handlers, StopRequest
from eagleviz.app.session import EngineHub
from eagleviz.app.ui import as_pairs
from eagleviz.visuals import compare
from tiny import tiny_engine
from trace_factory import synthetic_cycle, synthetic_run


def run_of(accepts: list[int], draft_tokens: int = 8, wall_s: float = 0.5, temperature: float = 0.0):
    """A run whose cycles accept these many draft tokens, each tree 3 levels deep (draft_tokens 8: a tree of
    steps 3, topk 2 reaching depth 3; 6: depth 2)."""
    run = synthetic_run([synthetic_cycle(i, draft_tokens=draft_tokens, accept=a)
                         for i, a in enumerate(accepts)], temperature=temperature)
    run.wall_s = wall_s
    return run


def test_stats_count_what_each_cycle_accepted():
    # accept lengths 0, 2, 1, 2, 3: tokens per cycle 1, 3, 2, 3, 4
    s = compare.setting_stats(run_of([0, 2, 1, 2, 3], wall_s=0.4), "A")
    assert s.cycles == 5
    assert s.histogram == [1, 1, 2, 1]                   # cycles committing 1, 2, 3, 4 tokens
    assert s.tau == pytest.approx(13 / 5)  # (1 + 3 + 2 + 3 + 4) / 5 = tau
    assert s.tau == pytest.approx(s_tau(run_of([0, 2, 1, 2, 3])))
    # position k accepted in the cycles with accept length >= k: 4, 3 and 1 of 5
    assert s.per_position == pytest.approx([4 / 5, 3 / 5, 1 / 5])
    assert s.tokens == 1 + 13                            # the prefill's token, then each cycle's commits
    assert s.tokens_per_s == pytest.approx(14 / 0.4)
    assert s.setting == "tree 3 / 2 / 6 (steps / topk / draft tokens), fixed, EAGLE head, T = 0"


def s_tau(run) -> float:
    return run.summary()["tau"]


def test_positions_reach_the_deepest_verified_draft_token_even_where_none_was_accepted():
    # trees 2 levels deep (draft_tokens 6), no cycle accepts anything: both positions at 0
    s = compare.setting_stats(run_of([0, 0], draft_tokens=6), "B")
    assert s.histogram == [2] and s.per_position == [0.0, 0.0]
    assert s.tau == 1.0


def test_an_empty_run_draws_placeholders_not_errors():
    empty = synthetic_run([])
    s = compare.setting_stats(empty, "A")
    assert s.cycles == 0 and s.histogram == [0] and s.per_position == [] and s.tau == 0.0
    assert compare.histogram_figure([s, s]).data == ()
    assert compare.positions_figure([s, s]).data == ()


def test_the_figures_carry_both_settings_numbers():
    a, b = run_of([0, 2, 1, 2, 3]), run_of([1, 1, 0, 0], draft_tokens=6, temperature=0.7)
    stats = compare.compare_stats(a, b)
    hist = compare.histogram_figure(stats)
    assert [t.name for t in hist.data] == ["A", "B"]
    assert list(hist.data[0].x) == [1, 2, 3, 4] and list(hist.data[1].x) == [1, 2, 3, 4]
    assert list(hist.data[0].customdata) == [1, 1, 2, 1] and list(hist.data[1].customdata) == [2, 2, 0, 0]
    assert list(hist.data[1].y) == pytest.approx([0.5, 0.5, 0.0, 0.0])   # shares of B's 4 cycles
    pos = compare.positions_figure(stats)
    assert [t.name for t in pos.data] == ["A", "B"]
    assert list(pos.data[0].y) == pytest.approx([0.8, 0.6, 0.2]) and list(pos.data[1].y) == pytest.approx([0.5, 0])
    assert pos.data[0].line.dash != pos.data[1].line.dash                 # not told apart by colour alone
    assert stats[1].setting.endswith("T = 0.7")


def test_the_table_gives_speed_and_counts_and_the_words():
    a, b = run_of([0, 2, 1, 2, 3], wall_s=0.4), run_of([1, 1, 0, 0], draft_tokens=6, wall_s=2.0)
    text = compare.compare_table(compare.compare_stats(a, b))
    assert "| | A | B |" in text
    assert "| tokens/s | 35.0 | 3.5 |" in text           # 14 tokens / 0.4 s; 7 tokens / 2 s
    assert "| \u03c4, tokens per cycle | 2.60 | 1.50 |" in text  # 13 / 5 per cycle; (2 + 2 + 1 + 1) / 4
    assert "| cycles | 5 | 4 |" in text and "| tokens | 14 | 7 |" in text
    assert "B decodes at 0.10x A's speed" in text
    for words in ("Tokens per cycle", "SGLang", "Acceptance histogram", "Acceptance rate per position", "vLLM"):
        assert words in text


def test_accept_length_means_the_draft_tokens_accepted_everywhere_and_tokens_per_cycle_counts_the_bonus():
    """One meaning of accept length on the page: the draft tokens a cycle accepted (the per-cycle chart, the
    glossary). What a cycle commits with its bonus token, the histogram's and the table's count, is called
    tokens per cycle (its mean is tau)."""
    from eagleviz.app import glossary

    stats = compare.compare_stats(run_of([0, 2, 1]), run_of([1, 1]))
    axis = compare.histogram_figure(stats).layout.xaxis.title.text
    assert "tokens per cycle" in axis and "accept length" not in axis.lower()
    rows = [line for line in compare.compare_table(stats).splitlines() if line.startswith("| ")]
    assert not any("accept length" in row.lower() for row in rows) and any("tokens per cycle" in r for r in rows)
    assert "accept length plus the bonus" not in compare.WORDS and "its accept length (draft tokens accepted)" \
        in compare.WORDS
    tau = next(t for t in glossary.TERMS if t.anchor == "g-tau").meaning
    assert "how many drafted tokens the target kept in one cycle" in tau and "never accept length" in tau


# ------------------------------------------------------------------ the page's handler

KNOBS = (4, 4, 16, 0.0, 1.0, 12, 0, "auto", False, "eagle")   # A: a fixed tree, the head only
B_CHAIN = (3, 1, 4, 0.0, False, "eagle")                       # B: a chain


@pytest.fixture(scope="module")
def handlers():
    return Handlers(as_pairs(EngineHub(tiny_engine("llama", vocab=8), model_id="tiny", head_path=None)))


def test_compare_runs_both_settings_on_the_prompt(handlers):
    text, hist, pos = handlers.compare(StopRequest(), None, "a prompt", *KNOBS, *B_CHAIN)
    assert "**A**: tree 4 / 4 / 16 (steps / topk / draft tokens), fixed, EAGLE head, T = 0" in text
    assert "**B**: tree 3 / 1 / 4 (steps / topk / draft tokens), fixed, EAGLE head, T = 0" in text
    assert [t.name for t in hist.data] == ["A", "B"] and [t.name for t in pos.data] == ["A", "B"]
    assert len(pos.data[1].x) == 3                                # a chain of 3 draft tokens: 3 positions
    assert f"| cycles | {sum(hist.data[0].customdata)} | {sum(hist.data[1].customdata)} |" in text


def test_compare_takes_turns_at_running_a_first(handlers, monkeypatch):
    """A first run pays the warm-up: one Compare runs A then B, the next B then A; the table keeps A and B."""
    import eagleviz.app.handlers as module

    order, real = [], module.generate
    monkeypatch.setattr(module, "generate", lambda hub, prompt, knobs, *rest: order.append(knobs.topk)
                        or real(hub, prompt, knobs, *rest))
    handlers.compares = 0
    texts = [handlers.compare(StopRequest(), None, "a prompt", *KNOBS, *B_CHAIN)[0] for _ in range(2)]
    assert order == [4, 1, 1, 4]  # A's topk 4, B's 1
    assert all(t.index("**A**") < t.index("**B**") for t in texts)


def test_compare_is_refused_while_a_run_is_going_and_when_b_is_a(handlers):
    text, hist, pos = handlers.compare(StopRequest(running=True), None, "a prompt", *KNOBS, *B_CHAIN)
    assert "still going" in text and "|" not in text
    text, _, _ = handlers.compare(StopRequest(), None, "a prompt", *KNOBS, 4, 4, 16, 0.0, False, "eagle")
    assert "same as A" in text


def test_compare_keeps_to_the_servers_limits(handlers):
    too_long = (*KNOBS[:5], 600, *KNOBS[6:])       # the server takes 512 at most
    text, _, _ = handlers.compare(StopRequest(), None, "a prompt", *too_long, *B_CHAIN)
    assert text.startswith("\u26a0") and "limit" in text
    text, _, _ = handlers.compare(StopRequest(), None, "", *KNOBS, *B_CHAIN)
    assert text.startswith("\u26a0") and "empty" in text
