"""kernels/stack_ops.py: the decoder stack in one C call gives bitwise what the Python sequence of the same C
operations gives (logits, EAGLE-3 features, the keys and values written to the cache) for a prompt, a tree and
a single token, with int8 and fp32 activations; an engine decodes the same tokens with it; it refuses what
does not fit. The same for an EAGLE-3 head's layer (`Midlayer`)."""

from __future__ import annotations

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.models.draft import random_head
from eagleviz.models.quantized import find_blocks
from eagleviz.models.target import ACTIVATIONS, TargetModel
from eagleviz.paths import cache_dir
from kernels import cpu_ops, quant_ops, stack_ops
from kernels.quant_ops import QuantWeight
from tiny import tiny_target, unbuilt


@pytest.fixture(scope="module")
def models():
    """One target whose weights are exactly Q8_0 blocks, with and without the stack, per activation scheme."""
    dense = tiny_target(vocab=64, layers=4)
    with torch.no_grad():
        for p in dense.hf.parameters():
            if p.dim() == 2:
                p.copy_(QuantWeight.quantize_q8_0(p).dequantize())
    blocks = find_blocks(dense.hf.state_dict())
    built = {(act, stack): TargetModel(dense.hf, dense.tokenizer, dense.name, blocks=blocks, activations=act,
                                       stack=stack)
             for act in ACTIVATIONS for stack in (None, False)}
    folder = cache_dir() / "kernels"
    if any(m.weights != "blocks" for m in built.values()):
        unbuilt("kernels/quant_ops.c", quant_ops.last_error(folder))
    if any(m.ops is None for m in built.values()):
        unbuilt("kernels/cpu_ops.c", cpu_ops.last_error(folder))
    if built[(ACTIVATIONS[0], None)]._stack is None:
        unbuilt("kernels/stack_ops.c", stack_ops.last_error(folder))
    return built


def test_the_stack_runs_only_where_asked_and_possible(models):
    assert all((m._stack is not None) == (stack is None) for (_, stack), m in models.items())
    assert tiny_target(vocab=64)._stack is None  # dense weights: nothing to run from blocks


@pytest.mark.parametrize("act,layers", [(act, None) for act in ACTIVATIONS] + [("int8", (0, 3, 1))])
def test_a_prompt_a_tree_and_a_token_are_bitwise_the_python_sequences(models, act, layers):
    """The stack's logits, keys, values and features are the Python sequence's bit for bit: for a prompt, a tree
    and one token; with the head's layers (one named twice) and three distinct ones (a step's single row is
    copied straight into its place among the features)."""
    fast, ref = models[(act, None)], models[(act, False)]
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 64, (23,), generator=gen)
    tree = torch.randint(0, 64, (6,), generator=gen)
    parents = [-1, 0, 0, 1, 1, 3]
    mask = torch.eye(6, dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node] |= mask[parent]
    depth = mask.sum(1) - 1
    layers = layers or fast.eagle3_layers
    caches = [fast.new_cache(40), ref.new_cache(40)]
    steps = [(prompt, torch.arange(23), torch.ones(23, 23, dtype=torch.bool).tril()),
             (tree, 23 + depth, mask), (tree[:1], torch.tensor([23]), None)]
    for ids, pos, m in steps:
        a, b = (model.forward(ids, pos, cache, m, feature_layers=layers) for model, cache in zip((fast, ref), caches))
        assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
        assert caches[0].length == caches[1].length
        if m is not None and len(ids) == 6:
            caches[0].length = caches[1].length = 23  # the tree's slots are dropped again, as a rewind does
    no_features = fast.forward(tree[:1], torch.tensor([23]), fast.new_cache(40), None)
    assert no_features.features.shape == (1, fast.hidden_size)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_engine_decodes_the_same_tokens_with_the_stack(models, temperature):
    fast, ref = models[("int8", None)], models[("int8", False)]
    head = random_head(fast, seed=3)
    engines = [Engine(model, head, "random") for model in (fast, ref)]
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=20, seed=5)
    for cfg in (None, TreeConfig.create(3, 2, 6, adaptive=False)):
        runs = [e.generate("one two three", cfg, sampling) for e in engines]
        assert [t.token for t in runs[0].output] == [t.token for t in runs[1].output]


