"""The current knobs as launch commands for SGLang and vLLM, to take a tuned setting to a real server.

SGLang's EAGLE worker has the same three tree knobs (its names are ours). vLLM's EAGLE proposer drafts a
chain of `num_speculative_tokens` tokens, so only `steps` carries over there. Sampling settings are
per-request parameters on both servers, not launch flags.
"""

from __future__ import annotations

import json

from eagleviz.config import SamplingConfig, TreeConfig

HEAD_PLACEHOLDER = "<path or Hub id of a trained EAGLE head>"


def sglang_command(model: str, head: str, tree: TreeConfig, arch: str = "eagle1") -> str:
    algorithm = "EAGLE3" if arch == "eagle3" else "EAGLE"
    return " \\\n  ".join([
        "python -m sglang.launch_server", f"--model-path {model}", f"--speculative-algorithm {algorithm}",
        f"--speculative-draft-model-path {head}", f"--speculative-num-steps {tree.steps}",
        f"--speculative-eagle-topk {tree.topk}", f"--speculative-num-draft-tokens {tree.draft_tokens}"])


def vllm_command(model: str, head: str, tree: TreeConfig, arch: str = "eagle1") -> str:
    spec = {"method": "eagle3" if arch == "eagle3" else "eagle", "model": head, "num_speculative_tokens": tree.steps}
    return f"vllm serve {model} \\\n  --speculative-config '{json.dumps(spec)}'"


def launch_flags(model: str, head: str | None, tree: TreeConfig, sampling: SamplingConfig, arch: str = "eagle1") -> str:
    """Both commands as one shell snippet, with the knobs that do not map explained in comments."""
    head = head or HEAD_PLACEHOLDER
    request = (f"temperature={sampling.temperature:g}, top_p={sampling.top_p:g}, "
               f"max_tokens={sampling.max_new_tokens}, seed={sampling.seed}")
    return "\n".join([
        "# SGLang: the same three tree knobs",
        sglang_command(model, head, tree, arch), "",
        f"# vLLM: a chain of steps = {tree.steps} draft tokens (topk and draft_tokens have no launch flag there)",
        vllm_command(model, head, tree, arch), "",
        f"# Sampling is set per request on both servers: {request}"])
