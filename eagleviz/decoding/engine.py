"""The speculative decoding loop, as a generator of `CycleTrace`s.

State of a run (batch size 1):
    S         committed length: tokens whose keys/values are in the target cache (and in the draft's stable
              cache); the root token at position S is known but not yet in either cache
    pending   target features of the positions the draft has not encoded yet, with their paired tokens
              (draft position p pairs the target feature at p with the token at p + 1)

Each cycle:
    1) draft   encode `pending` into the draft's stable cache; grow the tree level by level (each level's
               frontier attends to the prefix and its own ancestors); rerank to the verification budget
    2) verify  one target forward over the tree tokens with tree attention, positions S + depth
    3) accept  greedy matching, or multi-round speculative sampling (lossless)
    4) rewind  target: compact the accepted path's slots to [S, S + accept_length]; draft: drop the
               expansion slots (EAGLE's stable-KV rule: the draft cache only holds positions encoded from
               target features)
The accepted path's target features and the bonus token become the next cycle's `pending`. In the code a cycle
is its phases, each a method over the run's state (`_Speculation`): `_plan` (does the head draft, do the lookups
look), then `_resting` (a stretch of cycles that verify the root alone, as plain decoding's steps) or `_drafted`
(`_on_device` or `_on_host` for phases 1-3, `_rewound` for 4 and the trace, `_keep_books` for the next cycle's
inputs and the run's ledgers).

How the target's steps run is the engine's `decode` path (`decode_path`): on a CPU the forward over a run's
own cache (eager), the host drafting level by level; on a GPU the target's steps over a static state replayed
from CUDA graphs (`eagleviz.models.static`), and the head's every level drafted in one captured call
(`eagleviz.decoding.device_draft`). There the host waits for the device once a plain step, and once a drafted
cycle without a lookup's chain to merge, fixed or cost-aware, greedy or sampled: its choice of verified nodes (a
cost-aware tree's from the price list and calibration the host writes to the device:
`eagleviz.decoding.device_policy`), verification, walk (sampled: with the cycle's uniforms, drawn at its launch)
and commit run after the drafting as one more captured function (`eagleviz.decoding.device_cycle`); a cycle with
a lookup's chain waits for the drafting's tokens and scores, then for the verdict (and, sampled, once a node on
its walk).
Inputs go to the device without blocking and phases are timed by CUDA events (`eagleviz.models.host`).
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from eagleviz.config import SamplingConfig, TreeConfig, kv_slots
from eagleviz.errors import UserFacingError
from eagleviz.models.host import PhaseClock, count_read, to_device, to_host
from eagleviz.models.kv_cache import KVCache
from eagleviz.models.draft import DraftHead
from eagleviz.models.static import (BUCKETS, CudaGraphs, EagerSteps, FedAhead, StatePool, StaticSteps, StepOutput,
                                    Uncaptured)
from eagleviz.models.target import TargetModel, TargetOutput
from eagleviz.trace import ROOT_TOP, CycleTrace, KVMap, OutputToken, RunTrace, TreeNode
from eagleviz.decoding.calibration import HeadCalibration, RunAcceptance
from eagleviz.decoding.costs import CostModel, Prices, RunCosts
from eagleviz.decoding.device_cycle import DeviceCycle, Launched, fits
from eagleviz.decoding.device_draft import DeviceDrafter
from eagleviz.decoding.device_policy import PolicyBlock
from eagleviz.decoding.drafting import ROOT_ALONE, Draft, causal, grow, lookup_worth
from eagleviz.decoding.lookup import Foresight, Match, SuffixIndex
from eagleviz.decoding.once import Once
from eagleviz.decoding.policy import HeadRest, Ledger, TreePolicy
from eagleviz.decoding.prefix import Prefix, PrefixCache, Prompt, PromptCache, chat_prefix
from eagleviz.decoding.steps import (decode_path, draft_state, prepared, release, static_states, target_steps,
                                     zero_gpu)
from eagleviz.decoding.tree import Candidates, VerifyTree
from eagleviz.decoding.verify import (FedDraw, VerifyResult, at_temperature, cycle_uniforms, draw, draw_and_top,
                                      draw_index, drawn, greedy_verify, sample_verify, sampling_probs, top_tokens,
                                      uniform)
from eagleviz.paths import cache_dir
from kernels import capability, sample_ops
from kernels.self_check import AttentionChoice, KernelCheck, choose_attention
from kernels.tree_attention import resolve_impl

PHASES = ("draft", "verify", "accept", "rewind")
REFERENCE_NOTE = ("The head rests this cycle to time a plain step here: the head's cycles are judged against it "
                  "(tokens per millisecond).")
LOOKUP_REST_NOTE = ("The context's lookups rest too: their recent cycles took longer than their tokens are worth "
                    "here.")
LOOKUP_DOUBT_NOTE = ("The context's lookups rest too (at T > 0 a run starts without them and looks up again once a "
                     "probe pays).")


def lookup_passed(match: Match) -> str:
    """A resting cycle's sentence on the lookup continuation it did not verify."""
    n = len(match.tokens)
    return (f"The context's lookup proposed {n} token{'s' if n > 1 else ''} (after a {match.ngram}-token match): "
            "on their own not expected to beat a plain step.")


ROOT_MASK = torch.ones(1, 1, dtype=torch.bool)  # a tree of the root alone: it sees itself (the forward needs none)
CHAR_TOKENS = 4  # the most tokens one character's UTF-8 bytes span (`_TokenText.piece`)
FED_AHEAD = 4  # greedy plain steps launched ahead of the host's reads over a queued device (`Engine._fed_back`)
REST_BATCH = 16  # the most resting cycles run as one stretch of plain steps (`Engine._rest_steps`)


class RestStep(NamedTuple):
    """What one resting cycle's plain step read (`Engine._rest_steps`), for its trace and the run's books."""

    root: int
    S: int
    bonus: int
    top: int                 # the target's argmax
    top_prob: float | None   # its probability (None: greedy, not computed)
    clock: PhaseClock        # the cycle's phases
    start: float             # perf_counter at the cycle's start and after its read
    end: float
    features: torch.Tensor | None  # the step's features row (the head's input)
    captured: bool           # the step captured a graph (its time is the capture's: the ledgers leave it out)


@dataclass
class _Speculation:
    """One speculative run between its cycles (`Engine._speculate`): what it runs with, and its state: the features
    and tokens the head has not encoded yet, the next root, the policy as the run's clock and its own acceptance
    move it, the rests and ledgers that decide whether the head and the context's lookups run, a device cycle
    launched ahead. A cycle's phases read and write it; nothing else does."""

    tree: TreeConfig
    sampling: SamplingConfig
    run: RunTrace
    record: bool
    steps: EagerSteps | StaticSteps
    dcache: KVCache | DeviceDrafter | None
    capacity: int  # the run's slots (a static state may hold more)
    start: float
    rest_batch: int
    use_head: bool
    gen: torch.Generator
    text: Callable[[int], str]
    captures: bool  # whether a cycle can capture a graph (a static state: `prepared` can grow)
    on_device: DeviceCycle | None
    feats: list[torch.Tensor]  # the features of the positions the head has not encoded yet, in pieces
    pend_tokens: list[int]     # ... and their tokens
    root: int
    index: SuffixIndex | Foresight | None  # the context's lookups
    policy: TreePolicy | None
    learned: RunAcceptance | None
    clocked: RunCosts | None
    ledger: Ledger | None
    lookups: Ledger | None
    rest: HeadRest = field(default_factory=HeadRest)
    lookup_rest: HeadRest = field(default_factory=HeadRest)
    lookup_probe: bool = False  # the next lookup cycle after a rest is a probe
    cycle: int = 0
    done: bool = False
    queued: Launched | None = None  # a device cycle launched while the one before was traced
    worth: dict[tuple[int, int, int], bool] = field(default_factory=dict)  # `lookup_worth` by (n-gram, tokens,
    # budget), under this policy

    def worthy(self, match: Match, budget: int) -> bool:
        """Whether a cycle without the head would verify any of the match's tokens (`drafting.lookup_worth`)."""
        key = (match.ngram, len(match.tokens), budget)
        if key not in self.worth:
            self.worth[key] = lookup_worth(self.policy, match, budget)
        return self.worth[key]

    def reprice(self, policy: TreePolicy) -> None:
        """The policy the next cycles choose by (the run's clock or its own acceptance changed it)."""
        self.policy = policy
        self.worth.clear()


@dataclass(frozen=True)
class _Plan:
    """What a cycle after S committed tokens runs (`Engine._plan`): its clock, its budget, whether it times a plain
    step (`reference`), whether the lookups rest, the match it verifies or passed over, whether the head drafts
    and first encodes a backlog."""

    S: int
    clock: PhaseClock
    began: float  # perf_counter at its start
    ready: int    # the graphs captured before it (`prepared`)
    budget: int
    reference: bool
    resting_lookups: bool
    match: Match | None
    passed: Match | None
    run_head: bool
    backlog: bool


