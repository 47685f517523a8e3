"""A peer outside eagleviz, timed as `bench` times our loop: llama.cpp (llama-cpp-python) on the same GGUF.

    llama-cpp          llama.cpp's plain decoding of the embedded model's GGUF file
    llama-cpp-lookup   the same with llama-cpp-python's prompt-lookup decoding (10 candidate tokens)

Same prompt token ids (our chat template, our tokenizer), the same thread count, prefill included, greedy at
T = 0 (top-k 1) and plain temperature / top-p sampling otherwise; the KV cache is cleared before every run, so
no run reuses another's prefill. llama.cpp computes in its own numerics (Q8 activations, its own sums), so
its tokens are not part of the bench's agreement check. llama-cpp-python is an optional extra, not part of
the set-up: `needs_llama_cpp` says how to install it.
"""

from __future__ import annotations

import time

from eagleviz.config import SamplingConfig
from eagleviz.errors import UserFacingError
from eagleviz.models.loading import EMBEDDED, embedded_gguf_path

METHODS = ("llama-cpp", "llama-cpp-lookup")
INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36'
CONTEXT = 2048  # MT-bench's longest first turn and 128 new tokens fit; with logits_all, 400 MB of scores


def needs_llama_cpp() -> str | None:
    """Why the llama.cpp methods cannot run here (None when they can)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return f"the llama.cpp methods need llama-cpp-python, an optional extra (~10 min to build): {INSTALL}"
    return None


class LlamaCppPeer:
    """One llama.cpp model (plain or with prompt lookup) loaded from `gguf`, run token list in, tokens out."""

    def __init__(self, gguf: str, threads: int, lookup: bool):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None
        # With a draft model llama-cpp-python writes the logits of every evaluated position into its score
        # buffer, which holds only n_batch rows unless logits_all: past ~500 tokens it then fails with "could not
        # broadcast input array" (seen on MT-bench prompt 53)
        self.llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=CONTEXT,
                         draft_model=draft, logits_all=lookup, verbose=False)
        self.eos = self.llm.token_eos()

    def run(self, ids: list[int], sampling: SamplingConfig) -> tuple[list[int], float]:
        """(new token ids, EOS included as ours count it; seconds, prefill included)."""
        greedy = sampling.greedy
        tokens: list[int] = []
        self.llm.reset()
        start = time.perf_counter()
        for token in self.llm.generate(ids, top_k=1 if greedy else 0, top_p=1.0 if greedy else sampling.top_p,
                                       min_p=0.0, temp=0.0 if greedy else sampling.temperature, reset=True):
            tokens.append(token)
            if token == self.eos or len(tokens) >= sampling.max_new_tokens:
                break
        return tokens, time.perf_counter() - start


def make_peers(methods, model: str, threads: int) -> dict[str, LlamaCppPeer]:
    """The peers `methods` name, loaded once for a bench; a method that cannot run here is one line."""
    wanted = [m for m in methods if m in METHODS]
    if not wanted:
        return {}
    why = needs_llama_cpp()
    if why is None and model != EMBEDDED:
        why = f"the llama.cpp methods run the embedded model's GGUF file, not {model!r}"
    if why:
        raise UserFacingError(why)
    gguf = str(embedded_gguf_path())
    return {m: LlamaCppPeer(gguf, threads, lookup=m == "llama-cpp-lookup") for m in wanted}
