"""eagleviz/models/quantized.py: a target whose linears are exactly Q4_1 blocks (its LM head Q8_0) computes from
the blocks: the same logits as its fp32 linears up to the order of the sums, and a token's logits bitwise the
same whether it is run alone, with other tokens after it, or as a node of a tree (batch invariance: the
products' and the C attention's fixed orders of summation)."""

import dataclasses

import pytest
import torch

from eagleviz.errors import UserFacingError
from eagleviz.models import loading
from kernels import capability
from eagleviz.decoding.engine import Engine
from eagleviz.models.dense import Dense, DenseModule
from eagleviz.models.draft import random_head
from eagleviz.models.quantized import QuantDense, find_blocks
from kernels.quant_ops import QuantWeight
from eagleviz.models.target import ACTIVATIONS, TargetModel
from eagleviz.paths import cache_dir
from kernels import quant_ops
from tiny import tiny_target, unbuilt


def _quantize(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """w rounded to the values `fmt` blocks of 32 can hold, as a quantizer writes them."""
    blocks = w.detach().float().reshape(-1, 32)
    if fmt == "q4_1":
        m = blocks.min(1, keepdim=True).values.half().float()
        d = ((blocks.max(1, keepdim=True).values - m) / 15).half().float()
        q = ((blocks - m) / d).round().clamp(0, 15)
        out = d * q + m
    else:
        return QuantWeight.quantize_q8_0(w).dequantize()
    return out.reshape(w.shape)


@pytest.fixture(scope="module")
def pair():
    dense = tiny_target(vocab=64, layers=3)
    with torch.no_grad():
        for name, p in dense.hf.named_parameters():
            if p.dim() == 2:
                p.copy_(_quantize(p, "q8_0" if "embed" in name or "lm_head" in name else "q4_1"))
    dense = TargetModel(dense.hf, dense.tokenizer, dense.name)
    blocks = find_blocks(dense.hf.state_dict())
    quant = {act: TargetModel(dense.hf, dense.tokenizer, dense.name, blocks=blocks, activations=act)
             for act in ACTIVATIONS}
    if any(q.weights != "blocks" for q in quant.values()):
        unbuilt("kernels/quant_ops.c", quant_ops.last_error(cache_dir() / "kernels"))
    return dense, quant, blocks


def test_every_linear_and_the_lm_head_compute_from_blocks(pair):
    dense, quant, blocks = pair
    assert dense.weights == "dense" and all(q.weights == "blocks" for q in quant.values())
    assert {w.fmt for name, w in blocks.items() if "lm_head" in name or "embed" in name} == {"q8_0"}
    assert {w.fmt for name, w in blocks.items() if "layers" in name} == {"q4_1"}


def test_the_logits_are_the_fp32_linears_up_to_summation_order_or_int8_rounding(pair):
    dense, quant, _ = pair
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    a = dense.forward(ids, torch.arange(10), dense.new_cache(16), mask).logits
    fp32 = quant["fp32"].forward(ids, torch.arange(10), quant["fp32"].new_cache(16), mask).logits
    torch.testing.assert_close(fp32, a, rtol=1e-4, atol=1e-4)
    int8 = quant["int8"].forward(ids, torch.arange(10), quant["int8"].new_cache(16), mask).logits
    assert not torch.equal(int8, fp32)  # the activations really went through int8
    assert (int8 - a).abs().max() < 0.05 * a.abs().max()
    assert (int8.argmax(-1) == a.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_a_head_beside_a_target_from_blocks_drafts_from_q8_0_blocks(pair, arch):
    """Every product of the drafting copy computes from Q8_0 blocks (a draft level reads a quarter of the fp32
    bytes), within Q8_0's rounding of the fp32 head; beside a dense target the head stays dense."""
    dense, quant, _ = pair
    head = random_head(dense, arch=arch, seed=1)
    fp32 = Engine(dense, head).head
    q8 = Engine(quant["int8"], head).head
    products = [v for sub in q8.modules() for v in [*vars(sub).values(), getattr(sub, "dense", None)]
                if isinstance(v, (Dense, QuantDense))]
    assert products and all(isinstance(v, QuantDense) for v in products)
    assert not any(isinstance(v, QuantDense) for sub in fp32.modules() for v in vars(sub).values())
    assert all(isinstance(m.dense, Dense) for m in fp32.modules() if isinstance(m, DenseModule))
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(3, head.config.feature_size if arch == "eagle3" else dense.hidden_size, generator=gen)
    embeds = dense.embed(torch.tensor([1, 2, 3]))
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    out = {name: h(feats, embeds, torch.arange(3), h.new_cache(8, torch.float32, "cpu"), mask)
           for name, h in (("fp32", fp32), ("q8", q8))}
    assert not torch.equal(out["q8"], out["fp32"])  # the products really went through the blocks
    torch.testing.assert_close(out["q8"], out["fp32"], rtol=0.05, atol=0.05 * out["fp32"].abs().max().item())


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("prefix", [5, 14, 20, 31])
def test_a_tokens_logits_do_not_depend_on_the_tokens_after_it(pair, prefix, act):
    """The first new token's logits from a causal forward of 1, 2, 3 or 5 new tokens after `prefix` tokens: the
    rows after it change nothing in its products and norms, and its attention never sees them."""
    quant = pair[1][act]
    ids = torch.randint(0, 64, (prefix + 5,), generator=torch.Generator().manual_seed(prefix))
    cache = quant.new_cache(64)
    quant.forward(ids[:prefix], torch.arange(prefix), cache, torch.ones(prefix, prefix, dtype=torch.bool).tril(),
                  logit_rows=None)
    rows = []
    for t in (1, 2, 3, 5):
        new = slice(prefix, prefix + t)
        out = quant.forward(ids[new], torch.arange(prefix, prefix + t), cache, torch.ones(t, t, dtype=torch.bool).tril())
        rows.append(out.logits[0])
        cache.length -= t
    assert all(torch.equal(rows[0], r) for r in rows[1:])


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("prefix", [9, 15, 30])
def test_a_tree_nodes_logits_are_plain_decodings(pair, prefix, act):
    """Verification is batch invariant: each node of a branching tree gets bitwise the logits plain decoding
    gives the same token after the same path, though its ancestors sit at other cache slots and siblings'
    keys are masked out between them."""
    quant = pair[1][act]
    gen = torch.Generator().manual_seed(prefix)
    ids = torch.randint(0, 64, (prefix,), generator=gen)
    tokens = torch.randint(0, 64, (7,), generator=gen)
    parents = [-1, 0, 0, 1, 2, 4, 4]  # node 0 the root; depths 0, 1, 1, 2, 2, 3, 3
    mask = torch.zeros(7, 7, dtype=torch.bool)
    for node in range(7):
        at = node
        while at >= 0:
            mask[node, at] = True
            at = parents[at]
    depth = mask.sum(1) - 1
    cache = quant.new_cache(64)
    quant.forward(ids, torch.arange(prefix), cache, torch.ones(prefix, prefix, dtype=torch.bool).tril(), logit_rows=None)
    tree = quant.forward(tokens, prefix + depth, cache, mask).logits
    cache.length = prefix
    for node in range(7):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        for step, at in enumerate(reversed(path)):  # plain decoding, one token at a time
            plain = quant.forward(tokens[at:at + 1], torch.tensor([prefix + step]), cache, None).logits[0]
        assert torch.equal(plain, tree[node]), node
        cache.length = prefix


@pytest.mark.parametrize("native,packing,compiler,dtype,stored,want", [
    (False, False, "cc", "auto", True, True),    # an AVX2-only CPU: the embedded model decodes from its blocks
    (True, False, "cc", "auto", True, True),     # native bf16 that oneDNN does not pack
    (True, True, "cc", "auto", True, True),      # native bf16 that packs: the blocks all the same (one numerics)
    (True, True, None, "auto", True, False),     # no compiler to build the blocks' products: bf16 linears
    (False, False, "cc", "float32", True, False),  # an explicit dtype is honoured with dense linears
    (False, False, "cc", "auto", False, False),  # a model not stored in blocks
])
def test_auto_weights_take_the_blocks_on_any_cpu(monkeypatch, native, packing, compiler, dtype, stored, want):
    cpu = dataclasses.replace(capability.detect(), native_bf16=native, bf16_packing=packing, compiler=compiler)
    monkeypatch.setattr(capability, "detect", lambda: cpu)
    monkeypatch.setattr(loading, "stored_in_blocks", lambda model: stored)
    assert loading.choose_weights("auto", "embedded", dtype, "cpu") is want
    assert loading.choose_weights("dense", "embedded", dtype, "cpu") is False


def test_blocks_asked_for_where_they_cannot_run_is_one_line(monkeypatch):
    with pytest.raises(UserFacingError, match="drop --dtype bfloat16"):
        loading.choose_weights("blocks", "embedded", "bfloat16", "cpu")
    with pytest.raises(UserFacingError, match="does not store its weights in Q4_1/Q8_0 blocks"):
        loading.choose_weights("blocks", "random", "auto", "cpu")
    with pytest.raises(UserFacingError, match="weights must be one of"):
        loading.choose_weights("int4", "embedded", "auto", "cpu")
