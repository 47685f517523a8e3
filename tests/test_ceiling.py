"""eagleviz/perf/ceiling.py on a tiny random engine: the perfect drafter's chains are accepted whole and every
method's output is plain decoding's; the result is kept where the page looks first; a drafter that proposes
other tokens than the target's is caught; sampling is refused."""

from __future__ import annotations

import json

import pytest

from eagleviz import errors, measured
from eagleviz.decoding.lookup import Foresight
from eagleviz.perf import ceiling


def _prompts(folder):
    path = folder / "prompts.txt"
    path.write_text("abc\nhello there\n")
    return str(path)


def test_ceiling_writes_its_table_and_keeps_the_latest_for_the_app(tiny_cli, capsys):
    out = tiny_cli / "out"
    argv = ["--prompts", _prompts(tiny_cli), "--max-new-tokens", "9", "--chains", "3", "1", "--out", str(out)]
    assert ceiling.ceiling_main(argv) == 0  # not published: the page keeps what it showed
    assert "not published" in capsys.readouterr().out
    assert measured.latest_ceiling() is None or measured.latest_ceiling().shipped
    assert ceiling.ceiling_main(argv + ["--publish"]) == 0
    result = json.loads((out / "ceiling-T0.json").read_text())
    rows = result["rows"]
    assert list(rows) == ["plain", "foresight-1", "foresight-3", "eagle-chain-1", "eagle-chain-3", "eagle"]
    assert result["chains"] == [1, 3] and result["prompts"] == 2 and result["target"] == 1.5
    for k in (1, 3):  # all accepted: k + 1 tokens a cycle, but for a run's last cycle, cut short by its end
        assert k + 1 >= rows[f"foresight-{k}"]["tau"] > k
        assert rows[f"foresight-{k}"]["tau"] >= rows[f"eagle-chain-{k}"]["tau"]
    assert rows["plain"]["tau"] == 1.0 and rows["plain"]["cycle_steps"] == pytest.approx(1.0)
    assert all(r["tau_needed"] == pytest.approx(1.5 * r["cycle_steps"]) for r in rows.values())
    assert (out / "ceiling-T0.md").read_text().startswith("| method |")
    found = measured.latest_ceiling()
    assert found is not None and not found.shipped and found.data == result
    assert str(found.path) in capsys.readouterr().out


def test_a_chain_cut_short_before_the_last_cycle_is_caught_whatever_the_cycle_count(tiny_cli, monkeypatch):
    """5 tokens after the first, chains of 2: cycles committing 2 then 3 tokens fit in the 2 cycles a whole
    chain needs, yet the first rejected a token."""
    class ShortFirst(Foresight):
        def match(self, length, min_ngram=1):
            m = super().match(length, min_ngram)
            if m is None or len(self.tokens) - self.start != 1 or len(m.tokens) < 2:
                return m
            return type(m)((m.tokens[0], (m.tokens[1] + 1) % 8), m.ngram)  # the first cycle's second guess wrong

    monkeypatch.setattr(ceiling, "Foresight", ShortFirst)
    monkeypatch.setattr(ceiling, "batch_invariant", lambda engine: True)
    with pytest.raises(errors.UserFacingError, match="rejected a token plain decoding chose"):
        ceiling.ceiling_main(["--prompts", _prompts(tiny_cli), "--max-new-tokens", "6", "--chains", "2",
                              "--out", str(tiny_cli / "out")])


class _WrongAfterTwo(Foresight):
    """Knows the answer but proposes a wrong third token: a chain no target accepts whole."""

    def match(self, length, min_ngram=1):
        m = super().match(length, min_ngram)
        if m is None or len(m.tokens) < 3:
            return m
        return type(m)(m.tokens[:2] + ((m.tokens[2] + 1) % 8,) + m.tokens[3:], m.ngram)


def test_a_rejected_perfect_guess_is_an_error_where_logits_do_not_depend_on_the_batch(tiny_cli, monkeypatch):
    monkeypatch.setattr(ceiling, "Foresight", _WrongAfterTwo)
    monkeypatch.setattr(ceiling, "batch_invariant", lambda engine: True)
    with pytest.raises(errors.UserFacingError, match="rejected a token plain decoding chose"):
        ceiling.ceiling_main(["--prompts", _prompts(tiny_cli), "--max-new-tokens", "9", "--chains", "4",
                              "--out", str(tiny_cli / "out")])


def test_elsewhere_rejections_and_divergences_are_counted(tiny_cli, monkeypatch):
    monkeypatch.setattr(ceiling, "Foresight", _WrongAfterTwo)
    out = tiny_cli / "out"
    assert ceiling.ceiling_main(["--prompts", _prompts(tiny_cli), "--max-new-tokens", "9", "--chains", "4",
                                 "--out", str(out)]) == 0
    result = json.loads((out / "ceiling-T0.json").read_text())
    assert result["batch_invariant"] is False  # the tiny engine's dense fp32 products
    rows = result["rows"]
    assert rows["foresight-4"]["flipped"] == 2 and rows["foresight-4"]["tau"] < 5  # each prompt counted once
    assert all(r["flipped"] == 0 for m, r in rows.items() if m != "foresight-4")  # outputs stay plain decoding's


def test_sampling_and_impossible_chains_are_refused_before_loading_anything(tiny_cli):
    with pytest.raises(errors.UserFacingError, match="measured greedily"):
        ceiling.ceiling_main(["--temperature", "1"])
    with pytest.raises(errors.UserFacingError, match="lengths from 1 to 16"):
        ceiling.ceiling_main(["--chains", "2", "17"])


def test_without_a_draft_head_the_ceiling_is_measured_alone(tiny_cli, monkeypatch):
    import eagleviz.decoding.load as loading
    from tiny import tiny_engine

    def headless(*args, **kwargs):
        engine = tiny_engine("llama", vocab=8)
        engine.head = None
        return engine

    monkeypatch.setattr(loading, "load_engine", headless)
    out = tiny_cli / "out"
    assert ceiling.ceiling_main(["--prompts", _prompts(tiny_cli), "--max-new-tokens", "6", "--chains", "2",
                                 "--out", str(out)]) == 0
    assert list(json.loads((out / "ceiling-T0.json").read_text())["rows"]) == ["plain", "foresight-2"]