@dataclass(frozen=True)
class _Verified:
    """A drafted cycle's draft, verification and acceptance, on the device or the host: the host's step outputs
    (`out`), or a device cycle's moves, accepted rows and draft-cache length as its read left them."""

    draft: Draft
    result: VerifyResult
    argmax: list[int]
    target_probs: list
    root_top: list
    alone: bool                      # the root alone was verified
    mask: torch.Tensor | None        # the tree's (None: not recorded)
    clock: PhaseClock
    forecast_paid: bool = True       # whether the head's guesses were worth verifying (the rest's rule)
    out: StepOutput | None = None
    moves: list | None = None
    features: torch.Tensor | None = None
    draft_length: int | None = None


class _TokenText:
    """Decoded text of single tokens: the whole vocabulary decoded in one batch call when the engine is made
    (~0.3 s for SmolLM2's 49,152 tokens; a token's text does not depend on its run). A sampled cycle names
    the target's 64 most likely tokens at the root: one list lookup each, where a memo filled as runs went
    decoded the tokens new to it one by one inside the cycle."""

    def __init__(self, tokenizer, size: int):
        self._tok = tokenizer
        batch = getattr(tokenizer, "batch_decode", None)
        ids = [[i] for i in range(size)]
        self._texts = batch(ids) if batch is not None else [tokenizer.decode(i) for i in ids]

    def __call__(self, token: int) -> str:
        texts = self._texts
        return texts[token] if 0 <= token < len(texts) else self._tok.decode([token])

    def many(self, tokens: list[int]) -> list[str]:
        texts, n = self._texts, len(self._texts)
        return [texts[t] if 0 <= t < n else self._tok.decode([t]) for t in tokens]

    def piece(self, held: list[int], token: int) -> str | None:
        """What committing `token` adds to the output's text, after the `held` tokens before it whose bytes began a
        character they did not finish (a byte-level tokenizer splits an emoji or a CJK character over up to
        four tokens, each decoded alone as U+FFFD): "" while the character is still unfinished (it waits for the
        next token, at most CHAR_TOKENS in all), the decoded group once it is, None for a token whose own text
        is already whole (nothing held)."""
        if not held and "\ufffd" not in self(token):
            return None
        group = [*held, token]
        joined = self._tok.decode(group)
        return "" if joined.endswith("\ufffd") and len(group) < CHAR_TOKENS else joined


class _Untold:
    """The text of a run that is not recorded: none."""

    def __call__(self, token: int) -> str:
        return ""

    @staticmethod
    def piece(held: list[int], token: int) -> None:
        return None


def runnable_impl(attn_impl: str, device: torch.device | str) -> str:
    """The attention implementation `attn_impl` resolves to on `device` ('auto': Triton on CUDA), or a
    ValueError saying why it cannot run there (Triton without a GPU runs only in its interpreter)."""
    device = torch.device(device)
    impl = resolve_impl(attn_impl, device)
    if impl == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the Triton kernel needs a CUDA GPU. On a CPU, set TRITON_INTERPRET=1 to run it in "
                         "Triton's interpreter (slow, for demonstration), or choose attention 'torch' or 'auto'")
    return impl


