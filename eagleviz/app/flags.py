"""The current knobs as launch commands for SGLang and vLLM, to take a tuned setting to a real server.

SGLang's EAGLE worker has the same three tree knobs (its names are ours). vLLM's EAGLE proposer drafts a
chain of `num_speculative_tokens` tokens, so only `steps` carries over there. Sampling settings are
per-request parameters on both servers, not launch flags.

What does not carry over is said in comments, never dropped silently: a cost-aware tree (both servers verify
a fixed one, so the knobs are given as that fixed tree, the upper bounds eagleviz prunes from), and the draft
source (prompt lookup alone is SGLang's NGRAM algorithm and vLLM's `ngram` method; neither server mixes
lookup candidates into an EAGLE tree). A head that is a folder on this server is named, never its path: the
commands take a Hub id or a path on the machine that runs them.
"""

from __future__ import annotations

import json
import re

from eagleviz.config import SamplingConfig, TreeConfig

HEAD_PLACEHOLDER = "<path or Hub id of a trained EAGLE head>"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_id(head: str | None, exists=lambda path: False) -> str | None:
    """`head` when it reads as a Hub id ("owner/name") and is no folder here (`exists`), else None."""
    return head if head and _HUB_ID.fullmatch(head) and not exists(head) else None


def sglang_command(model: str, head: str, tree: TreeConfig, arch: str = "eagle1") -> str:
    if tree.source == "lookup":
        return " \\\n  ".join(["python -m sglang.launch_server", f"--model-path {model}",
                               "--speculative-algorithm NGRAM", f"--speculative-num-draft-tokens {tree.draft_tokens}"])
    algorithm = "EAGLE3" if arch == "eagle3" else "EAGLE"
    return " \\\n  ".join([
        "python -m sglang.launch_server", f"--model-path {model}", f"--speculative-algorithm {algorithm}",
        f"--speculative-draft-model-path {head}", f"--speculative-num-steps {tree.steps}",
        f"--speculative-eagle-topk {tree.topk}", f"--speculative-num-draft-tokens {tree.draft_tokens}"])


def vllm_command(model: str, head: str, tree: TreeConfig, arch: str = "eagle1") -> str:
    if tree.source == "lookup":
        spec = {"method": "ngram", "num_speculative_tokens": tree.steps, "prompt_lookup_max": tree.steps}
    else:
        method = "eagle3" if arch == "eagle3" else "eagle"
        spec = {"method": method, "model": head, "num_speculative_tokens": tree.steps}
    return f"vllm serve {model} \\\n  --speculative-config '{json.dumps(spec)}'"


def _notes(tree: TreeConfig, head_name: str) -> list[str]:
    """Comment lines for what the commands cannot say: the cost-aware tree, a mixed draft source, the head."""
    notes = []
    if tree.adaptive:
        notes.append(f"# Cost-aware tree here: {tree.steps} / {tree.topk} / {tree.draft_tokens} are upper bounds, "
                     "each cycle verifying what pays on this machine. SGLang and vLLM verify a fixed tree: "
                     "below, those bounds as a fixed tree.")
    if tree.source == "eagle+lookup":
        notes.append("# Draft source here: the EAGLE head and prompt lookup together. Neither server mixes lookup "
                     "candidates into an EAGLE tree: below, the head alone (draft source 'prompt lookup' gives "
                     "their n-gram commands).")
    elif tree.source == "lookup":
        notes.append("# Draft source: prompt lookup alone, no head (SGLang's NGRAM algorithm, vLLM's ngram method).")
    if head_name and tree.source != "lookup":
        notes.append(f"# Draft head: this server's {head_name}, a folder here; give its path on your machine or "
                     "a Hub id.")
    return notes


def launch_flags(model: str, head: str | None, tree: TreeConfig, sampling: SamplingConfig, arch: str = "eagle1",
                 head_name: str = "") -> str:
    """Both commands as one shell snippet, with the knobs that do not map explained in comments. `head`: a Hub
    id, or None (a placeholder); `head_name`: the name of a head that is a folder on this server."""
    head = head or HEAD_PLACEHOLDER
    request = (f"temperature={sampling.temperature:g}, top_p={sampling.top_p:g}, "
               f"max_tokens={sampling.max_new_tokens}, seed={sampling.seed}")
    chain = ("a chain of steps = {} draft tokens (topk and draft_tokens have no launch flag there)" if
             tree.source != "lookup" else "up to steps = {} tokens copied from the context")
    return "\n".join([
        *_notes(tree, head_name),
        "# SGLang: the same three tree knobs" if tree.source != "lookup" else "# SGLang: prompt lookup (n-grams)",
        sglang_command(model, head, tree, arch), "",
        f"# vLLM: {chain.format(tree.steps)}",
        vllm_command(model, head, tree, arch), "",
        f"# Sampling is set per request on both servers: {request}"])
