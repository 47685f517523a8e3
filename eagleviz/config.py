"""Frozen configurations with SGLang's knob names, their validity rules, and the adjustments SGLang makes.

    steps         speculative_num_steps         drafting depth: the draft runs `steps` forwards per cycle
                                                (one over the newly committed tokens, steps - 1 expansions),
                                                so the tree has at most `steps` levels below the root
    topk          speculative_eagle_topk        branching: children kept per expanded node, and the width of
                                                the frontier carried from one level to the next
    draft_tokens  speculative_num_draft_tokens  verification budget, root included: the target verifies at
                                                most this many tree tokens in one forward

Two choices beyond SGLang's knobs:
    adaptive      True (the default): a cost-aware tree (`eagleviz.decoding.policy`) drafts and verifies only
                  what is expected to pay on this machine, with the three knobs as upper bounds; False: SGLang's
                  fixed tree, exactly `steps` levels and `draft_tokens` verified
    source        where candidates come from: "eagle" (the head), "lookup" (continuations of the context's own
                  recurring text, no model work: `eagleviz.decoding.lookup`) or "eagle+lookup" (both, merged;
                  the default: 1.07x faster than the head alone at T = 0 here, docs/performance.md entry 22)
"""

from __future__ import annotations

from dataclasses import dataclass, field

LIMITS = {"steps": (1, 16), "topk": (1, 16), "draft_tokens": (2, 256)}
SOURCES = ("eagle", "lookup", "eagle+lookup")


def _check_range(name: str, value, lo, hi) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def tree_token_cap(steps: int, topk: int) -> int:
    """The most tokens a tree can verify: the root + every candidate the drafting produces (topk at level 1,
    topk^2 at each later level). SGLang's rule for speculative_num_draft_tokens."""
    return 1 + topk + (steps - 1) * topk * topk


def kv_slots(n_prompt: int, max_new_tokens: int, tree: TreeConfig | None) -> int:
    """Target KV-cache slots a run needs: the prompt, every new token, and one tree beyond them."""
    return n_prompt + max_new_tokens + (tree.draft_tokens if tree is not None else 0) + 1


@dataclass(frozen=True)
class TreeConfig:
    """The draft tree's shape. Build it with `TreeConfig.create(...)` to get SGLang's adjustments applied
    and reported in `adjustments` (never silently)."""

    steps: int = 5
    topk: int = 4
    draft_tokens: int = 16
    adjustments: tuple[str, ...] = field(default=(), compare=False)
    adaptive: bool = True
    source: str = "eagle+lookup"

    def __post_init__(self):
        for name, (lo, hi) in LIMITS.items():
            _check_range(name, getattr(self, name), lo, hi)
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {self.adaptive!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.draft_tokens > self.max_draft_tokens:
            raise ValueError(f"draft_tokens {self.draft_tokens} exceeds the {self.max_draft_tokens} tree tokens that "
                             f"steps={self.steps}, topk={self.topk} can produce; use TreeConfig.create to adjust")

    @property
    def max_draft_tokens(self) -> int:
        return tree_token_cap(self.steps, self.topk)

    @property
    def draft_expansion(self) -> int:
        """Draft-cache slots a cycle's expansion takes beyond the committed tokens (topk per later step)."""
        return self.steps * self.topk

    @classmethod
    def create(cls, steps: int = 5, topk: int = 4, draft_tokens: int = 16, adaptive: bool = True,
               source: str = "eagle+lookup") -> TreeConfig:
        """Validate the knobs and apply the adjustments SGLang applies, recording each one."""
        for name, value in (("steps", steps), ("topk", topk), ("draft_tokens", draft_tokens)):
            _check_range(name, value, *LIMITS[name])
        notes = []
        if topk == 1 and draft_tokens != steps + 1:
            notes.append(f"draft_tokens adjusted from {draft_tokens} to steps + 1 = {steps + 1} because topk == 1 "
                         "(a chain has exactly one candidate per step; SGLang does the same)")
            draft_tokens = steps + 1
        cap = tree_token_cap(steps, topk)
        if draft_tokens > cap:
            notes.append(f"draft_tokens reduced from {draft_tokens} to {cap}: steps={steps} and topk={topk} "
                         f"produce only {cap - 1} candidate tokens plus the root")
            draft_tokens = cap
        return cls(steps, topk, draft_tokens, tuple(notes), adaptive, source)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    def with_(self, **changes) -> TreeConfig:
        merged = {"steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens,
                  "adaptive": self.adaptive, "source": self.source} | changes
        return TreeConfig.create(**merged)


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy; top_p 1 = no nucleus truncation; max_new_tokens counts committed tokens."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_range("max_new_tokens", self.max_new_tokens, 1, 8192)
        _check_range("seed", self.seed, 0, 2**63 - 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


TREE_PRESETS = {  # SGLang's fixed trees, by name
    "chain": TreeConfig.create(steps=5, topk=1, draft_tokens=6, adaptive=False),
    "default": TreeConfig.create(adaptive=False),
    "sglang-llama": TreeConfig.create(steps=5, topk=4, draft_tokens=8, adaptive=False),
    "wide": TreeConfig.create(steps=6, topk=8, draft_tokens=64, adaptive=False),
}