class Engine:
    """Target + draft head, shared read-only by every run; each run owns its caches and RNG.

    The engine drafts with a frozen copy of `head` (`DraftHead.for_drafting`): linears packed where that pays
    (`eagleviz.models.dense`; `pack` False keeps them unpacked, the reference of an A/B run), projections
    fused, and the target's compiled layer operations when it has them (`TargetModel.ops`); beside a target
    that computes from its file's blocks, the head's products from Q8_0 blocks too (`TargetModel.block_ops`).

    attn_impl 'auto' on CUDA takes the Triton kernel only once it has passed its self-check against PyTorch
    attention (`kernels.self_check`; `kernel_check` replaces that check); a fallback is explained in `notes`,
    which every run's trace carries.

    A cost-aware tree (`TreeConfig.adaptive`) prices its choices with `costs` (what verification and drafting
    cost here, `eagleviz.decoding.costs`; default: a flat, GPU-like list; a `Prices` holder is asked for its
    list by the first run of a cost-aware tree, before that run's clock starts) and values its nodes with
    `calibration` (the head's, `eagleviz.decoding.calibration`; default: EAGLE-2's assumption), which each run
    corrects by the acceptance it observes as it goes (`RunAcceptance`; `learn` False keeps the table as it is,
    the reference of an A/B run), and whose drafted cycles the run's own clock judges against a resting one
    (`Ledger`: a head whose cycles take longer than their tokens are worth rests, and so do the context's
    lookups) and whose price list it corrects by what its own phases take (`RunCosts`); `ledger` False judges
    by the forecast alone, on the list as it is, the reference of an A/B run. A resting cycle (the
    root alone) is a plain step through plain decoding's own calls, its trace written from what they read.
    `eagleviz.decoding.load.load_engine` gives both: this machine's measured costs and the head's file.

    Every prefill starts from the chat template's opening encoded once (`eagleviz.decoding.prefix`;
    `prefix_cache` False encodes each prompt whole, the reference of an A/B run); `with_prompt_cache` keeps the
    last few prompts whole, so that a prompt run again on a CPU skips its prefill (the app's engine does).

    On a CPU the target's distribution is read in C where it can be compiled (`kernels.sample_ops`: argmax,
    the most likely tokens, the draw; the same tokens for the same seed); `compiled_sampling` False keeps
    PyTorch's operations, the reference of an A/B run.

    Over static steps (a GPU) a greedy drafted cycle (a fixed or a cost-aware tree's, no lookup chain) is chosen,
    verified and walked on the device and read once (`eagleviz.decoding.device_cycle`); `device_cycle` False
    chooses and walks on the host, reading the drafting and the verdict apart, the reference of an A/B run."""

    def __init__(self, target: TargetModel, head: DraftHead | None, head_name: str = "", attn_impl: str = "auto",
                 pack: bool | None = None,
                 kernel_check: Callable[[torch.device, torch.dtype], KernelCheck] | None = None,
                 costs: CostModel | Prices | None = None, calibration: HeadCalibration | None = None,
                 prefix_cache: bool = True, compiled_sampling: bool = True, learn: bool = True,
                 decode: str = "auto", ledger: bool = True, device_cycle: bool = True):
        self.target, self.head_name = target, head_name
        self.learn, self.ledger, self.device_cycle = learn, ledger, device_cycle
        self.head = None if head is None else head.for_drafting(pack, target.ops, target.block_ops,
                                                                 target.activations == "int8", target.layer_kernels)
        self.prices = costs if isinstance(costs, Prices) else Prices(costs or CostModel.flat())
        self.calibration = calibration or HeadCalibration.identity()
        self._kernel_check = kernel_check
        self._choice = self._attention(attn_impl)
        self.decode, self._decode_notes = decode_path(decode, target.device)
        # static states lent to runs and kept between them (graphs are captured once per state and bucket)
        self.pool = StatePool()
        arch = head.config.arch if head is not None else "eagle1"
        self.feature_layers = target.eagle3_layers if arch == "eagle3" else None
        self.prefix = PrefixCache(chat_prefix(self.encode_prompt) if prefix_cache and self.uses_chat() else ())
        self.prompts = PromptCache()  # whole prompts kept: none unless asked (`with_prompt_cache`)
        self._text = _TokenText(target.tokenizer, target.vocab_size)
        self.sample_ops = (sample_ops.load(cache_dir() / "kernels")
                           if compiled_sampling and target.device.type == "cpu" else None)

    def _attention(self, attn_impl: str) -> Once[AttentionChoice]:
        """The attention `attn_impl` chooses here (a ValueError now where it cannot run on this device). `auto` on
        CUDA runs the Triton kernel's self-check: now, except on a ZeroGPU Space, where no GPU exists before a
        run's `spaces.GPU` call: there the first run that attends makes the choice, inside its call."""
        device = self.target.device
        runnable_impl(attn_impl, device)

        def choose() -> AttentionChoice:
            return choose_attention(attn_impl, device, self.target.kv_dtype, self._kernel_check)

        later = attn_impl == "auto" and device.type == "cuda" and zero_gpu()
        return Once(obtain=choose) if later else Once(choose())

    @property
    def attn_impl(self) -> str:
        """The attention implementation the engine's runs attend with (chosen at the first run's need on ZeroGPU)."""
        return self._choice.get().impl

    @property
    def notes(self) -> list[str]:
        """What a run's trace says of how this engine runs: the attention's fallback, if any, and the decode path."""
        return list(self._choice.get().notes) + self._decode_notes

    def with_attention(self, attn_impl: str) -> Engine:
        """The same target and drafting head (shared, not copied) with another attention implementation; a
        ValueError where it cannot run on this device."""
        other = copy.copy(self)
        other._choice = self._attention(attn_impl)
        return other

    def with_decode(self, decode: str) -> Engine:
        """The same target and drafting head (shared) with its steps run another way (`decode_path`), and a
        pool of its own; a ValueError where that path cannot run on this device."""
        other = copy.copy(self)
        other.decode, other._decode_notes = decode_path(decode, self.target.device)
        other.pool = StatePool()
        return other

    def with_device_cycle(self, on: bool) -> Engine:
        """The same engine (target, head and pool shared) with a greedy drafted cycle decided on the device (`on`)
        or on the host, the reference of an A/B run."""
        other = copy.copy(self)
        other.device_cycle = on
        return other

    def with_prompt_cache(self, entries: int) -> Engine:
        """The same engine (target, head and pool shared) keeping the `entries` most recently prefilled prompts whole
        (`eagleviz.decoding.prefix.PromptCache`): a prompt run again, on a CPU, skips its prefill, with the same
        tokens bit for bit. 0 keeps none (the default: a benchmark's repeated prompts are prefilled each time)."""
        other = copy.copy(self)
        other.prompts = PromptCache(entries)
        return other

    def with_ledger(self, on: bool) -> Engine:
        """The same engine (target, head and pool shared) whose cost-aware runs keep their books by the clock
        (`on`: a head that does not pay rests) or keep none (the head drafts every cycle: what a count of drafted
        cycles or a comparison of two paths' choices needs)."""
        other = copy.copy(self)
        other.ledger = on
        return other

    @property
    def queued(self) -> bool:
        """Whether a step returns before its kernels finish (CUDA): then a run launches its next step before it
        yields the last (`_plain`, `_rest_steps`)."""
        return self.target.device.type == "cuda"

    def make_graphs(self) -> CudaGraphs | Uncaptured:
        """The capture a new static state uses: CUDA graphs on the 'graphs' path, else none."""
        return CudaGraphs(self.target.device) if self.decode == "graphs" else Uncaptured()

    @torch.inference_mode()
    def prepare(self, slots: int, tree: TreeConfig | None = None, sampling: SamplingConfig | None = None) -> int:
        """Capture now, before any timed run, every graph a run of at most `slots` target slots replays (plain
        decoding's, and given `tree` its drafting's and its drafted cycle's verification: greedy, or walking at
        `sampling`'s temperature and nucleus, which its capture freezes, as it does the draw of a sampled plain
        step fed back on the device), rather than at each one's first use
        inside a run; the states go back to the pool, where the runs lease them. Returns how many were captured
        (0 on the eager path, which captures none)."""
        if self.decode == "eager":
            return 0
        use_head = tree is not None and tree.source != "lookup" and self.head is not None
        plain = target_steps(self, slots, None)
        steps = (target_steps(self, slots, self.feature_layers) if use_head and self.feature_layers is not None
                 else plain)  # an EAGLE-3 head's runs read the target's features of three layers: a state of their own
        dcache = draft_state(self, steps.capacity, tree) if use_head else None
        states = [plain] + ([steps] if steps is not plain else []) + ([dcache] if dcache is not None else [])
        try:
            before = prepared(*states)
            draw = None if sampling is None or sampling.greedy else FedDraw(sampling.temperature, sampling.top_p)
            for state in states[:-1] if dcache is not None else states:
                state.prepare(draw)
            if dcache is not None:
                outputs = dcache.prepare()
                DeviceCycle(steps, dcache, tree, costed=tree.adaptive, sampling=sampling).prepare(outputs)
            return prepared(*states) - before
        finally:
            release(self, None, *states)

    @property
    def costs(self) -> CostModel:
        """The price list of the engine's cost-aware trees (measured now if its `prices` wait to be)."""
        return self.prices.get()

    def with_policy(self, costs: CostModel | Prices | None = None,
                    calibration: HeadCalibration | None = None) -> Engine:
        """The same engine pricing and valuing its cost-aware trees with these (None: keep the current)."""
        other = copy.copy(self)
        if costs is not None:
            other.prices = costs if isinstance(costs, Prices) else Prices(costs)
        other.calibration = calibration or self.calibration
        return other

    def policy(self, tree: TreeConfig, sampling: SamplingConfig, at_once: bool = False) -> TreePolicy | None:
        """The cost-aware policy for a run (None for SGLang's fixed tree); `at_once`: its head drafts every level
        in one call (a `DeviceDrafter`), so every level kept is priced as all of them (`CostModel.drafting_at_once`)."""
        if not tree.adaptive:
            return None
        costs = self.costs.at(sampling.temperature)
        return TreePolicy(costs.drafting_at_once(tree.steps) if at_once else costs,
                          self.calibration.at(sampling.temperature))

    def kv_bytes(self, n_prompt: int, tree: TreeConfig | None, sampling: SamplingConfig) -> int:
        """Bytes of the KV caches a run of this request allocates: the target's, and with a tree the draft's."""
        t = self.target
        capacity = kv_slots(n_prompt, sampling.max_new_tokens, tree)
        need = KVCache.bytes_for(t.num_layers, t.num_kv_heads, capacity, t.head_dim, t.kv_dtype)
        if tree is not None and self.head is not None:
            c = self.head.config
            need += KVCache.bytes_for(len(self.head.blocks), c.num_kv_heads, capacity + tree.draft_expansion,
                                      c.head_dim, t.kv_dtype)
        return need

    # ------------------------------------------------------------------ set-up
    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        if not prompt or not prompt.strip():
            raise UserFacingError("the prompt is empty")
        tok = self.target.tokenizer
        if self.uses_chat(chat):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            return tok(text, add_special_tokens=False)["input_ids"]
        return tok(prompt)["input_ids"]

    def uses_chat(self, chat: bool = True) -> bool:
        """Whether `encode_prompt(prompt, chat)` renders the prompt through the chat template."""
        return bool(chat and self.target.tokenizer.chat_template)

    def machine(self) -> str:
        """Where this engine's runs are timed, as their traces record it: the GPU's name, or the CPU's description
        (`kernels.capability`) and torch's thread count. Timings divide only between runs with the same."""
        dev = self.target.device
        if dev.type == "cuda":
            return torch.cuda.get_device_name(dev)
        return f"{capability.detect().describe()}, {torch.get_num_threads()} thread(s)"

    def new_run(self, prompt: str, prompt_ids: list[int], tree: TreeConfig | None, sampling: SamplingConfig,
                chat: bool = True) -> RunTrace:
        config = {"sampling": vars(sampling).copy(), "speculative": tree is not None}
        if tree is not None:
            config["tree"] = {"steps": tree.steps, "topk": tree.topk, "draft_tokens": tree.draft_tokens,
                              "adaptive": tree.adaptive, "source": tree.source,
                              "adjustments": list(tree.adjustments)}
        return RunTrace(prompt=prompt, prompt_tokens=len(prompt_ids), config=config, seed=sampling.seed,
                        device=str(self.target.device), dtype=str(self.target.dtype).removeprefix("torch."),
                        attn_impl=self.attn_impl, model=self.target.name,
                        head=self.head_name if tree is not None else "",
                        kv_dtype=str(self.target.kv_dtype).removeprefix("torch."),
                        cpu_layer="compiled" if self.target.ops is not None else "torch",
                        weights=self.target.weights, chat=self.uses_chat(chat),
                        machine=self.machine(), notes=list(self.notes), decode=self.decode)

    def _capacity(self, n_prompt: int, sampling: SamplingConfig, tree: TreeConfig | None) -> int:
        limit = self.target.max_positions
        if n_prompt + 1 >= limit:
            raise UserFacingError(f"the prompt has {n_prompt} tokens; the model's context limit is {limit}")
        return min(limit, kv_slots(n_prompt, sampling.max_new_tokens, tree))

    def _prefill(self, ids: list[int], steps: EagerSteps | StaticSteps, sampling: SamplingConfig,
                 gen: torch.Generator, run: RunTrace, features: bool = False):
        """Target forward over the prompt after the chat prefix (copied from the engine's `PrefixCache`):
        returns the first new token and (given `features`) the prompt's features, which the draft head reads.
        Records in `run` how many prompt tokens came from the cache. On the eager path a prompt the engine keeps
        whole (`with_prompt_cache`) runs no forward: its cache, features and first logits are copied. Over static
        steps (a GPU) the rest of the prompt runs as the captured steps of BUCKETS[-1] tokens or fewer, a causal
        chain each (a step of the largest bucket for every full chunk): a few replays, not an eager forward's ~1,000
        launches a chunk."""
        cache, eager = steps.cache, not isinstance(steps, StaticSteps)
        kept = self.prompts.get(self.attn_impl, ids, features) if eager else None
        if kept is not None:  # the whole prompt as a prefill of it left it (`with_prompt_cache`)
            kept.copy_into(cache)
            run.prefill_reused = len(ids)
            return self._choose(kept.logits.clone(), sampling, gen), kept.features.clone() if features else None
        reused = self.prefix.covers(ids)
        prefix = self.prefix.get(self.attn_impl, self._encode_prefix) if reused else None
        if prefix is not None:
            prefix.copy_into(cache)
        run.prefill_reused = reused
        if not eager:
            logits, argmax, rows = self._prefill_steps(ids[reused:], reused, steps, features)
        else:
            x = torch.tensor(ids[reused:], device=self.target.device)
            out = self.target.forward(x, torch.arange(reused, len(ids), device=x.device), cache,
                                      causal(len(ids) - reused, x.device), logit_rows=slice(-1, None),
                                      feature_layers=self.feature_layers if features else None, impl=self.attn_impl)
            logits, argmax, rows = out.logits[0], None, out.features
        feats = rows if prefix is None or not features else torch.cat([prefix.features, rows])
        if eager and self.prompts.entries:
            self.prompts.put(self.attn_impl, ids, Prompt.of(cache, feats if features else None, logits))
        return self._choose(logits, sampling, gen, argmax), feats

    @staticmethod
    def _prefill_steps(ids: list[int], start: int, steps: StaticSteps, features: bool):
        """The prompt's tokens `ids` at positions start, start + 1, ... through the static state's steps, in chunks
        of at most BUCKETS[-1]: the last row's logits and argmax, and (given `features`) every row's features,
        copied (a step's outputs are rewritten by its bucket's next step)."""
        largest, rows = BUCKETS[-1], []
        for at in range(0, len(ids), largest):
            chunk = ids[at:at + largest]
            n = len(chunk)
            out = steps.forward(chunk, list(range(start + at, start + at + n)), causal(n, "cpu") if n > 1 else None)
            if features and out.features is not None:
                rows.append(out.features.clone())
        return out.logits[-1], out.argmax[-1], torch.cat(rows) if rows else None

    def _encode_prefix(self, ids: list[int]) -> Prefix:
        cache = self.target.new_cache(len(ids))
        x = torch.tensor(ids, device=self.target.device)
        out = self.target.forward(x, torch.arange(len(ids), device=x.device), cache, causal(len(ids), x.device),
                                  logit_rows=None, feature_layers=self.feature_layers, impl=self.attn_impl)
        return Prefix(cache.k, cache.v, out.features)

    def _choose(self, logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator,
                argmax: torch.Tensor | None = None) -> int:
        """The next token from one row of logits (V,); greedy, the argmax a captured step computed, if any."""
        return self._read_out(logits, sampling, gen, argmax, top=False)[0]

    def _read_out(self, logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator,
                  argmax: torch.Tensor | None = None, top: bool = True,
                  u: torch.Tensor | None = None) -> tuple[int, int, float]:
        """A plain step's read-out, shared by plain decoding and a cycle that verified the root alone: the token
        (greedy, the argmax; sampled, a draw of the sampling distribution with a uniform from `gen`, or `u`: a
        drafted cycle's, `cycle_uniforms`) and, given `top`, the
        target's argmax and its probability at the temperature (untruncated), which that cycle's trace shows
        (else -1, nan). On a device all of it is read in one copy; on a CPU a sampled step's argmax comes from
        the draw's own C call (`draw_and_top`: the first of equal probabilities)."""
        temp = 1.0 if sampling.greedy else sampling.temperature
        probs = None if sampling.greedy else sampling_probs(logits, temp, sampling.top_p)
        ops = self.sample_ops if logits.is_cpu else None
        if probs is not None and u is None:
            u = uniform(gen, logits.device)
        if ops is not None:  # C passes over host memory, nothing to batch: counted as the one read a device makes
            count_read()
            if probs is not None:  # sampled: the draw; for the trace, the most likely token from the same call
                if not top:
                    return draw(probs, u, ops), -1, math.nan
                token, best, weight = draw_and_top(probs, u, ops)  # nucleus truncation keeps the most likely
                # token; untruncated, its weight is its probability
                prob = weight if sampling.top_p >= 1.0 else ops.prob_at(logits, best, float(logits[best]), temp)
                return token, best, prob
            at = ops.argmax(logits) if argmax is None else ([int(argmax)], [float(logits[int(argmax)])])
            (best,), (value,) = at
            if not top:
                return best, -1, math.nan
            return best, best, ops.prob_at(logits, best, value, temp)  # one pass: no distribution written
        index = (logits.argmax() if argmax is None else argmax).reshape(1)
        reads = [index] if probs is None else [draw_index(probs, u)]
        if top:  # an index tensor: `probs[index]` would read it
            reads += [index, at_temperature(logits, temp, probs, sampling.top_p).gather(0, index)]
        values = to_host(*reads)
        token = values[0][0] if probs is None else drawn(values[0][0], probs)
        return (token, values[1][0], values[2][0]) if top else (token, -1, math.nan)

    @staticmethod
    def _emit(run: RunTrace, tokens: list[tuple[int, str]], cycle: int, eos: frozenset[int], limit: int,
              text) -> bool:
        """Append committed tokens with their provenance; True when a stop condition is reached."""
        for token, source in tokens:
            held = list(itertools.takewhile(lambda t: t.piece == "", reversed(run.output)))[::-1]
            run.output.append(OutputToken(token=token, text=text(token), cycle=cycle, source=source,
                                          piece=text.piece([t.token for t in held], token)))
            if token in eos:
                run.stop_reason = "eos"
                return True
            if len(run.output) >= limit:
                run.stop_reason = "max_new_tokens"
                return True
        return False

    # ------------------------------------------------------------------ plain decoding
    @torch.inference_mode()
    def plain(self, prompt_ids: list[int], sampling: SamplingConfig, run: RunTrace) -> Iterator[OutputToken]:
        """Target-only decoding with the same forward, dtype and sampling; yields each new token."""
        start = time.perf_counter()
        capacity = self._capacity(len(prompt_ids), sampling, None)
        steps = target_steps(self, capacity, None)
        try:
            yield from self._plain(prompt_ids, sampling, run, steps, capacity, start)
        finally:
            release(self, run, steps)
        run.wall_s = time.perf_counter() - start

    def _plain(self, prompt_ids: list[int], sampling: SamplingConfig, run: RunTrace, steps: EagerSteps | StaticSteps,
               capacity: int, start: float) -> Iterator[OutputToken]:
        gen = torch.Generator(device=self.target.device).manual_seed(sampling.seed)
        cache, text, eos, limit = steps.cache, self._text, self.target.eos_token_ids, sampling.max_new_tokens
        token, _ = self._prefill(prompt_ids, steps, sampling, gen, run)
        run.prefill_ms = (time.perf_counter() - start) * 1e3
        done = self._emit(run, [(token, "prefill")], -1, eos, limit, text)

        def step(token: int) -> StepOutput | None:  # the next token's forward; None where the context is full
            if cache.length + 1 >= capacity:
                run.stop_reason = "context"
                return None
            return steps.forward([token], [cache.length], None)

        # where a step returns before its kernels finish (a GPU), the next one is launched before a token is
        # yielded: the caller's work on it runs while the device computes the next; over static steps, several
        # are, each token fed back on the device (`_fed_back`)
        ahead = steps.queued
        if ahead and not done and isinstance(steps, StaticSteps):
            yield from self._fed_back(self._fed_ahead(steps, token, sampling, gen), run, capacity, start, limit)
            return
        out = step(token) if ahead and not done else None
        yield run.output[-1]
        while not done:
            if not ahead:
                out = step(token)
            if out is None:
                break
            # the step's one read: the token chosen
            token = self._choose(out.logits[0], sampling, gen, None if out.argmax is None else out.argmax[0])
            done = self._emit(run, [(token, "target")], -1, eos, limit, text)
            out = step(token) if ahead and not done else None
            run.wall_s = time.perf_counter() - start
            yield run.output[-1]

    @staticmethod
    def _fed_ahead(steps: StaticSteps, token: int, sampling: SamplingConfig, gen: torch.Generator) -> FedAhead:
        """Steps fed back on the device from `token`, FED_AHEAD at most ahead of the host's reads; sampled, each
        drawn on the device as `_read_out` draws (`FedDraw`), its uniform from the run's generator."""
        if sampling.greedy:
            return FedAhead(steps, token, FED_AHEAD)
        dev = steps.target.device
        return FedAhead(steps, token, FED_AHEAD, FedDraw(sampling.temperature, sampling.top_p),
                        lambda out: uniform(gen, dev, out))

    def _fed_back(self, fed: FedAhead, run: RunTrace, capacity: int, start: float,
                  limit: int) -> Iterator[OutputToken]:
        """Plain decoding over queued static steps (a GPU), each token fed back on the device (`FedAhead`): up to
        FED_AHEAD steps are launched before the host reads the first of them, what the host reads of each copied
        to pinned memory as the step ends (`Landing`). The host reads a token once its copy has landed, writes it
        into the run, launches the next step and yields: its work between two tokens (the read, the run's books,
        the caller's) runs while the device computes the steps queued, never between two of them. Steps launched
        past the run's end (an end of sequence read after they were launched) are dropped: their keys lie past the
        committed slots, to which the cache's length is set back (sampled, their uniforms were drawn: the
        generator is not used again). Yields the prefill's token first, once the first steps are launched."""
        left = min(limit - len(run.output), capacity - 1 - fed.committed)  # the steps the run may still take

        def launch() -> None:  # up to FED_AHEAD steps beyond the last token read; none past the context
            while fed.room(left):
                fed.launch()

        try:
            launch()
            yield run.output[-1]
            done = False
            while not done:
                if fed.read == fed.launched:  # nothing launched: the context is full
                    run.stop_reason = "context"
                    break
                done = self._emit(run, [(fed.take()[0], "target")], -1, self.target.eos_token_ids, limit,
                                  self._text)
                if not done:
                    launch()
                run.wall_s = time.perf_counter() - start
                yield run.output[-1]
        finally:
            fed.close()

    # ------------------------------------------------------------------ speculative decoding
    @torch.inference_mode()
    def speculate(self, prompt_ids: list[int], tree_cfg: TreeConfig, sampling: SamplingConfig,
                  run: RunTrace, record: bool = True,
                  index_of: Callable[[list[int]], SuffixIndex | Foresight] = SuffixIndex,
                  rest_batch: int | None = None) -> Iterator[CycleTrace]:
        """EAGLE speculative decoding; fills `run` (output tokens, cycles, timings) and yields each cycle.

        record=False leaves out what only the pictures need (candidate nodes, mask, token texts): it exists
        to measure what tracing costs (`python -m eagleviz bench --ab trace`). index_of makes the run's source
        of lookup candidates from its context (prompt and first token); a `Foresight` proposes a known answer
        (`python -m eagleviz ceiling`). rest_batch: the most resting cycles a run takes as one stretch of plain
        steps (None: REST_BATCH; 1: one cycle a step, as the page, whose runs share the model step by step, takes
        them): on a CPU their forwards back to back before their traces are yielded, on a GPU each cycle's trace
        written and yielded while the next one's step runs."""
        use_head = tree_cfg.source != "lookup"
        if use_head and self.head is None:
            raise UserFacingError("speculative decoding with the EAGLE head needs a draft head (--draft-source "
                                  "lookup needs none)")
        if use_head and tree_cfg.topk > self.head.config.draft_vocab_size:
            raise UserFacingError(f"topk {tree_cfg.topk} is more than the {self.head.config.draft_vocab_size} tokens "
                                  "the head drafts among (--draft-vocab): lower topk or draft among more tokens")
        # a prompt too long is refused first; then a price list still to be measured is measured, not inside the run
        capacity = self._capacity(len(prompt_ids), sampling, tree_cfg)
        if tree_cfg.adaptive:
            self.prices.get()
        start = time.perf_counter()
        steps = target_steps(self, capacity, self.feature_layers if use_head else None)
        dcache = draft_state(self, steps.capacity, tree_cfg) if use_head else None
        try:
            yield from self._speculate(prompt_ids, tree_cfg, sampling, run, record, index_of, steps, dcache, capacity,
                                       start, REST_BATCH if rest_batch is None else rest_batch)
        finally:
            release(self, run, steps, dcache)
        run.wall_s = time.perf_counter() - start

    def _speculate(self, prompt_ids: list[int], tree_cfg: TreeConfig, sampling: SamplingConfig, run: RunTrace,
                   record: bool, index_of, steps: EagerSteps | StaticSteps, dcache: KVCache | DeviceDrafter | None,
                   capacity: int, start: float, rest_batch: int) -> Iterator[CycleTrace]:
        """The run's cycles, each in its phases: the plan (what runs: the head, a lookup's chain, or the root
        alone), then a stretch of resting cycles (`_resting`) or one drafted cycle (`_drafted`: draft, verify,
        accept on the device or the host, rewind, trace, books)."""
        r = self._begin(prompt_ids, tree_cfg, sampling, run, record, index_of, steps, dcache, capacity, start,
                        rest_batch)
        while not r.done:
            S = steps.cache.length
            if capacity - 1 - S < 1:  # the slots plain decoding would still fill: it stops at the same length
                run.stop_reason = "context"
                break
            plan = self._plan(r, S)
            if not plan.run_head and plan.match is None:  # nothing to verify but the root: a plain step
                yield from self._resting(r, plan)
            else:
                yield self._drafted(r, plan)

    def _begin(self, prompt_ids: list[int], tree_cfg: TreeConfig, sampling: SamplingConfig, run: RunTrace,
               record: bool, index_of, steps: EagerSteps | StaticSteps, dcache: KVCache | DeviceDrafter | None,
               capacity: int, start: float, rest_batch: int) -> _Speculation:
        """The prefill, and the run's state before its first cycle: the policy, its books and the rests they
        impose from the start (a sampled run's head and lookups start in doubt)."""
        use_head = tree_cfg.source != "lookup"
        gen = torch.Generator(device=self.target.device).manual_seed(sampling.seed)
        text = self._text if record else _Untold()
        policy = self.policy(tree_cfg, sampling, at_once=isinstance(dcache, DeviceDrafter))
        root, prompt_feats = self._prefill(prompt_ids, steps, sampling, gen, run, use_head)
        run.prefill_ms = (time.perf_counter() - start) * 1e3
        index = index_of(list(prompt_ids) + [root]) if tree_cfg.source != "eagle" else None
        books = self.ledger and policy is not None
        r = _Speculation(
            tree=tree_cfg, sampling=sampling, run=run, record=record, steps=steps, dcache=dcache, capacity=capacity,
            start=start, rest_batch=rest_batch, use_head=use_head, gen=gen, text=text,
            captures=static_states(steps, dcache),  # else no cycle can capture: `prepared` is not asked
            on_device=(DeviceCycle(steps, dcache, tree_cfg, costed=policy is not None, sampling=sampling)
                       if self.device_cycle and isinstance(dcache, DeviceDrafter)
                       and (policy is None or PolicyBlock.holds(policy)) else None),
            feats=[prompt_feats], pend_tokens=list(prompt_ids[1:]) + [root], root=root, index=index, policy=policy,
            learned=RunAcceptance(policy.calibration) if policy is not None and self.learn else None,
            clocked=RunCosts(policy.costs) if books else None,  # its clock: the prices
            # a cost-aware tree rests a head whose drafting keeps not paying for itself, as its clock sees it
            ledger=(Ledger.for_run(sampling.greedy, policy.head_pays(tree_cfg.topk, tree_cfg.steps,
                                                                     tree_cfg.draft_tokens - 1), gpu=self.queued)
                    if use_head and books else None),
            # the context's lookups judged by the same clock: their cycles (the head not run) against resting ones;
            # sampled, in doubt from the start as the head is
            lookups=Ledger.for_run(sampling.greedy, lookups=True) if index is not None and books else None)
        if r.ledger is not None and r.ledger.losing():  # in doubt: the run starts resting
            r.rest.left = r.rest.most = r.ledger.span()
        if r.lookups is not None and r.lookups.losing():
            r.lookup_rest.left = r.lookups.span()
        r.done = self._emit(run, [(root, "prefill")], -1, self.target.eos_token_ids, sampling.max_new_tokens, text)
        return r

    def _plan(self, r: _Speculation, S: int) -> _Plan:
        """Phase 0 of a cycle after S committed tokens: whether the head drafts (not while it rests, nor in a cycle
        that times a plain step), whether the context's lookups look and what they found (near the context limit, a
        tree cut to the room left)."""
        clock = PhaseClock(self.target.device)  # on CUDA: events, read once at the end of the cycle
        began = time.perf_counter()  # the ledger's clock: the whole cycle
        ready = prepared(r.steps, r.dcache) if r.captures else 0
        budget = min(r.tree.draft_tokens, r.capacity - 1 - S)
        # a plain step, timed (not where a cycle was launched ahead: its rest and reference were decided then)
        reference = r.queued is None and r.ledger is not None and r.ledger.wants_reference()
        looks = r.index is not None and budget > 1 and not reference
        resting_lookups = looks and r.lookups is not None and not r.lookup_rest.head_runs()
        r.lookup_probe = r.lookup_probe or resting_lookups
        match = r.index.match(min(r.tree.steps, budget - 1)) if looks and not resting_lookups else None
        run_head = r.use_head and (r.policy is None or r.queued is not None or (not reference and r.rest.head_runs()))
        passed = None
        if match is not None and not run_head and r.policy is not None and not r.worthy(match, budget):
            passed, match = match, None  # its tokens alone not worth verifying: `grow` would verify the root
        return _Plan(S, clock, began, ready, budget, reference, resting_lookups, match, passed, run_head,
                     backlog=run_head and len(r.pend_tokens) > r.tree.steps + 1)  # the head first encodes what it
        # skipped

    def _resting(self, r: _Speculation, p: _Plan) -> Iterator[CycleTrace]:
        """Cycles that verify the root alone: a plain step each, through plain decoding's own calls, and only a plain
        step's bookkeeping. The cycles after the first rest too while the head rests on and the lookups rest or find
        no match worth verifying: up to `rest_batch` of them run as plain decoding's loop. While the lookups look,
        each step's token is indexed and the next cycle's match looked up as that cycle would (`no_lookup`): a
        stretch ends before a cycle whose match is worth verifying, and the cycles that pass one over say so (docs
        entry 43). On a CPU their traces are written after the last, together rather than each after a forward has
        swept the caches (1.000-1.007x one cycle at a time: docs/performance.md entry 40); on a GPU each trace is
        written while the next step runs (`_rest_steps`)."""
        ahead, passes, indexed = 0, [p.passed], [0]
        looking = r.index is not None and not p.resting_lookups
        if r.rest_batch > 1 and not p.reference:
            ahead = min(r.rest.left if r.use_head else r.rest_batch, r.lookup_rest.left if p.resting_lookups else
                        r.rest_batch, r.rest_batch - 1)

        def no_lookup(bonus: int, S: int) -> bool:
            """In a stretch of resting cycles while the lookups look: the stretch's latest token indexed (`indexed`
            counts them), whether the next cycle would rest too (no match worth verifying; one that is not, passed
            over, in `passes`)."""
            r.index.extend([bonus])
            indexed[0] += 1
            budget = min(r.tree.draft_tokens, r.capacity - 1 - S)
            match = r.index.match(min(r.tree.steps, budget - 1)) if budget > 1 else None
            if match is not None and (r.policy is None or r.worthy(match, budget)):
                return False
            passes.append(match)
            return True

        eos, sampling, run = self.target.eos_token_ids, r.sampling, r.run
        rows = self._rest_steps(1 + ahead, p.S, r.root, r.steps, sampling, r.gen, p.clock, p.began, eos,
                                sampling.max_new_tokens - len(run.output), r.capacity - 1,
                                no_lookup if looking and ahead else None)
        together = not r.captures and not r.steps.queued  # a CPU's own path: the forwards back to back, then the
        # traces and the books of all, handed back after the last (not each after whatever the caller ran between
        # two: another model's forward in `bench --lockstep` made each trace cost 5-10x)
        written: list[CycleTrace] = []
        for k, row in enumerate(list(rows) if together else rows):
            if k:  # the counts the skipped decisions would have made
                r.rest.head_runs()
                r.lookup_rest.head_runs()
            passed = passes[k] if k < len(passes) else None
            decision = ROOT_ALONE if r.policy is not None else ""
            if passed is not None:
                decision = f"{lookup_passed(passed)} {decision}"
            if r.use_head:  # the head rests (a fixed tree's head always drafts)
                decision = REFERENCE_NOTE if p.reference else f"{r.rest.note()} {decision}"
            if p.resting_lookups:
                decision = f"{decision} {LOOKUP_DOUBT_NOTE if r.lookups.doubt else LOOKUP_REST_NOTE}".strip()
            trace = self._rest_trace(r.cycle, row, r.dcache.length if r.use_head else row.S, r.text, r.record,
                                     decision, 0 if passed is None else passed.ngram)
            r.root = trace.bonus_token
            if r.use_head:  # the head's cache still waits for this position, encoded when it next runs
                r.feats.append(row.features)
                r.pend_tokens.append(r.root)
            if r.index is not None and k >= indexed[0]:  # (`no_lookup` indexed the stretch's tokens so far)
                r.index.extend(trace.committed)
            run.cycles.append(trace)
            if not row.captured:  # the unit the ledgers judge the others by
                ms = (row.end - row.start) * 1e3
                if r.ledger is not None:
                    r.ledger.observe(ms, 1, False, True)
                if r.lookups is not None:
                    r.lookups.observe(ms, 1, False, True)
                if r.clocked is not None:
                    r.clocked.rest(trace.timings_ms["verify"])
            r.done = self._emit(run, [(r.root, "bonus")], r.cycle, eos, sampling.max_new_tokens, r.text)
            r.cycle += 1
            if together:
                written.append(trace)
                continue
            run.wall_s = time.perf_counter() - r.start
            yield trace
        run.wall_s = time.perf_counter() - r.start
        yield from written

    def _drafted(self, r: _Speculation, p: _Plan) -> CycleTrace:
        """A cycle that verifies a tree (the head's, a lookup's chain, or both): draft, verify and accept on the
        device or the host, then the rewind, the trace and the books."""
        if p.run_head and len(r.feats) > 1:  # the positions a resting head skipped, joined once
            r.feats = [torch.cat(r.feats)]
        device = r.on_device is not None and p.match is None and fits(p.budget)
        if r.queued is not None and not device:
            raise RuntimeError("a cycle launched ahead is not the one this run takes next")
        v = self._on_device(r, p) if device else self._on_host(r, p)
        draft, tree, result = v.draft, v.draft.tree, v.result
        if r.learned is not None and r.learned.observe(
                tree.node_ids[1:], {tree.node_ids[s] for s in result.path}, draft.cands.parents,
                draft.cands.sources, draft.cands.scores, draft.lookup_ngram):
            r.reprice(TreePolicy(r.policy.costs, r.learned.table()))  # the next cycle values its nodes by it
        trace = self._rewound(r, p, v)
        self._keep_books(r, p, v, trace)
        return trace

    def _on_device(self, r: _Speculation, p: _Plan) -> _Verified:
        """Draft, verify and accept chosen, verified and walked on the device, read once (a lookup's chain is merged
        on the host); maybe launched while the last cycle's trace was written. On a GPU, a fixed tree's next cycle
        is launched right after the read."""
        S, on_device = p.S, r.on_device
        launched = r.queued or on_device.launch(r.feats[0], r.pend_tokens, r.root, S, p.budget, p.clock, r.policy,
                                                r.gen)
        if (launched.S, launched.root, launched.draft_tokens) != (S, r.root, p.budget):
            raise RuntimeError(f"a cycle launched ahead at {launched.S} is not the cycle at {S}")
        r.queued, clock = None, launched.clock
        reading = on_device.read(launched)  # the cycle's one wait
        clock.lap()  # accept: walked on the device (the host's replay, for the trace, is the trace's work)
        r.dcache.rewind(S)  # the target's cache was rewound by the device's commit, the length set by `verdict`
        clock.lap()
        if r.index is not None:
            r.index.extend(reading.committed)
        if r.steps.queued and self._drafts_next(r):  # a GPU: the next cycle queued before this one's books and
            # trace are written (when it too is a device cycle: no lookup match, a tree that fits), so the host
            # writes them while the device computes; a cost-aware tree's chosen by the books before this cycle's
            r.queued = self._launch_ahead(on_device, launched.features(reading.count), reading.committed,
                                          S + reading.count, r.capacity, r.tree, r.index, len(r.run.output),
                                          r.sampling.max_new_tokens, r.gen, r.policy)
        verdict = on_device.verdict(launched, reading, r.text)
        tree = verdict.draft.tree
        alone = len(tree) == 1  # a cost-aware tree's drafting that was not worth verifying
        return _Verified(verdict.draft, verdict.result, verdict.argmax, verdict.target_probs, verdict.root_top, alone,
                         tree.mask() if r.record and not alone else None, clock,
                         # as the host path's: greedy, whether any of the head's nodes was worth verifying; sampled,
                         # whether the head's drafting was expected to pay
                         forecast_paid=(not alone if r.sampling.greedy or r.policy is None
                                        else verdict.draft.head_paid),
                         moves=verdict.moves, features=verdict.features, draft_length=launched.draft_length)

    def _on_host(self, r: _Speculation, p: _Plan) -> _Verified:
        """Draft (`grow`: the head level by level or in one device call, a lookup's chain merged, the policy's
        choice), verify (one forward of the tree: inputs sent without blocking, the host does not wait for the
        draft's kernels) and accept (the one read of the target's verdict the host needs)."""
        sampling, clock, forecast_paid = r.sampling, p.clock, True
        draft = grow(self, r.feats[0], r.pend_tokens, r.dcache, r.tree, r.root, p.budget, r.policy, p.match,
                     p.run_head)
        tree = draft.tree
        if r.use_head and r.policy is not None:
            if p.run_head:
                # sampled, a head rests when its drafting is not expected to pay; greedy, only when none of its
                # nodes was worth verifying (the stricter rule lost there: docs/performance.md entry 27); at
                # either, also when the cycle took longer than its tokens are worth here (`Ledger`)
                forecast_paid = (draft.head_paid if not sampling.greedy else
                                 any(draft.cands.sources[n] != "lookup" for n in tree.node_ids[1:]))
            elif p.reference:
                draft.decision = REFERENCE_NOTE
            else:
                draft.decision = f"{r.rest.note()} {draft.decision}".strip()
        clock.lap()
        positions = [p.S + d for d in tree.depths]
        alone = len(tree) == 1  # the lookup's candidates not worth verifying
        mask = ROOT_MASK if alone else tree.mask()
        us = None if sampling.greedy else cycle_uniforms(r.gen, p.budget, self.target.device)
        out = r.steps.forward(tree.tokens, positions, None if alone else mask)
        clock.lap()
        if alone:  # nothing to accept, no distribution to keep for a replay
            result, argmax, tprobs = self._accept_root(out.logits[0], sampling, r.gen,
                                                       None if out.argmax is None else out.argmax[0],
                                                       None if us is None else us[:1])
            root_top = []
        else:
            result, argmax, tprobs, root_probs = self._accept(tree, draft.cands, out.logits, sampling, us, r.text)
            root_top = [] if root_probs is None else self._root_top(root_probs, r.text)
        clock.lap()
        return _Verified(draft, result, argmax, tprobs, root_top, alone, mask, clock, forecast_paid, out=out)

    def _rewound(self, r: _Speculation, p: _Plan, v: _Verified) -> CycleTrace:
        """Phase 4, the rewind (the accepted path's slots compacted, the draft's expansion dropped; a device cycle's
        were moved by its walk and rewound at its read), and the cycle's trace."""
        S, tree, result, tcache = p.S, v.draft.tree, v.result, r.steps.cache
        draft_before = S if p.run_head else (r.dcache.length if r.use_head else S)
        moves, expansion_len = v.moves, v.draft_length
        if moves is None:
            moves = tcache.commit_path(S, [S + s for s in result.path])
            expansion_len = r.dcache.length if p.run_head else draft_before
            if p.run_head:
                r.dcache.rewind(S)
            v.clock.lap()
        accepted = [tree.tokens[s] for s in result.path[1:]]
        committed = accepted + [result.bonus_token]
        if r.index is not None and v.out is not None:  # (a device cycle's were indexed at its read)
            r.index.extend(committed)
        text, record, draft = r.text, r.record, v.draft
        return CycleTrace(
            index=r.cycle, nodes=self._nodes(draft.cands, tree, text) if record else [],
            verify_nodes=tree.node_ids, tokens=tree.tokens, texts=[text(t) for t in tree.tokens],
            parents=tree.parents, positions=[S + d for d in tree.depths],
            mask=([[1]] if v.alone else v.mask.int().tolist()) if record else [],
            target_tokens=v.argmax,
            target_texts=[text(t) for t in v.argmax], target_probs=v.target_probs, checks=result.checks,
            path=result.path, bonus_token=result.bonus_token, bonus_text=text(result.bonus_token),
            bonus_source=result.bonus_source, accept_length=len(accepted), committed=committed,
            kv_target=KVMap(before=S, appended=list(range(S, S + len(tree))), moves=moves, after=tcache.length),
            kv_draft=KVMap(before=draft_before, appended=list(range(draft_before, expansion_len)), moves=[],
                           after=draft_before),
            timings_ms=v.clock.read(PHASES),
            root_top=v.root_top, expected_accept=draft.expected - 1.0, draft_levels=draft.levels,
            decision=draft.decision, lookup_ngram=draft.lookup_ngram)

    def _keep_books(self, r: _Speculation, p: _Plan, v: _Verified, trace: CycleTrace) -> None:
        """After a drafted cycle: the head's next input (the accepted path's features and tokens, or, where it
        rested, these positions added to what it has not encoded), the ledgers and the price list by the cycle's
        clock, the rests they impose, and the committed tokens written out."""
        run, steps, committed = r.run, r.steps, trace.committed
        path_feats = None
        if r.use_head:  # the root alone's row is itself: no gather
            if v.out is None:
                path_feats = v.features
            elif not v.alone:
                path_feats = v.out.features[to_device(trace.path, self.target.device)]
            else:  # a static step's outputs are rewritten by the next step of its size
                path_feats = v.out.features.clone() if steps.reuses_outputs else v.out.features
        if p.run_head or not r.use_head:
            r.feats, r.pend_tokens = [path_feats], list(committed)
        else:  # the head rested: its cache still waits for these positions, encoded when it next runs
            r.feats.append(path_feats)
            r.pend_tokens.extend(committed)
        r.root = trace.bonus_token
        run.cycles.append(trace)
        # by the wall clock: on a GPU the phases' events leave out the host's work; a cycle that captured a graph is
        # no evidence (its capture is paid once)
        ms = ((time.perf_counter() - p.began) * 1e3 if not r.captures or prepared(steps, r.dcache) == p.ready
              else None)
        if r.ledger is not None:
            winning = r.ledger.observe(ms, len(committed), p.run_head, v.alone) if ms is not None else True
            if p.run_head:
                r.rest.most = r.ledger.span()
                r.rest.record(v.forecast_paid and winning, losing=not winning)
        if r.clocked is not None and ms is not None:  # the price list against this run's phases
            t = trace.timings_ms
            if v.alone:
                r.clocked.rest(t["verify"])
            if r.clocked.observe(len(trace.tokens), 0 if p.backlog else trace.draft_levels, t["verify"], t["draft"]):
                r.reprice(TreePolicy(r.clocked.costs(), r.policy.calibration))
        if r.lookups is not None and ms is not None and not p.run_head:
            looked_up = not v.alone  # the root and the lookup's candidates, the head not run
            if not r.lookups.observe(ms, len(committed), looked_up, v.alone, r.lookup_probe if looked_up else None):
                r.lookup_rest.left = r.lookups.span()
            r.lookup_probe = r.lookup_probe and v.alone
        r.done = self._emit(run, [(t, "draft") for t in committed[:-1]] + [(r.root, "bonus")], r.cycle,
                            self.target.eos_token_ids, r.sampling.max_new_tokens, r.text)
        run.wall_s = time.perf_counter() - r.start
        r.cycle += 1

    @staticmethod
    def _drafts_next(r: _Speculation) -> bool:
        """Whether the cycle after this one drafts, decided now, before this cycle's books are kept (a launch ahead
        decides it one cycle early): a fixed tree's head always drafts; a cost-aware tree's unless it rests or the
        next cycle times a plain step. The books this cycle writes rule from the cycle after next: the prices and
        values they set choose that cycle's tree, and a rest they impose starts with it (the launched cycle's own
        books may lengthen the rest or, where it paid, end it first)."""
        return r.policy is None or (not r.rest.left and not (r.ledger is not None and r.ledger.wants_reference()))

    def _launch_ahead(self, on_device: DeviceCycle, features: torch.Tensor | None, committed: list[int], S: int,
                      capacity: int, tree_cfg: TreeConfig, index, written: int, limit: int,
                      generator: torch.Generator, policy: TreePolicy | None = None):
        """The next cycle launched now from the accepted path's `features` rows, if the run goes on after
        `committed` (no end of sequence, `written` tokens so far under `limit`) and it will be a device cycle too
        (the tree fits the room left, the context's lookup, `committed` indexed, has no match to merge); else
        None. A sampled cycle's uniforms come from the run's `generator` now, as they would at its own launch; a
        cost-aware tree's choice from `policy`, the one before this cycle's books."""
        if any(t in self.target.eos_token_ids for t in committed) or written + len(committed) >= limit:
            return None
        budget = min(tree_cfg.draft_tokens, capacity - 1 - S)
        if not fits(budget) or (index is not None and index.match(min(tree_cfg.steps, budget - 1)) is not None):
            return None
        return on_device.launch(features, committed, committed[-1], S, budget,
                                PhaseClock(self.target.device), policy, generator)

    def _rest_steps(self, n: int, S: int, root: int, steps: EagerSteps | StaticSteps, sampling: SamplingConfig,
                    gen: torch.Generator, clock: PhaseClock, began: float, eos: frozenset[int], tokens_left: int,
                    last_slot: int, rests: Callable[[int, int], bool] | None = None) -> Iterator[RestStep]:
        """Up to n cycles that verify the root alone, as plain decoding's loop runs them: a step (`steps.forward` of
        one token, `_read_out` from the same generator) after another, each step's root the bonus before it,
        nothing else done between them; fewer where a token ends the run (end of sequence, `tokens_left`, the cache's
        `last_slot`) or where `rests(token, position)`, asked of each step's token and the next position once the
        run goes on, says the next cycle would not rest. Greedy, the read is the argmax alone, as plain decoding's
        (the trace's `target_probs` is [None]). `clock` and `began`: the first cycle's, started at its beginning.
        The head's cache is not touched; each step's features row feeds the head when it next runs (a static
        step's outputs are rewritten by the next step of its size: copied, on the device's queue before that
        step).

        Where a step returns before its kernels finish (`steps.queued`: a GPU), the next step is launched before a
        row is handed back, so what the caller does with the row (its trace, the run's books) runs while the device
        computes the next token, as plain decoding's loop hides its own (`_plain`); no step is launched past the
        last row. Over static steps with no `rests` to ask, several are, each token fed back on the device
        (`_rest_fed`). Elsewhere the next step runs when the caller asks for the next row."""
        dev, queued = self.target.device, steps.queued
        if queued and isinstance(steps, StaticSteps) and rests is None:  # (while the lookups look, each token
            # decides whether the next cycle rests: steps launched ahead of it would be dropped at each match,
            # several plain steps' work)
            yield from self._rest_fed(n, S, root, steps, sampling, gen, clock, began, eos, tokens_left, last_slot)
            return

        def launch(root: int, S: int, clock: PhaseClock):
            clock.lap()  # no drafting
            made = steps.prepared
            out = steps.forward([root], [S], None)
            clock.lap()
            return out, steps.prepared != made

        out, captured = launch(root, S, clock)
        for k in range(n):
            argmax = None if out.argmax is None else out.argmax[0]
            if sampling.greedy:  # plain decoding's read: the argmax alone, no probability computed
                bonus = top = self._choose(out.logits[0], sampling, gen, argmax)
                top_prob = None
            else:
                bonus, top, top_prob = self._read_out(out.logits[0], sampling, gen, argmax)
            clock.lap()
            clock.lap()  # the rewind: the root's slot is where a path of the root alone stays (the forward took it)
            row = RestStep(root, S, bonus, top, top_prob, clock, began, time.perf_counter(),
                           out.features.clone() if steps.reuses_outputs and out.features is not None
                           else out.features, captured)
            root, S = bonus, S + 1
            if k + 1 >= n or bonus in eos or k + 1 >= tokens_left or S >= last_slot or (rests is not None and
                                                                                   not rests(bonus, S)):
                yield row
                return
            if not queued:
                yield row
            clock, began = PhaseClock(dev), time.perf_counter()
            out, captured = launch(root, S, clock)
            if queued:  # the row after the launch: the caller's work on it overlaps the next step
                yield row

    def _rest_fed(self, n: int, S: int, root: int, steps: StaticSteps, sampling: SamplingConfig,
                  gen: torch.Generator, clock: PhaseClock, began: float, eos: frozenset[int], tokens_left: int,
                  last_slot: int) -> Iterator[RestStep]:
        """`_rest_steps` over queued static steps (a GPU) where no lookup decides between the cycles, each step's
        token fed back on the device as plain decoding's are (`_fed_back`): up to FED_AHEAD steps launched ahead of
        the host's reads, each with its features row copied and what the host reads of it (sampled: the token, the
        target's argmax and its probability) sent to pinned memory behind it on the device's queue. The rows are
        `_rest_steps`' (the same stopping rules, the same draws of `gen`); a row's phases are timed on the
        device's clock at its launch (its accept and rewind are nothing there), its wall time from the read before
        it to its own. Steps launched past an end of sequence read after them are dropped: their keys lie past the
        committed slots, to which the cache's length is set back."""
        dev, before = self.target.device, steps.prepared
        fed = self._fed_ahead(steps, root, sampling, gen)  # (a first use captures the step: the first row's)
        fresh = steps.prepared != before
        limit = max(1, min(n, tokens_left, last_slot - S))  # the rows at most, whatever the tokens read
        queue: deque[tuple] = deque()  # per step launched, not read yet: its clock, features and whether it captured

        def launch() -> None:
            while fed.room(limit):
                c = clock if fed.launched == 0 else PhaseClock(dev)
                made = steps.prepared
                c.lap()  # no drafting
                out = fed.launch()
                c.lap()
                c.lap()  # the read, after the fact: nothing on the device
                c.lap()  # the rewind: the root's slot is where a path of the root alone stays
                queue.append((c, None if out.features is None else out.features.clone(),
                              steps.prepared != made or (fresh and fed.launched == 1)))

        try:
            launch()
            start = began
            while True:
                bonus, top, top_prob = fed.take()
                c, features, captured = queue.popleft()
                end = time.perf_counter()
                row = RestStep(root, S, bonus, top, top_prob, c, start, end, features, captured)
                root, S, start = bonus, S + 1, end
                last = fed.read >= limit or bonus in eos
                if not last:
                    launch()
                yield row
                if last:
                    return
        finally:
            fed.close()

    @staticmethod
    def _rest_trace(index: int, row: RestStep, draft_length: int, text, record: bool, decision: str,
                    lookup_ngram: int = 0) -> CycleTrace:
        """A resting cycle's trace, written directly from what its step read (`_rest_steps`): no tree, no mask, no
        acceptance. `lookup_ngram`: the match behind a lookup continuation passed over (0: none)."""
        root, S, bonus = row.root, row.S, row.bonus
        bonus_text = text(bonus)
        # by position, as CycleTrace lists its fields (a call naming all 26 is the slower one, on the hot path)
        return CycleTrace(
            index, [], [-1], [root], [text(root)], [-1], [S], [[1]] if record else [],  # ... mask
            [row.top], [bonus_text if row.top == bonus else text(row.top)], [row.top_prob], [], [0],  # ... path
            bonus, bonus_text, "target", 0, [bonus],  # bonus_token, bonus_text, bonus_source, accept_length, committed
            KVMap(S, [S], [], S + 1), KVMap(draft_length, [], [], draft_length),  # kv_target, kv_draft
            row.clock.read(PHASES), [], 0.0, 0, decision, lookup_ngram)  # timings_ms, root_top, expected_accept ...

    def _accept(self, tree: VerifyTree, cands: Candidates, logits: torch.Tensor, sampling: SamplingConfig,
                uniforms: torch.Tensor | None, text):
        """Phase 3. logits: (T, V) fp32 target logits at each slot; uniforms: the cycle's (sampled). Returns the
        verdict, the target's argmax and its probability at each slot, and (when sampling) the target's sampling
        distribution at the root."""
        temp = 1.0 if sampling.greedy else sampling.temperature
        probs = torch.softmax(logits if temp == 1.0 else logits / temp, dim=-1)
        ops = self.sample_ops if logits.is_cpu else None
        if ops is not None:  # one C pass: the argmax of the logits (the first of equals, as torch.argmax and
            # plain decoding choose); its probability read at that index
            argmax = ops.argmax(logits)[0]
            tprobs = probs.gather(-1, torch.tensor(argmax)[:, None])[:, 0].tolist()
        else:  # of the logits, as plain decoding chooses: rounded probabilities can tie
            top_i = logits.argmax(dim=-1)
            argmax, tprobs = to_host(top_i, probs.gather(-1, top_i[:, None])[:, 0])
        qs = [1.0] + [math.exp(cands.logprobs[n]) for n in tree.node_ids[1:]]
        if sampling.greedy:
            return greedy_verify(tree, argmax, qs, tprobs, text), argmax, tprobs, None
        memo: dict[int, torch.Tensor] = {}
        # without nucleus truncation, the softmax above is the sampling distribution; with it, a device takes every
        # slot's at once, as its cycle's walk takes them (a CPU a row at a time, for the rows the walk reaches)
        rows = sampling_probs(logits, temp, sampling.top_p) if sampling.top_p < 1.0 and ops is None else probs

        def probs_at(s: int) -> torch.Tensor:
            if s not in memo:
                memo[s] = (rows[s] if sampling.top_p >= 1.0 or ops is None
                           else sampling_probs(logits[s], temp, sampling.top_p))
            return memo[s]

        return sample_verify(tree, probs_at, qs, argmax, uniforms, text, ops), argmax, tprobs, probs_at(0)

    def _accept_root(self, logits: torch.Tensor, sampling: SamplingConfig, gen: torch.Generator,
                     argmax: torch.Tensor | None = None,
                     u: torch.Tensor | None = None) -> tuple[VerifyResult, list[int], list[float]]:
        """Phase 3 of a cycle that verified the root alone: plain decoding's read-out (`_read_out`: the same draw,
        its uniform from the generator or, in a drafted cycle, the cycle's `u`), with the target's argmax and its
        probability for the trace, read once; the distribution is not kept for a replay."""
        bonus, top, top_prob = self._read_out(logits, sampling, gen, argmax, u=u)
        return VerifyResult(path=[0], bonus_token=bonus, bonus_source="target", checks=[]), [top], [top_prob]

    def _root_top(self, probs: torch.Tensor, text) -> list[tuple[int, str, float]]:
        """The target's sampling distribution at the root, truncated to its ROOT_TOP most likely tokens."""
        index, value = top_tokens(probs, ROOT_TOP, self.sample_ops)
        texts = text.many(index) if isinstance(text, _TokenText) else [text(i) for i in index]
        return [(i, x, v) for i, x, v in zip(index, texts, value) if v > 0]

    @staticmethod
    def _nodes(cands: Candidates, tree: VerifyTree, text) -> list[TreeNode]:
        slot = {n: s for s, n in enumerate(tree.node_ids)}
        return [TreeNode(id=i, parent=cands.parents[i], depth=cands.depths[i], token=cands.tokens[i],
                         text=text(cands.tokens[i]), prob=math.exp(cands.logprobs[i]),
                         score=cands.scores[i], expanded=cands.expanded[i], kept=i in slot, slot=slot.get(i, -1),
                         source=cands.sources[i], value=cands.values[i])
                for i in range(len(cands))]

    # ------------------------------------------------------------------ convenience
    def generate(self, prompt: str, tree: TreeConfig | None, sampling: SamplingConfig, chat: bool = True) -> RunTrace:
        """Run to the end and return the trace (tree None = plain decoding)."""
        ids = self.encode_prompt(prompt, chat)
        run = self.new_run(prompt, ids, tree, sampling, chat)
        steps = self.plain(ids, sampling, run) if tree is None else self.speculate(ids, tree, sampling, run)
        for _ in steps:
            pass
        return run
