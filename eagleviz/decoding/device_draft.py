"""Phase 1 on the device: every level of the head's drafting in one step function, captured, read once.

The host path (`eagleviz.decoding.drafting._head_levels`) reads the device once per level: the top-k children
of the frontier decide the next frontier. On a GPU each read stalls the queue, and each level's ~40 kernels
are launched from Python. Here the whole phase is one function of static buffers (SGLang's EAGLE worker does
the same), which a CUDA graph captures per pending-size bucket:

    encode     the pending positions (bucket B, padded: padding rows sit at the last real position, after
               the real rows, and no real row sees them) into the draft cache at [stable, stable + B)
    level 0    the last real row's top-k children of the root (draft log-probabilities, target ids)
    level s    the frontier (the k best nodes of level s - 1 by cumulative score: a stable descending sort
               of float64 scores, so ties go to the lower id as in `tree.select_frontier`) expands: each
               node attends to the prefix and its expanded ancestors (a (k, s k) mask grown on the device),
               writes its keys at the next k expansion slots and proposes its top-k children

Scores are float64 sums of float32 log-probabilities in the host's order, so the frontier is the one the host
would pick. Where the target runs the five-kernel layer (`EAGLEVIZ_LAYER_KERNELS=products`) and the head is
EAGLE-3, a level is 8 kernels, not ~40: the head's layer as the same products, the frontier in one kernel
(`_products_fn`). The host reads every level's tokens, log-probabilities and frontiers in one copy and rebuilds the
`Candidates` from what the device chose (`eagleviz.decoding.drafting.rebuild`), applying a cost-aware tree's
stopping rule level by level as the host path does. Every level is drafted whatever that rule decides (the
graph has one shape); the levels after its stop are discarded, and the decision says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eagleviz.config import TreeConfig
from eagleviz.decoding.device_policy import PolicyBlock
from eagleviz.models.draft import ProductsFrame
from eagleviz.models.host import to_device, to_host
from eagleviz.models.layers import rope_cos_sin
from eagleviz.models.static import BUCKETS, CudaGraphs, StepInputs, Uncaptured, bucket, capture_or_fall_back
from kernels import draft_select
from kernels.tree_attention import pack_mask_bits


@dataclass
class DraftOut:
    """One drafting's device results, flat: ids (k + (steps - 1) k^2,) target ids and logprobs (same) level
    by level, node by node; frontiers ((steps - 1) k,) each expansion's rows of the level before."""

    ids: torch.Tensor
    logprobs: torch.Tensor
    frontiers: torch.Tensor


