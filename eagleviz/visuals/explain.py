"""Plain-language explanations beside each figure, filled with the live numbers of the selected cycle.

Markdown strings only; every number comes from the trace. Token texts are shown in code spans with
whitespace made visible (the same labels as the figures).
"""

from __future__ import annotations

from eagleviz.trace import CycleTrace, RunTrace, summarize
from eagleviz.visuals.draft_tree import counts
from eagleviz.visuals.kv_rewind import kv_counts
from eagleviz.visuals.output_text import readable
from eagleviz.visuals.replay import ReplayResult
from eagleviz.visuals.style import token_label

TOUR = ("1 \u00b7 Draft", "2 \u00b7 Verify", "3 \u00b7 Accept", "4 \u00b7 Rewind")


def tok(text: str) -> str:
    """A token as a Markdown code span."""
    return "`" + token_label(text, 24).replace("`", "\u02cb") + "`"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def tree_text(cycle: CycleTrace, tree_cfg: dict | None = None) -> str:
    c = counts(cycle)
    depth = max((n.depth for n in cycle.nodes), default=0)
    knobs = ""
    if tree_cfg:
        knobs = (f" With steps = {tree_cfg['steps']}, topk = {tree_cfg['topk']}, the draft ran {tree_cfg['steps']} "
                 f"forwards, each expanding the {tree_cfg['topk']} best nodes of the last level.")
    return (f"Starting from the root {tok(cycle.texts[0])} (the last committed token), the draft proposed "
            f"**{c.candidates} candidates** over {depth} levels.{knobs} Reranking by cumulative draft "
            f"probability kept the best **{c.verified}** (closed under ancestors), so the target verifies "
            f"{c.verified + 1} tokens with the root in one forward; {c.pruned} were pruned and never cost the "
            f"target anything. A node's colour is its cumulative draft probability, on the scale above the tree.")


def mask_text(cycle: CycleTrace) -> str:
    T, prefix = cycle.num_tree_tokens, cycle.kv_target.before
    visible = sum(map(sum, cycle.mask))
    deepest = max(cycle.positions) - prefix
    return (f"The {T} tree tokens are checked in **one** target forward. Each row may look at the whole "
            f"{prefix}-token prefix and, inside the tree, only at its ancestors and itself: {visible} of the "
            f"{T * T} tree cells are visible (a row at depth d has d + 1). Positions are prefix + depth "
            f"({prefix} .. {prefix + deepest}), so every branch sees exactly what plain decoding of that branch "
            f"would see, and siblings never see each other.")


def path_text(cycle: CycleTrace) -> str:
    accepted = [cycle.texts[s] for s in cycle.path[1:]]
    rejected = [c for c in cycle.checks if not c.accepted]
    discarded = cycle.num_tree_tokens - len(cycle.path)
    if accepted:
        agreed = (f"The target agreed with **{_plural(len(accepted), 'draft token')}** "
                  f"({' '.join(tok(t) for t in accepted)}), then added the bonus token {tok(cycle.bonus_text)}")
    else:
        agreed = (f"The target rejected every draft child of the root, so this cycle commits only the bonus token "
                  f"{tok(cycle.bonus_text)}")
    source = {"residual": ", drawn from the residual distribution after the rejections",
              "target": ", the target's own choice there"}.get(cycle.bonus_source, "")
    out = f"{agreed}{source}: **{len(accepted) + 1} tokens** committed for one target forward. "
    if rejected:
        out += f"{_plural(len(rejected), 'draft token')} tried and rejected; "
    out += f"{_plural(discarded, 'tree slot')} discarded."
    if any(c.uniform is not None for c in cycle.checks):
        out += (" At T > 0 a draft token x is accepted when a uniform draw u falls below p(x), the target's "
                "probability (renormalised after earlier rejections at that depth): the committed tokens follow "
                "the target's distribution exactly.")
    return out


def kv_text(cycle: CycleTrace) -> str:
    k = kv_counts(cycle)
    S = cycle.kv_target.before
    moved = (f"{_plural(k['moved'], 'slot')} copied down" if k["moved"] else
             "nothing to copy (the accepted path already sits right after the prefix)")
    return (f"Verification wrote {k['tree_slots']} slots ({S} .. {S + k['tree_slots'] - 1}) into the target cache. "
            f"The commit keeps the root and the accepted path, compacted to {S} .. {cycle.kv_target.after - 1}: "
            f"{moved}. The other {k['discarded']} slots are simply forgotten: the cache length drops to "
            f"{cycle.kv_target.after} and the next cycle overwrites them. The draft throws away its "
            f"{k['draft_dropped']} expansion slots: it keeps only positions encoded from target features, and "
            f"encodes the {len(cycle.committed)} committed tokens at the start of the next cycle.")


