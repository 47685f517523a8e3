"""A `bench` result as text: the Markdown table the command prints and writes, and the page shows under its
bar chart (`eagleviz.visuals.speed`). Plain strings from the result's JSON: no Plotly, so the command writes
its table on a machine without it.
"""

from __future__ import annotations

from eagleviz.trace import numerics

PLAIN = "plain"                      # the bench's row for eagleviz's own loop without speculation


def against_plain(result: dict) -> dict[str, float] | None:
    """Each method's speed against eagleviz's own plain loop (the same model and code without speculation: what
    EAGLE speeds up): the median of its per-prompt ratios as `bench` records it (`vs_plain`, the statistic the
    README quotes), or, for a result written before `bench` recorded it, its median tokens/s over plain's. None
    when the bench has no plain row, or compares with it already."""
    rows = result["rows"]
    plain = rows.get(PLAIN, {}).get("tokens_per_s", 0) if result["reference"] != PLAIN else 0
    if plain <= 0:
        return None
    return {m: row.get("vs_plain", row["tokens_per_s"] / plain) for m, row in rows.items()}


def plain_interval(row: dict) -> str:
    """" (0.99-1.04)": the 95% bootstrap interval of a row's `vs_plain` over the prompts, where recorded."""
    ci = row.get("vs_plain_ci95")
    return f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""


def markdown_table(result: dict, mismatches: str = "list", vs_plain: bool = False) -> str:
    """The bench table; below it, at T = 0, the greedy outputs that differ from the reference, either each
    one (`mismatches="list"`: method, prompt, first divergent token, the target's top-2 logit gap there) or
    a count per method and the largest gap (`"summary"`). `vs_plain`: a first speedup column against plain
    decoding (`against_plain`), where the bench has it."""
    if mismatches not in ("list", "summary"):
        raise ValueError(f"mismatches must be 'list' or 'summary', got {mismatches!r}")
    ratios = against_plain(result) if vs_plain else None
    first = "| vs plain decoding " if ratios else ""
    lines = [f"| method | tokens/s (median) {first}| speedup vs {result['reference']} | tau | "
             "draft / verify ms per cycle |", "|---|---:|" + ("---:|" if ratios else "") + "---:|---:|---|"]
    for m, row in result["rows"].items():
        tau = f"{row['tau']:.2f}" if row["tau"] else "-"
        ph = row.get("phase_ms", {})
        phases = f"{ph['draft']:.1f} / {ph['verify']:.1f}" if row["tau"] and {"draft", "verify"} <= ph.keys() else "-"
        ours = f"| {ratios[m]:.2f}x{plain_interval(row)} " if ratios else ""
        lines.append(f"| {m} | {row['tokens_per_s']:.1f} {ours}| {row['speedup']:.2f}x | {tau} | {phases} |")
    if "prefill" in result:
        lines += ["", PREFILL_NOTES[result["prefill"]]]
    if result["sampling"]["temperature"] == 0:
        lines += ["", _mismatch_text(result, mismatches)]
    return "\n".join(lines)


PREFILL_NOTES = {  # the bench's `prefill` (eagleviz.perf.bench.bench)
    "whole": "Every method prefilled each prompt whole (ours too: not after the cached chat opening), prefill "
             "included in the time.",
    "cached opening": "Every method started each prefill after the engine's cached chat opening, prefill included "
                      "in the time."}


HF_METHODS = {"hf-generate", "hf-prompt-lookup"}   # Hugging Face's own numerics, whatever ours are


def _mismatch_text(result: dict, mode: str) -> str:
    mm, ref = result["greedy_mismatches"], result.get("greedy_reference", result["reference"])
    unchecked = result.get("unchecked", [])
    aside = (f" The tokens of {', '.join(unchecked)} (another engine, its own kernels and numerics) are timed, not "
             "compared." if unchecked else "")
    if not mm:
        return f"All greedy methods produced identical tokens on every prompt.{aside}"
    if mode == "list":
        gaps = ", ".join(f"{x['method']}@prompt{x['prompt']}:tok{x['position']} gap {x['top2_gap']:.3g}" for x in mm)
        return (f"{len(mm)} greedy outputs differ from {ref} (first divergence, target top-2 logit gap there): "
                f"{gaps}.{aside}")
    counts: dict[str, int] = {}
    for x in mm:
        counts[x["method"]] = counts.get(x["method"], 0) + 1
    compared = result["prompts"] * (len(result["rows"]) - 1 - len(unchecked))
    per_method = ", ".join(f"{m} {n}" for m, n in counts.items())
    gap = max(x["top2_gap"] for x in mm)
    if set(counts) <= HF_METHODS and result.get("machine", {}).get("weights") == "blocks":
        ours = [m for m in result["rows"] if m not in HF_METHODS and m not in unchecked and m != ref]
        return (f"Every greedy output of ours ({', '.join([ref] + ours)}) is the same, token for token. "
                f"{len(mm)} of Hugging Face's {result['prompts'] * len(counts)} differ from them ({per_method}): "
                "it computes the same weights widened to fp32, with fp32 activations, where ours computes from "
                "the weight blocks with int8 activations; the outputs part where the target's two best logits "
                f"are close (top-2 gap at most {gap:.3g} where each first diverges).{aside}")
    return (f"{len(mm)} of {compared} greedy outputs differ from {ref} ({per_method}). Where each first diverges, "
            f"the target's top-2 logit gap is at most {gap:.3g}: a tie or near-tie, "
            f"which the rounding of a different batch shape can break either way.{aside}")


def dtypes_label(machine: dict) -> str:
    """How the model computed: its weight blocks, or its dtype and the attention's where it differs (keys, values
    and attention in fp32 for a bf16 model on a CPU whose bf16 attention is slower,
    `eagleviz.models.layers.attention_dtype`)."""
    dtype, kv = machine.get("dtype", "?"), machine.get("kv_dtype")
    if machine.get("weights") == "blocks":
        return f"{numerics(machine['weights'], dtype)} (Q4_1/Q8_0, int8 activations)"
    return dtype if kv in (None, dtype) else f"{dtype} (attention in {kv})"