def pick_frontier(score: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k best of a level by cumulative score (float64), best first, ties to the lower index:
    `tree.select_frontier`'s order, on the device."""
    return torch.sort(score, descending=True, stable=True).indices[:k]


def grow_ancestors(anc: torch.Tensor, parents: torch.Tensor, eye: torch.Tensor) -> torch.Tensor:
    """The next frontier's ancestor-or-self rows over the expansion slots: anc (k, E) the current frontier's,
    parents (k,) each new node's row in it, eye (k, k) the new nodes' own slots (the next k): (k, E + k)."""
    return torch.cat([anc[parents], eye], dim=1)


_SERIALS = itertools.count()


class DeviceDrafter:
    """The head's static state for one run of a tree shape (k = topk, `steps`): its KV cache and inputs, and
    one captured drafting per pending-size bucket. `length`/`rewind` are the draft cache's, as the engine
    keeps them for a `KVCache`. `serial`: this drafter's number, never another's (an `id` is reused once its
    object is freed), under which the target's state keeps the cycles captured over its buffers."""

    def __init__(self, engine, capacity: int, tree: TreeConfig, graphs: CudaGraphs | Uncaptured):
        self.engine, self.k, self.steps, self.graphs = engine, tree.topk, tree.steps, graphs
        self.serial = next(_SERIALS)
        target, c = engine.target, engine.head.config
        self.capacity = capacity
        # capture writes at `capacity` and past it: the largest bucket, or one row and every expansion
        self.cache = engine.head.new_cache(capacity + BUCKETS[-1] + tree.steps * tree.topk + 1, target.kv_dtype,
                                           target.device)
        self.inputs = StepInputs(target.device)
        width = c.feature_size if c.arch == "eagle3" else c.hidden_size
        self.features = torch.zeros(BUCKETS[-1], width, dtype=target.dtype, device=target.device)
        # a cost-aware tree's numbers, read by its cycles' captured verifications (`device_policy`)
        self.policy = PolicyBlock(tree.steps, tree.topk, target.device)
        # a sampled cycle's uniforms (`verify.cycle_uniforms`), written at each launch, read by its verification
        self.uniforms = torch.zeros(BUCKETS[-1], dtype=torch.float64, device=target.device)
        self._replays: dict[int, Callable[[], DraftOut]] = {}
        self.fallback = ""
        # the head's layers as the target's five-kernel layer, where the target runs it and the head can
        self.products = target.layer_products and engine.head.runs_products
        self._make_fn = self._products_fn if self.products else self._draft_fn
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset(self) -> None:
        """Ready for another run: nothing committed."""
        self.cache.length = 0

    @property
    def length(self) -> int:
        return self.cache.length

    def rewind(self, length: int) -> None:
        self.cache.rewind(length)

    def prepare(self) -> dict[int, DraftOut]:
        """Every pending-size bucket's drafting captured now (before any timed run), not at its first use; returns
        each bucket's outputs (its replay's static tensors, drafted once over the scratch slots)."""
        outputs = {}
        for b in BUCKETS:
            replay = self._replay(b)
            self.inputs.write(self.capacity, [0] * b, [self.capacity] * b, None, b)  # the scratch slots
            outputs[b] = replay()
        self.cache.length = 0
        return outputs

    @property
    def prepared(self) -> int:
        """The pending-size buckets made ready so far (each captured at its first use, in that drafting's time)."""
        return len(self._replays)

    def _draft_fn(self, b: int, prefix: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                  features: torch.Tensor) -> Callable[[], DraftOut]:
        """The drafting of b pending positions read from prefix (1,), ids (b,), positions (b,), features (b, F)."""
        engine, k, steps = self.engine, self.k, self.steps
        head, target, cache, impl = engine.head, engine.target, self.cache, engine.attn_impl
        dev = target.device
        causal = torch.ones(b, b, dtype=torch.bool, device=dev).tril()
        eye = torch.eye(k, dtype=torch.bool, device=dev)

        def children(hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if target.layer_products:   # the GPU's fused kernels, asked for: the children in one kernel too
                values, ids = draft_select.log_softmax_topk(head.logits(hs, target.unembed), k, head.target_offsets())
                return ids, values
            logp = torch.log_softmax(head.logits(hs, target.unembed), dim=-1)
            values, draft_ids = torch.topk(logp, k, dim=-1)
            return head.to_target_ids(draft_ids), values

        def draft() -> DraftOut:
            h = head.step(features[:b], target.embed(ids), positions, prefix, causal, cache, impl)
            last = positions[-1:] - prefix  # the last real row: padding rows repeat its position
            start = positions[-1:] + 1  # S: the committed draft length after the encoding
            h_last = h.index_select(0, last)
            tok, lp = children(h_last)
            all_ids, all_lp, fronts = [tok[0]], [lp[0]], []
            score, feat = lp[0].double(), h_last.expand(k, -1)
            anc = eye
            for s in range(1, steps):
                order = pick_frontier(score, k)
                fronts.append(order)
                parent = order // k if s > 1 else torch.zeros_like(order)
                f_tok, f_score = all_ids[-1][order], score[order]
                if s > 1:
                    anc = grow_ancestors(anc, parent, eye)
                hs = head.step(feat[parent] if s > 1 else feat, target.embed(f_tok), (start + s - 1).expand(k),
                               start, anc, cache, impl)
                tok, lp = children(hs)
                all_ids.append(tok.reshape(-1))
                all_lp.append(lp.reshape(-1))
                score = (f_score[:, None] + lp.double()).reshape(-1)
                feat = hs
            frontiers = torch.cat(fronts) if fronts else torch.zeros(0, dtype=torch.long, device=dev)
            return DraftOut(torch.cat(all_ids), torch.cat(all_lp), frontiers)

        return draft

    def _products_fn(self, b: int, prefix: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                     features: torch.Tensor) -> Callable[[], DraftOut]:
        """`_draft_fn` where the target runs the five-kernel layer and the head can (`DraftHead.runs_products`):
        the head's layers as the same products (`DraftHead.step_products`), RoPE from tables made here once, each
        level's frontier, gathered rows and ancestry in one kernel (`draft_select.frontier`), its logits' norm
        in the LM head's prologue and its children in one kernel, written into the drafting's outputs in place:
        8 kernels a level for a one-layer head, where `_draft_fn`'s take ~40 (`tests/test_static.py`). The same
        tokens, frontiers and (to rounding) log-probabilities."""
        engine, k, steps = self.engine, self.k, self.steps
        head, target, cache = engine.head, engine.target, self.cache
        dev, eps, norm_first = target.device, head.config.rms_norm_eps, head.config.norm_before_residual
        rope = self._rope_tables()
        embed = target.embed_weight
        offsets = head.target_offsets()
        causal = pack_mask_bits(torch.ones(b, b, dtype=torch.bool, device=dev).tril())
        n_out = k + (steps - 1) * k * k
        all_ids = torch.zeros(n_out, dtype=torch.long, device=dev)
        all_lp = torch.zeros(n_out, dtype=torch.float32, device=dev)
        frontiers = torch.zeros((steps - 1) * k, dtype=torch.long, device=dev)
        levels = [(torch.zeros(k, dtype=torch.long, device=dev), torch.zeros(k, dtype=torch.float64, device=dev),
                   torch.zeros(k, head.config.hidden_size, dtype=target.dtype, device=dev),
                   torch.zeros(k, -(-s * k // 32), dtype=torch.int32, device=dev)) for s in range(1, steps)]

        def children(h: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
            n = h.shape[0] * k
            return draft_select.log_softmax_topk(head.logits(h, None, products=True), k, offsets,
                                                 out=(all_lp[at:at + n], all_ids[at:at + n]))

        def draft() -> DraftOut:
            g = head.fc(features[:b]) if features.shape[-1] != head.config.hidden_size else features[:b].clone()
            h = head.step_products(g, ids, embed, rope, ProductsFrame(positions, 0, prefix, prefix.to(torch.int32), 0,
                                                                      causal, b), cache)
            last = positions[-1:] - prefix  # the last real row: padding rows repeat its position
            start = positions[-1:] + 1  # S: the committed draft length after the encoding
            start32 = start.to(torch.int32)
            hs = h.index_select(0, last)
            lp, tok = children(hs, 0)
            score, words, at = None, None, k
            for s in range(1, steps):
                f_tok, f_score, rows, words = draft_select.frontier(
                    lp.reshape(-1), tok.reshape(-1), score, hs, head.midlayer.hidden_norm.weight if norm_first else
                    None, words, k, s, eps, out=(frontiers[(s - 1) * k:s * k], *levels[s - 1]))[1:]
                hs = head.step_products(rows, f_tok, embed, rope,
                                        ProductsFrame(start, s - 1, start, start32, (s - 1) * k, words, s * k), cache,
                                        normed=norm_first)
                lp, tok = children(hs, at)
                score, at = f_score, at + k * k
            return DraftOut(all_ids, all_lp, frontiers)

        return draft

    def _rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's RoPE cos and sin (rows: every position its cache holds), as `rope_cos_sin` makes them."""
        if self._rope is None:
            head, target = self.engine.head, self.engine.target
            self._rope = rope_cos_sin(torch.arange(self.cache.capacity + self.steps, device=target.device),
                                      head.inv_freq, target.dtype)
        return self._rope

    def _replay(self, b: int) -> Callable[[], DraftOut]:
        if b not in self._replays:
            # a capture drafts for real: point it at the scratch slots past `capacity`
            self.inputs.write(self.capacity, [0] * b, [self.capacity] * b, None, b)
            prefix, ids, positions, _ = self.inputs.views(b)
            fn = self._make_fn(b, prefix, ids, positions, self.features)
            self._replays[b] = capture_or_fall_back(self, fn, " of the draft", "this run drafts uncaptured")
        return self._replays[b]

    def draft(self, feats: torch.Tensor, pend_tokens: list[int]) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """Encode the pending positions (feats (n, F), their tokens) and draft every level. Returns, read in one
        copy, the ids and log-probabilities (flat, level by level) and the frontiers (flat, a level's rows)."""
        out = self.launch(feats, pend_tokens)
        return to_host(out.ids, out.logprobs, out.frontiers)

    def launch(self, feats: torch.Tensor, pend_tokens: list[int]) -> DraftOut:
        """`draft` without the read: its results on the device (a bucket's static outputs, rewritten by the
        bucket's next drafting)."""
        n, stable = len(pend_tokens), self.cache.length
        positions = list(range(stable, stable + n))
        if n > BUCKETS[-1]:  # a prompt's first drafting: the same function at its own size, uncaptured
            dev = feats.device
            out = self._make_fn(n, torch.tensor([stable], device=dev), to_device(pend_tokens, dev),
                                to_device(positions, dev), feats)()
        else:
            b = bucket(n)
            replay = self._replay(b)
            self.features[:n].copy_(feats)
            self.inputs.write(stable, pend_tokens, positions, None, b)
            out = replay()
        # the cache now holds the encoded positions and every level's expansion slots
        self.cache.length = stable + n + (self.steps - 1) * self.k
        return out