def test_the_stack_refuses_what_does_not_fit(models):
    fast = models[("int8", None)]
    cache = fast.new_cache(8)
    h = torch.zeros(2, fast.hidden_size)
    cos = sin = torch.zeros(2, fast.head_dim)
    with pytest.raises(ValueError, match="overflow"):
        fast._stack.run(h, cos, sin, cache.k, cache.v, 7, None, None, 1)
    with pytest.raises(ValueError, match="mask"):
        fast._stack.run(h, cos, sin, cache.k, cache.v, 0, torch.ones(2, 3, dtype=torch.int64), None, 1)
    with pytest.raises(ValueError, match="h must be"):
        fast._stack.run(h[:, :10], cos, sin, cache.k, cache.v, 0, None, None, 1)
    with pytest.raises(ValueError, match="cache"):
        fast._stack.run(h, cos, sin, cache.k[:1], cache.v[:1], 0, None, None, 1)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_an_eagle3_heads_layer_in_one_call_is_bitwise_its_python_sequence(models, act):
    """`draft_midlayer`: the head's output and the keys and values it writes, for the target's features (through
    fc), for a tree's expansion (the head's own outputs, no fc, under a mask) and for a single position."""
    import copy

    target = models[(act, None)]
    fast = random_head(target, arch="eagle3", seed=4, std=0.2).for_drafting(None, target.ops, target.block_ops,
                                                                             act == "int8")
    if fast.compiled_layer is None:
        unbuilt("kernels/stack_ops.c", stack_ops.last_error(cache_dir() / "kernels"))
    ref = copy.copy(fast)
    ref.compiled_layer = None
    c = fast.config
    gen = torch.Generator().manual_seed(11)
    expansion = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
    for rows, width, mask in ((7, c.feature_size, torch.ones(7, 7, dtype=torch.bool).tril()),
                              (4, c.hidden_size, expansion), (1, c.feature_size, None)):
        features, emb = torch.randn(rows, width, generator=gen), torch.randn(rows, c.hidden_size, generator=gen)
        caches = [fast.new_cache(32, torch.float32, "cpu") for _ in range(2)]
        fill_k, fill_v = torch.randn(caches[0].k.shape, generator=gen), torch.randn(caches[0].v.shape, generator=gen)
        for cache in caches:
            cache.k.copy_(fill_k)
            cache.v.copy_(fill_v)
            cache.length = 10
        pos = torch.arange(10, 10 + rows)
        out = [head(features, emb, pos, cache, mask) for head, cache in zip((fast, ref), caches)]
        assert torch.equal(out[0], out[1])
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
        assert caches[0].length == caches[1].length == 10 + rows
    assert random_head(target, seed=4).for_drafting(None, target.ops, target.block_ops).compiled_layer is None


def test_the_heads_layer_refuses_what_does_not_fit(models):
    target = models[("int8", None)]
    head = random_head(target, arch="eagle3", seed=4).for_drafting(None, target.ops, target.block_ops)
    if head.compiled_layer is None:
        unbuilt("kernels/stack_ops.c", stack_ops.last_error(cache_dir() / "kernels"))
    layer, c = head.compiled_layer, head.config
    cache = head.new_cache(8, torch.float32, "cpu")
    features, emb = torch.zeros(2, c.feature_size), torch.zeros(2, c.hidden_size)
    cos = sin = torch.zeros(2, c.head_dim)
    with pytest.raises(ValueError, match="overflow"):
        layer.run(features, emb, cos, sin, cache.k, cache.v, 7, None, 1)
    with pytest.raises(ValueError, match="features"):
        layer.run(features[:, :32], emb, cos, sin, cache.k, cache.v, 0, None, 1)
    with pytest.raises(ValueError, match="mask"):
        layer.run(features, emb, cos, sin, cache.k, cache.v, 0, torch.ones(2, 3, dtype=torch.int64), 1)