def replay_text(cycle: CycleTrace, result: ReplayResult | None) -> str:
    if result is None:
        return ("At T = 0 acceptance is a comparison with the target's argmax: nothing random to replay. "
                "Run with a temperature above 0 to see the sampling rule reproduce the target distribution.")
    return (f"The acceptance step at the root was replayed **{result.draws:,} times** from the recorded numbers "
            f"(no model calls): try the draft's children in order, accept x when u < p(x), otherwise remove x "
            f"and renormalise; if all are rejected, draw from the residual. The committed token's frequencies "
            f"(orange) match the target's distribution p (grey): total variation {result.total_variation:.3f}, "
            f"which shrinks like 1/\u221an with more draws. That is why speculative sampling is lossless.")


def prefill_reuse(run: RunTrace) -> str:
    """", N of M prompt tokens from the prefix cache" where the prefill reused the chat template's opening."""
    if not run.prefill_reused:
        return ""
    return f", {run.prefill_reused} of {run.prompt_tokens} prompt tokens from the prefix cache"


# Why a run stopped, in words (the trace's stop reasons are the engine's codes; any other reason is words already).
STOP_WORDS = {"eos": "the model ended its answer", "max_new_tokens": "reached max new tokens ({cap})",
              "context": "the model's context window is full"}


def stop_text(run: RunTrace) -> str:
    cap = run.config.get("sampling", {}).get("max_new_tokens", "?")
    return STOP_WORDS.get(run.stop_reason, run.stop_reason or "stopped").format(cap=cap)


def summary_text(run: RunTrace) -> str:
    s = summarize(run)
    if not run.cycles:
        return (f"**{s['new_tokens']} tokens** in {s['wall_s']:.2f} s ({s['tokens_per_s']:.1f} tokens/s), "
                "plain decoding: one target forward per token.")
    alpha = ", ".join(f"{r['depth'] - 1}-\u03b1 {r['rate']:.2f}" for r in s["acceptance_by_depth"][:4]) or "n/a"
    ph = s["mean_phase_ms"]
    return (f"**\u03c4 = {s['tau']:.2f}** tokens per cycle \u00b7 **{s['tokens_per_s']:.1f} tokens/s** \u00b7 "
            f"{s['new_tokens']} tokens in {s['num_cycles']} cycles, {s['wall_s']:.2f} s (prefill "
            f"{s['prefill_ms']:.0f} ms{prefill_reuse(run)}) \u00b7 {alpha} \u00b7 mean ms per cycle: draft "
            f"{ph['draft']:.0f}, verify "
            f"{ph['verify']:.0f}, accept {ph['accept']:.1f}, rewind {ph['rewind']:.2f} \u00b7 stopped: {stop_text(run)}")


def cycle_caption(run: RunTrace, cycle: CycleTrace) -> str:
    """The cycle in one line: what it committed, and (traces that record it) what the tree expected."""
    committed = "".join(readable(run, i) for i, o in enumerate(run.output) if o.cycle == cycle.index)
    line = (f"**Cycle {cycle.index}** of {len(run.cycles)} (0-based): committed {tok(committed)} = "
            f"{cycle.accept_length} accepted + 1 bonus.")
    if cycle.expected_accept is not None:
        line += f" The tree expected {cycle.expected_accept:.1f} accepted."
    if cycle.decision:
        line += f" Cost-aware tree: {cycle.decision.rstrip('.')}."
    return line


def tour_step(run: RunTrace, cycle: CycleTrace, step: int) -> str:
    """One of the four stops of the guided tour, for the selected cycle."""
    step = step % len(TOUR)
    title = f"### Tour {TOUR[step]} (cycle {cycle.index})\n\n"
    tree_cfg = run.config.get("tree")
    body = [
        "Look at the **draft tree**. " + tree_text(cycle, tree_cfg) + " The draft is cheap: it is one transformer "
        "layer reading the target's own features, so guessing many tokens costs little.",
        "Look at the **attention mask**. " + mask_text(cycle) + " On a memory-bound device a forward over "
        f"{cycle.num_tree_tokens} tokens costs about as much as over one: the weights are read once either way.",
        "Look at the **accepted path**. " + path_text(cycle),
        "Look at the **KV rewind**. " + kv_text(cycle) + " Then the next cycle starts from the bonus token "
        f"{tok(cycle.bonus_text)}.",
    ][step]
    return title + body
