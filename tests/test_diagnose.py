"""eagleviz/perf/diagnose.py: the splits of first-guess acceptance and tau, on hand-made accept lengths and on a
tiny chat model's real runs (both turns, the second after the first answer; a journal that resumes)."""

from __future__ import annotations

import json
from pathlib import Path

from eagleviz.perf import diagnose as dg
from tiny import tiny_engine


def test_first_guess_and_tau_are_counted_over_cycles_and_split_by_where_the_cycle_began():
    runs = [[0, 2, 5, 0], [1]]                       # accept lengths: cycles start at tokens 0, 1, 4, 10 and 0
    assert dg.summary(runs) == {"cycles": 5, "first": 0.6, "tau": 2.6}
    assert dg.summary([[]]) == {"cycles": 0, "first": None, "tau": None}
    long = [[5] * 20]                                # 6 tokens a cycle: starts 0, 6, ..., 114
    split = dg.by_position(long)
    assert list(split) == ["0-15", "16-31", "32-63", "64-"]
    assert [split[k]["cycles"] for k in split] == [3, 3, 5, 9]
    assert dg.by_position(runs)["0-15"] == dg.summary(runs)


def test_both_turns_of_each_question_run_and_an_interrupted_diagnosis_resumes(tmp_path):
    engine = tiny_engine(chat=True)
    engine.target.tokenizer.apply_chat_template = (   # the whole conversation, as a real template renders it
        lambda messages, tokenize=False, add_generation_prompt=True:
        " / ".join(f"{m['role']}: {m['content']}" for m in messages) + " / assistant:")
    questions = [{"question_id": 1, "category": "math", "turns": ["12 34", "56"]},
                 {"question_id": 2, "category": "coding", "turns": ["7 8 9", "1 2"]}]
    ids = dg.conversation_ids(engine, ["12 34", "56"], ["3 4"])
    assert len(ids) > len(engine.encode_prompt("12 34")) + len(engine.encode_prompt("56"))   # the whole conversation
    journal = tmp_path / "d.journal.jsonl"
    calls = []
    real = dg.question

    def counted(engine, turns, tokens):
        calls.append(turns[0])
        if len(calls) == 2:
            raise KeyboardInterrupt                  # stopped during the second question
        return real(engine, turns, tokens)

    dg.question = counted
    try:
        try:
            dg.diagnose(engine, questions, ["1 2 3"], 12, journal, progress=lambda _: None)
        except KeyboardInterrupt:
            pass
        assert len(journal.read_text().splitlines()) == 2          # its header and the first question
        calls.clear()
        dg.question = real
        result = dg.diagnose(engine, questions, ["1 2 3"], 12, journal, progress=lambda _: None)
    finally:
        dg.question = real
    assert not journal.exists()                                      # closed once done
    assert set(result["category"]) == {"coding", "math"} and set(result["turn"]) == {"1", "2"}
    assert all(result["turn"][t]["cycles"] > 0 for t in ("1", "2"))
    assert result["prompts"]["1 2 3"]["cycles"] > 0 and result["tree"] == [5, 1, 6]
    json.dumps(result)


def test_the_committed_extra_prompts_are_the_pages_presets():
    """`assets/bench/diagnose-prompts.jsonl`, which the committed diagnosis ran (perf may not import the app):
    the presets' prompts, in their order."""
    from eagleviz.app import presets
    from eagleviz.prompts import load_prompts

    path = Path(__file__).resolve().parents[1] / "assets" / "bench" / "diagnose-prompts.jsonl"
    assert load_prompts(str(path)) == [p.prompt for p in presets.PRESETS]
    result = json.loads((path.parent / "head-diagnosis.json").read_text())
    assert "--prompts assets/bench/diagnose-prompts.jsonl" in result["command"]
    assert list(result["prompts"]) == [p.prompt[:60] for p in presets.PRESETS]
