"""eagleviz/visuals/speed.py: the bench table and bar chart, the verification cost curve, and the section that
holds them, drawn from `bench` / `tune` results as they come back from JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagleviz.measured import SHIPPED_DIR, Measured
from eagleviz.visuals.speed import (NO_BENCH, NO_CEILING, NO_CURVE, NO_CURVE_FIGURE, bench_caption, bench_figure,
                                    ceiling_figure, ceiling_text, chain_acceptance, markdown_table, speed_view,
                                    verify_cost_figure)

BENCH = json.loads((SHIPPED_DIR / "bench-T0.json").read_text())
CURVE = {"prefix": 200, "ms": {1: 34.0, 2: 34.5, 4: 35.2, 8: 38.0, 16: 40.0, 32: 45.0, 64: 54.0}}
CURVE["relative"] = {n: ms / CURVE["ms"][1] for n, ms in CURVE["ms"].items()}


def round_trip(d: dict) -> dict:
    return json.loads(json.dumps(d))


def words(text: str) -> str:
    """Plotly text as read: lines joined by a space, the font spans dropped."""
    return re.sub(r"<[^>]+>", "", text.replace("<br>", " "))


def by_name(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def test_bench_figure_has_one_bar_per_method_labelled_with_its_speedup():
    fig = bench_figure(BENCH)
    (bar,) = fig.data
    assert list(bar.x) == list(BENCH["rows"])
    assert list(bar.y) == [r["tokens_per_s"] for r in BENCH["rows"].values()]
    assert list(bar.text) == [f"{r['speedup']:.2f}x" for r in BENCH["rows"].values()]
    colour = dict(zip(bar.x, bar.marker.color))                  # peers, our plain loop and EAGLE told apart
    assert len({colour["hf-generate"], colour["plain"], colour["eagle-tree"]}) == 3
    assert all(colour[m] == colour["hf-generate"] for m in colour if not m.startswith(("eagle", "plain")))
    assert f"{BENCH['prompts']} prompts" in fig.layout.title.text and "weight blocks" in fig.layout.title.text
    assert fig.layout.yaxis.range[1] > max(bar.y)                 # room for the labels above the bars


def test_the_page_states_the_readmes_statistic_against_plain_decoding():
    """"vs plain decoding" on the page is the median over prompts of each method's per-prompt ratio to plain decoding,
    with its interval, as `bench` records it and the README quotes it (not the ratio of the median tokens/s, a
    different number for the same run); a result written before `bench` recorded it falls back to that ratio."""
    rows = BENCH["rows"]
    table = markdown_table(BENCH, mismatches="summary", vs_plain=True)
    eagle = next(line for line in table.splitlines() if line.startswith("| eagle-tree |"))
    lo, hi = rows["eagle-tree"]["vs_plain_ci95"]
    assert f"| {rows['eagle-tree']['vs_plain']:.2f}x ({lo:.2f}-{hi:.2f}) |" in eagle
    bar = bench_figure(BENCH, vs_plain=True).data[0]
    assert list(bar.text) == [f"{r['vs_plain']:.2f}x" for r in rows.values()]
    older = round_trip(BENCH)
    for row in older["rows"].values():
        del row["vs_plain"], row["vs_plain_ci95"]
    ratio = rows["eagle-tree"]["tokens_per_s"] / rows["plain"]["tokens_per_s"]
    assert f"| {ratio:.2f}x |" in next(line for line in markdown_table(older, vs_plain=True).splitlines()
                                        if line.startswith("| eagle-tree |"))


def test_a_peer_engines_tokens_are_timed_not_counted_among_ours():
    """llama.cpp runs its own kernels: the shipped bench times it but never compares its tokens, and the text
    says so instead of listing it among our identical outputs."""
    assert BENCH["unchecked"] == ["llama-cpp"] and "llama-cpp" in BENCH["rows"]
    for mode in ("summary", "list"):
        text = markdown_table(BENCH, mismatches=mode).split("\n\n")[-1]
        assert text.endswith("The tokens of llama-cpp (another engine, its own kernels and numerics) are timed, "
                             "not compared.")
        assert "llama-cpp" not in text.split("The tokens of")[0]


def test_curve_from_json_string_keys_equals_curve_from_int_keys():
    from_json = verify_cost_figure(round_trip(CURVE))
    direct = verify_cost_figure(CURVE)
    assert from_json.to_json() == direct.to_json()


def test_curve_is_sorted_by_n_and_framed_by_the_ideal_and_n_forwards():
    shuffled = {"prefix": 200, "ms": {"16": 40.0, "1": 34.0, "2": 34.5}, "relative": {"2": 1.01, "16": 1.18, "1": 1.0}}
    fig = verify_cost_figure(shuffled)
    measured = by_name(fig, "measured: one forward of n tokens")
    assert list(measured.x) == [1, 2, 16] and list(measured.y) == [1.0, 1.01, 1.18]
    assert list(measured.customdata) == [34.0, 34.5, 40.0]      # the hover shows milliseconds
    assert "ms" in measured.hovertemplate
    assert list(by_name(fig, "ideal: n tokens for the price of 1").y) == [1, 1, 1]
    separate = by_name(fig, "n separate forwards (cost n)")
    assert list(separate.y) == list(separate.x) == [1, 2, 16]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8, 16, 32]
    title = words(fig.layout.title.text)
    assert title.startswith("One forward verifies 16 tokens for the price of 1.2 ")  # the curve's own number
    assert "n = 16 costs 1.18x" in title


def test_no_curve_says_so():
    fig = verify_cost_figure(None)
    assert not fig.data and NO_CURVE_FIGURE in words(fig.layout.annotations[0].text)
    assert "python -m eagleviz tune" in NO_CURVE and "measure this machine" in NO_CURVE


MISMATCHES = [{"method": m, "prompt": i, "position": 3 + i, "top2_gap": 0.125 * (i % 3)}
              for m in ("plain", "eagle-tree") for i in range(20)]   # bf16 near-ties against hf-generate
DENSE = dict(BENCH, machine=dict(BENCH["machine"], dtype="bfloat16", weights="dense"), greedy_mismatches=MISMATCHES,
             reference="hf-generate", greedy_reference="hf-generate")


def test_table_lists_every_mismatch_or_summarises_them():
    full = markdown_table(DENSE)
    short = markdown_table(DENSE, mismatches="summary")
    mm = DENSE["greedy_mismatches"]
    assert full.count("@prompt") == len(mm)
    assert "@prompt" not in short and len(short) < len(full) / 2
    checked = len(DENSE["rows"]) - 1 - len(DENSE["unchecked"])     # a peer engine's tokens are not compared
    assert f"{len(mm)} of {DENSE['prompts'] * checked} greedy outputs differ" in short
    assert "a tie or near-tie" in short
    assert f"at most {max(x['top2_gap'] for x in mm):.3g}" in short
    for method in {x["method"] for x in mm}:
        assert f"{method} {sum(x['method'] == method for x in mm)}" in short
    assert full.splitlines()[:7] == short.splitlines()[:7]         # the same table above
    tree = BENCH["rows"]["eagle-tree"]
    assert (f"| eagle-tree | {tree['tokens_per_s']:.1f} | {tree['speedup']:.2f}x | {tree['tau']:.2f} | "
            f"{tree['phase_ms']['draft']:.1f} / {tree['phase_ms']['verify']:.1f} |") in short
    with pytest.raises(ValueError):
        markdown_table(BENCH, mismatches="some")


def test_from_weight_blocks_hugging_faces_differences_are_put_down_to_its_numerics():
    """From blocks our methods are checked against our plain loop; Hugging Face, computing widened weights
    with fp32 activations, may part from them, and the summary says why rather than blaming a batch shape."""
    hf = [{"method": "hf-generate", "prompt": i, "position": 5, "top2_gap": 0.25 * i} for i in range(3)]
    blocks = dict(BENCH, machine=dict(BENCH["machine"], weights="blocks"), greedy_mismatches=hf,
                  reference="hf-generate", greedy_reference="plain")
    text = markdown_table(blocks, mismatches="summary")
    assert "Every greedy output of ours (plain, " in text and "token for token" in text
    assert "3 of Hugging Face's" in text and "int8 activations" in text and "at most 0.5" in text
    assert "batch shape" not in text
    ours_too = dict(blocks, greedy_mismatches=hf + [{"method": "eagle-tree", "prompt": 1, "position": 7,
                                                        "top2_gap": 0.0}])
    assert "differ from plain (hf-generate 3, eagle-tree 1)" in markdown_table(ours_too, mismatches="summary")


def test_table_without_mismatches_and_at_t1():
    clean = dict(BENCH, greedy_mismatches=[])
    assert "identical tokens on every prompt" in markdown_table(clean, mismatches="summary")
    sampled = dict(BENCH, sampling=dict(BENCH["sampling"], temperature=1.0))
    assert "differ" not in markdown_table(sampled, mismatches="summary")


def test_caption_names_machine_prompts_command_and_source():
    text = bench_caption(BENCH, "shipped with eagleviz")
    for part in (f"{BENCH['prompts']} prompts", "2 threads", "tree 5/4/16", BENCH["command"], "shipped with eagleviz"):
        assert part in text
    assert "Command" not in bench_caption({k: v for k, v in BENCH.items() if k != "command"}, "x")
    machine = {k: v for k, v in BENCH["machine"].items() if k not in ("kv_dtype", "weights")}
    dense = machine | {"dtype": "bfloat16"}
    for kv, said in ((None, "bfloat16 on"), ("bfloat16", "bfloat16 on"),
                     ("float32", "bfloat16 (attention in float32) on")):
        mc = dense | ({"kv_dtype": kv} if kv else {})
        assert said in bench_caption(dict(BENCH, machine=mc), "x")  # older results have no kv_dtype
        assert said in bench_caption(dict(BENCH, machine=mc | {"weights": "dense"}), "x")
    blocks = machine | {"dtype": "float32", "kv_dtype": "float32", "weights": "blocks"}
    said = bench_caption(dict(BENCH, machine=blocks), "x")
    assert "weight blocks (Q4_1/Q8_0, int8 activations) on" in said and "float32" not in said
    sampled = dict(BENCH, sampling=dict(BENCH["sampling"], temperature=1.0))
    for source, said in ((None, "(found by tune)"), ("tuned.json", "(found by tune at T = 0)"),
                         ("tuned-T1.json", "(found by tune at T = 1)")):
        tuned = {"steps": 2, "topk": 1, "draft_tokens": 3} | ({"source": source} if source else {})
        assert f"eagle-tuned 2/1/3 {said}" in bench_caption(dict(sampled, tuned_tree=tuned), "x")


def test_speed_view_holds_each_temperature_then_the_curve():
    shipped = Measured(BENCH, SHIPPED_DIR / "bench-T0.json", True)
    mine = Measured(dict(BENCH, sampling=dict(BENCH["sampling"], temperature=1.0)), Path("/c/bench-T1.json"), False)
    curve = Measured({"verify_cost": round_trip(CURVE), "machine": BENCH["machine"]}, Path("/c/tuned.json"), False)
    view = speed_view([shipped, None, mine], curve)
    assert [p.text.splitlines()[0] for p in view.benches] == ["#### Greedy decoding (T = 0)", "#### Sampling (T = 1)"]
    assert "Run `python -m eagleviz bench` to measure this machine" in view.benches[0].text
    assert "measure this machine" not in view.benches[1].text and "measured on this machine" in view.benches[1].text
    assert "@prompt" not in view.benches[0].text
    assert len(view.curve.data) == 3 and "weight blocks" in view.curve_text and "/c/tuned.json" in view.curve_text
    empty = speed_view([None, None], None)
    assert empty.benches[0].text == NO_BENCH and empty.curve_text == NO_CURVE and not empty.curve.data


def test_the_curve_says_what_bounds_it():
    """Reading the weights where 16 tokens cost at most twice one (bf16 on a CPU, a GPU); arithmetic where they
    cost more (int8 products from weight blocks: about 4x); the measured points after it, in words."""
    flat = verify_cost_figure(CURVE).layout.title.text
    steep = dict(CURVE, ms={n: 6.0 * (1 + 0.2 * (n - 1)) for n in CURVE["ms"]})
    steep["relative"] = {n: ms / steep["ms"][1] for n, ms in steep["ms"].items()}
    text = verify_cost_figure(steep).layout.title.text
    assert "reading the weights dominates" in flat and "arithmetic" not in flat
    assert "arithmetic catches up" in text and "reading the weights" not in text
    assert "measured: n = 16 costs 4.00x" in text and ":," not in text


CEILING = json.loads((SHIPPED_DIR / "ceiling-T0.json").read_text())


def test_ceiling_figure_pairs_each_chain_perfect_and_drafted_with_plain_and_the_default_as_lines():
    fig = ceiling_figure(round_trip(CEILING))
    perfect, drafted = by_name(fig, "every guess right (the ceiling)"), by_name(fig, "the head's guesses")
    chains = [f"chain of {k}" for k in CEILING["chains"]]
    assert list(perfect.x) == chains and list(drafted.x) == chains
    assert list(perfect.y) == [CEILING["rows"][f"foresight-{k}"]["speedup"] for k in CEILING["chains"]]
    assert list(drafted.text) == [f"{CEILING['rows'][f'eagle-chain-{k}']['speedup']:.2f}x" for k in CEILING["chains"]]
    default = CEILING["rows"]["eagle"]["speedup"]
    assert list(by_name(fig, "plain decoding: 1.00x").y) == [1.0, 1.0]
    assert list(by_name(fig, f"the default tree: {default:.2f}x").y) == [default, default]
    best = max(CEILING["rows"][f"foresight-{k}"]["speedup"] for k in CEILING["chains"])
    assert f"Guesses always right: up to {best:.2f}x" in words(fig.layout.title.text)


def test_ceiling_text_quotes_the_results_own_numbers_and_its_source():
    rows = CEILING["rows"]
    text = ceiling_text(Measured(CEILING, SHIPPED_DIR / "ceiling-T0.json", shipped=True))
    assert f"**{rows['foresight-1']['speedup']:.2f}x** with a chain of 1" in text
    assert f"accepted {rows['eagle-chain-1']['tau'] - 1:.0%} of the time" in text
    assert f"\u03c4 = {rows['eagle']['tau_needed']:.2f}" in text
    assert "shipped with eagleviz" in text and "python -m eagleviz ceiling" in text
    assert "do not depend on the tree" in text  # measured from weight blocks: batch invariant
    assert ceiling_text(None) == NO_CEILING
    empty = ceiling_figure(None)  # a placeholder that says so, not an error
    assert not empty.data and "No ceiling measured yet" in empty.layout.annotations[0].text


def test_chain_acceptance_inverts_a_chains_expected_length():
    assert chain_acceptance(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    assert chain_acceptance(4.0, 3) == pytest.approx(1.0)
    assert chain_acceptance(1.75, 2) == pytest.approx(0.5)  # 1 + 0.5 + 0.25
    assert chain_acceptance(2.1, 1) is None  # a chain of 1 commits at most 2 tokens


def test_ceiling_text_says_when_near_ties_flipped():
    rows = {m: dict(r, flipped=0) for m, r in CEILING["rows"].items()}
    rows["foresight-1"]["flipped"], rows["eagle"]["flipped"] = 3, 2
    flipped = dict(CEILING, rows=rows, batch_invariant=False)
    text = ceiling_text(Measured(flipped, SHIPPED_DIR / "x.json", shipped=False, modified=0))
    assert f"In up to 3 of the {CEILING['prompts']} prompts" in text and "every perfect guess" not in text
    rows["foresight-1"]["flipped"] = rows["eagle"]["flipped"] = 0
    text = ceiling_text(Measured(flipped, SHIPPED_DIR / "x.json", shipped=False, modified=0))
    assert "every perfect guess was accepted." in text and "do not depend" not in text  # no claim it cannot make


def test_ceiling_figure_without_a_head_and_with_a_default_above_every_chain():
    rows = {m: r for m, r in CEILING["rows"].items() if not m.startswith("eagle-chain")}
    rows["eagle"] = dict(rows["eagle"], speedup=9.0)
    fig = ceiling_figure(round_trip(dict(CEILING, rows=rows)))
    assert [t.name for t in fig.data][0] == "every guess right (the ceiling)"
    assert "the head's guesses" not in [t.name for t in fig.data]
    assert fig.layout.yaxis.range[1] > 9.0
