"""eagleviz/models/static.py: the target's steps over a static state, as CUDA graphs replay them, proved on a CPU.

A CPU cannot capture a CUDA graph, so the capture is stood in for by `Recording` (the warm-up and the
recording call of `CudaGraphs.capture`, then replay = its recorded operations over the same buffers). What that
proves here: the step equals the eager forward; the engine's tokens are the eager path's, greedy and sampled;
a capture mid-run never touches a committed key; after warm-up no step makes a tensor of a new shape (a
replayed graph cannot); a plain step reads the device once and a greedy EAGLE cycle twice (the drafting,
`tests/test_device_draft.py`, and the verdict), a fixed tree's once (`tests/test_device_cycle.py`); the step's
operations per layer stay within a budget; a failed capture falls back, saying so in the run's notes."""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from eagleviz.config import SamplingConfig, TreeConfig, kv_slots
from eagleviz.decoding.drafting import causal
from eagleviz.decoding.engine import Engine
from eagleviz.decoding.policy import HeadRest, Ledger
from eagleviz.decoding.steps import decode_path
from eagleviz.models.draft import DraftHead, random_head
from eagleviz.decoding.engine import FED_AHEAD
from eagleviz.models.host import Landing, counting_reads
from eagleviz.models.static import BUCKETS, Replay, StaticSteps, StepOutput, Uncaptured, bucket, capacity_bucket
from eagleviz.models.target import TargetModel
from eagleviz.models import layers
from kernels import layer_ops
from kernels import tree_attention as ta
from kernels.tree_attention import ancestor_mask, interpreting
from tiny import CPU_COSTS, Counting, Recording, tiny_target

PROMPT = "12345 1234 123"


class Refusing(Recording):
    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.fixture(scope="module")
def target() -> TargetModel:
    """A tiny model on PyTorch's operations (as a GPU runs them: no C layer)."""
    t = tiny_target()
    return TargetModel(t.hf, t.tokenizer, t.name, fused=False)


def engine(target, decode: str, graphs=None, **kwargs) -> Engine:
    e = Engine(target, random_head(target, "eagle1", seed=1, std=0.5), "random", decode=decode,
               compiled_sampling=False, **kwargs)
    if graphs is not None:
        e.make_graphs = lambda: graphs
    return e


def test_a_replay_holds_what_its_capture_read_and_a_read_of_a_freed_tensor_fails():
    """A CUDA graph holds the addresses of what its recorded call read: a tensor made before the capture and held
    by the step's closure alone lives as long as the replay holds the step (`Replay`); the CPU's stand-in fails a
    replay that reads one freed since (on an H200 such reads made a cost-aware cycle keep nodes without their
    parents); a tensor the recorded call made itself is the record's own, and a view's memory lives while the
    tensor it views does."""
    def step_over(values):
        mask = torch.tensor(values)           # made before the capture, held by the closure alone
        return lambda: (mask + torch.tensor([10.0, 20.0])).sum()   # the second made by the call itself

    replay = Recording(warmup=1).capture(step_over([1.0, 2.0]))
    gc.collect()
    assert isinstance(replay, Replay) and replay().item() == 33.0 and replay().item() == 33.0
    bare = Replay(replay.run, None)           # a graph's addresses without the step that held their tensors
    del replay
    gc.collect()
    with pytest.raises(AssertionError, match="freed since"):
        bare()
    # a view made for the step, of a buffer that lives on: its memory lives, whatever becomes of the view
    def step_on(rows):
        part = rows[2:4]
        return lambda: part * 2

    buffer = torch.arange(6.0)
    bare = Replay(Recording(warmup=1).capture(step_on(buffer)).run, None)
    gc.collect()
    buffer[2:4] = torch.tensor([5.0, 7.0])
    assert bare().tolist() == [10.0, 14.0]


def test_a_five_kernel_state_holds_the_rope_tables_its_graphs_read(wide_heads):
    """The five-kernel layer reads RoPE from the target's tables; a larger state grows them (new tensors): a
    state's own tables (`StaticSteps.rope`), which its graphs read, stay alive with it."""
    import weakref

    _, products = wide_heads
    small = StaticSteps(products, 64, "torch", None, Recording(freeze=False))
    read = weakref.ref(small.rope[0])
    large = StaticSteps(products, 4 * small.cache.capacity, "torch", None, Recording(freeze=False))
    gc.collect()
    assert large.rope[0] is not small.rope[0] and large.rope[0].shape[0] > small.rope[0].shape[0]
    assert read() is small.rope[0]


def test_buckets_hold_every_step_size_and_capacities_are_shared():
    assert [bucket(n) for n in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="at most 64"):
        bucket(65)
    assert capacity_bucket(100, 8192) == capacity_bucket(512, 8192) == 512
    assert capacity_bucket(513, 8192) == 1024 and capacity_bucket(900, 700) == 900  # never below what a run needs


@torch.inference_mode()
def test_a_static_step_is_the_eager_forward_over_a_used_cache(target):
    """Prefill, plain steps, a tree and a step of more than the largest bucket, against the eager forward; the
    static cache first holds keys of a longer run (which a step must not see)."""
    steps = StaticSteps(target, 160, "torch", None, Recording())
    steps.forward(list(range(1, 31)), list(range(30)), causal(30, "cpu"))
    steps.reset()
    ref = target.new_cache(256)
    ids = [3, 4, 5, 6, 7, 1, 2]

    def step(*args) -> StepOutput:  # a copy: the bucket's next step rewrites its outputs, as a graph's replay does
        out = steps.forward(*args)
        return StepOutput(out.logits.clone(), out.features.clone(), out.argmax.clone())

    pairs = [(target.forward(torch.tensor(ids), torch.arange(7), ref, causal(7, "cpu")),
              step(ids, list(range(7)), causal(7, "cpu")))]
    token = int(pairs[-1][0].logits[-1].argmax())
    for _ in range(4):
        pairs.append((target.forward(torch.tensor([token]), torch.tensor([ref.length]), ref, None),
                      step([token], [steps.cache.length], None)))
        token = int(pairs[-1][0].logits[0].argmax())
    for size in (6, 70):  # a bucket of 8, and beyond the buckets
        mask = ancestor_mask(torch.tensor([-1] + [(i - 1) // 2 for i in range(1, size)]))
        depths = mask.sum(1) - 1
        pos = (ref.length + depths).tolist()
        toks = [(7 * i) % 31 + 1 for i in range(size)]
        pairs.append((target.forward(torch.tensor(toks), torch.tensor(pos), ref, mask), step(toks, pos, mask)))
    assert steps.cache.length == ref.length == 7 + 4 + 6 + 70
    for eager, static in pairs:
        assert torch.allclose(eager.logits, static.logits, atol=1e-5, rtol=0)
        assert torch.allclose(eager.features, static.features, atol=1e-5, rtol=0)
        assert torch.equal(static.argmax, static.logits.argmax(-1))
    assert torch.allclose(steps.cache.k[:, :, :ref.length], ref.k[:, :, :ref.length], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("tree", [None, TreeConfig.create(4, 2, 8, adaptive=False), TreeConfig.create(),
                                  TreeConfig.create(3, 8, 70, adaptive=False)], ids=["plain", "fixed", "default", "70"])
def test_the_static_path_decodes_the_eager_paths_tokens(target, tree, temperature):
    """The same tokens and accepted paths; the run's clock (`Ledger`) is left out, since the two paths take
    different times and it rests the head by time."""
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=40, seed=3)
    runs = {d: engine(target, d, Recording() if d == "static" else None, ledger=False).generate(PROMPT, tree, sampling)
            for d in ("eager", "static")}
    assert [o.token for o in runs["static"].output] == [o.token for o in runs["eager"].output]
    if tree is not None:
        assert [c.path for c in runs["static"].cycles] == [c.path for c in runs["eager"].cycles]
    assert "static cache" in " ".join(runs["static"].notes) and runs["eager"].notes == []


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_captured_steps_make_the_uncaptured_steps_runs_cycle_for_cycle(target, temperature, monkeypatch):
    """A replay rewrites its outputs in place (`Recording`, as a CUDA graph): what a run keeps of a step past the
    next step of its size (a resting cycle's features row, which the head encodes when it next drafts) must be a
    copy. The same run over uncaptured steps (new outputs each step, the same sizes, so the same sums) writes the
    same trace, drafted tokens and all; the head rests three cycles in four (a schedule in place of the run's
    clock, which would rest it by time), so it drafts again after resting stretches."""

    def head_runs(rest: HeadRest) -> bool:
        rest.calls = getattr(rest, "calls", 0) + 1
        return rest.calls % 4 == 1

    monkeypatch.setattr(HeadRest, "head_runs", head_runs)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=48, seed=3)
    tree = TreeConfig.create(source="eagle")
    runs = [engine(target, "static", graphs, costs=CPU_COSTS, ledger=False).generate(PROMPT, tree, sampling)
            for graphs in (Recording(), Uncaptured())]
    kinds = "".join("d" if c.draft_levels else "r" for c in runs[0].cycles)
    assert "rrd" in kinds  # a drafted cycle after a resting stretch (two or more plain steps)
    for captured, uncaptured in zip(*(r.cycles for r in runs)):
        assert dataclasses.replace(captured, timings_ms={}) == dataclasses.replace(uncaptured, timings_ms={})


@torch.inference_mode()
def test_capturing_a_bucket_mid_run_leaves_the_committed_keys_alone(target):
    steps = StaticSteps(target, 96, "torch", None, Recording(warmup=3))
    steps.forward(list(range(1, 21)), list(range(20)), causal(20, "cpu"))
    before = steps.cache.k[:, :, :20].clone(), steps.cache.v[:, :, :20].clone()
    steps.forward([5, 6, 7], [20, 21, 21], ancestor_mask(torch.tensor([-1, 0, 0])))  # bucket 4: captured now
    assert torch.equal(steps.cache.k[:, :, :20], before[0]) and torch.equal(steps.cache.v[:, :, :20], before[1])
    assert steps.graphs.captures == 2 and set(steps._replays) == {4, 32}


class Shapes(TorchDispatchMode):
    """Records each operation with the shapes of its tensor arguments."""

    def __init__(self):
        super().__init__()
        self.seen: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.seen.add((str(func), shapes))
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def test_after_warm_up_no_step_makes_a_new_shape(target):
    """What a replayed graph needs: every plain step of a 128-token run runs the same operations on the same
    shapes (the eager forward's attention grows with the cache, so its shapes change every step)."""
    steps = StaticSteps(target, 160, "torch", None, Recording())
    steps.forward([1, 2, 3], [0, 1, 2], causal(3, "cpu"))
    steps.forward([4], [3], None)  # the warm-up: the plain step's bucket captured
    per_step = []
    for i in range(128):
        with Shapes() as mode:
            steps.forward([i % 30 + 1], [steps.cache.length], None)
        per_step.append(mode.seen)
    assert all(seen == per_step[0] for seen in per_step[1:])
    eager = target.new_cache(160)
    shapes = []
    for i in range(2):
        with Shapes() as mode:
            target.forward(torch.tensor([i + 1]), torch.tensor([i]), eager, None)
        shapes.append(mode.seen)
    assert shapes[0] != shapes[1]  # the contrast: why the eager forward cannot be replayed


class Ops(TorchDispatchMode):
    """Counts the operations that do work (views, dtype no-ops and detaches cost no kernel) and the host reads
    that bypass `to_host` (an `.item()` or `int(tensor)` dispatches `_local_scalar_dense`)."""

    FREE = ("view", "transpose", "unsqueeze", "select", "slice", "split", "chunk", "reshape", "diagonal",
            "alias", "detach", "lift_fresh", "to.dtype", "to.device", "expand", "t.default", "permute", "_unsafe_view")

    def __init__(self):
        super().__init__()
        self.work, self.items = Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).removeprefix("aten.")
        if name.startswith("_local_scalar_dense"):
            self.items += 1
        elif not any(name.startswith(free) for free in self.FREE):
            self.work[name] += 1
        return func(*args, **(kwargs or {}))


OPS_PER_LAYER = 30  # PyTorch's operations (kernels on a GPU) per decoder layer of a plain step, unfused
FUSED_PER_LAYER = 9  # with kernels.layer_ops and the Triton attention: the docstring of kernels/layer_ops.py
FIXED = 30  # embedding, RoPE's angles, the step's mask and slots, the final norm, logits, argmax; staging


@torch.inference_mode()
def test_a_plain_step_stays_within_its_operation_budget(target):
    steps = StaticSteps(target, 96, "torch", None, Recording(freeze=False))  # the step's own operations
    steps.forward([1, 2], [0, 1], causal(2, "cpu"))
    steps.forward([3], [2], None)  # bucket 1 captured
    with Ops() as ops:
        steps.forward([4], [3], None)
    total = sum(ops.work.values())
    assert ops.items == 0
    assert total <= OPS_PER_LAYER * target.num_layers + FIXED, ops.work.most_common()


@pytest.fixture(scope="module")
def fused_target(target) -> TargetModel:
    """The tiny model with the fused layer kernels, run by Triton's interpreter (as a GPU's steps run)."""
    if not interpreting():
        pytest.skip("the fused layer kernels run on a CPU only in Triton's interpreter (TRITON_INTERPRET=1)")
    return TargetModel(target.hf, target.tokenizer, target.name, fused=False, layer_kernels=True)


@torch.inference_mode()
def test_fused_layer_kernels_give_the_eager_forwards_results(fused_target, target):
    steps = StaticSteps(fused_target, 96, "triton", None, Recording(warmup=0, freeze=False))
    ref = target.new_cache(96)
    mask = ancestor_mask(torch.tensor([-1, 0, 0, 1, 1, 2]))
    cases = [([3, 4, 5, 6, 7], list(range(5)), causal(5, "cpu")), ([9], [5], None),
             ([1, 2, 3, 4, 5, 6], [6, 7, 7, 8, 8, 8], mask)]
    for tokens, pos, m in cases:
        want = target.forward(torch.tensor(tokens), torch.tensor(pos), ref, m)
        got = steps.forward(tokens, pos, m)
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=0)
        assert torch.allclose(got.features, want.features, atol=1e-4, rtol=0)
    assert torch.allclose(steps.cache.k[:, :, :ref.length], ref.k[:, :, :ref.length], atol=1e-5, rtol=0)


@pytest.fixture
def launches(monkeypatch) -> Counter:
    """Each Triton launch (the fused layer kernels, the attention), counted by name and run with an operation
    count suspended, since the interpreter's own copies are no kernels."""
    counts = Counter()

    def counted(name, fn):
        def launch(*args, **kwargs):
            counts[name] += 1
            with _disable_current_modes():
                return fn(*args, **kwargs)
        return launch

    monkeypatch.setattr(layer_ops, "add_rms_norm", counted("add_rms_norm", layer_ops.add_rms_norm))
    monkeypatch.setattr(layer_ops, "silu_mul", counted("silu_mul", layer_ops.silu_mul))
    monkeypatch.setattr(layers, "rope_store", counted("rope_store", layers.rope_store))
    monkeypatch.setattr(ta, "_launch", counted("attention", ta._launch))
    return counts


@torch.inference_mode()
def test_fused_layer_kernels_bring_a_plain_step_to_nine_launches_a_layer(fused_target, launches):
    """Kernels a GPU would launch for one plain step: PyTorch's operations that do work, plus each Triton
    launch counted once."""
    ops = Ops()
    steps = StaticSteps(fused_target, 96, "triton", None, Recording(warmup=0, freeze=False))
    steps.forward([1, 2], [0, 1], causal(2, "cpu"))
    steps.forward([3], [2], None)
    launches.clear()
    with ops:
        steps.forward([4], [3], None)
    layers_n = fused_target.num_layers
    assert launches == {"add_rms_norm": 2 * layers_n + 1, "silu_mul": layers_n, "rope_store": layers_n,
                        "attention": layers_n}
    assert ops.work["linear.default"] == 4 * layers_n + 1 and ops.items == 0
    total = sum(ops.work.values()) + sum(launches.values())
    assert total <= FUSED_PER_LAYER * layers_n + FIXED, (ops.work.most_common(), launches)


PRODUCTS_PER_LAYER = 5  # with kernels.layer_products and the Triton attention: its docstring
PRODUCTS_FIXED = 5  # the embedding, P as int32 (the attention's), the final norm, the LM head, the argmax


@pytest.fixture(scope="module")
def wide_heads():
    """A tiny model whose heads are 32 wide (the five-kernel layer's RoPE holds a head's halves as tl.dot tiles:
    SmolLM2's are 64), on PyTorch's operations and on the five-kernel layer in Triton's interpreter."""
    from eagleviz.models.synthetic import random_hf_model
    from tiny import TinyTokenizer

    if not interpreting():
        pytest.skip("the layer kernels run on a CPU only in Triton's interpreter (TRITON_INTERPRET=1)")
    shape = {"model_type": "llama", "vocab_size": 32, "hidden_size": 128, "intermediate_size": 160,
             "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
             "max_position_embeddings": 256, "tie_word_embeddings": False}
    hf = random_hf_model(shape, 3)
    return (TargetModel(hf, TinyTokenizer(), "tiny-wide", fused=False),
            TargetModel(hf, TinyTokenizer(), "tiny-wide", fused=False, layer_kernels="products"))


@torch.inference_mode()
def test_the_five_kernel_layer_gives_the_eager_forwards_results(wide_heads):
    from eagleviz.perf.bench import layer_kernels

    target, products = wide_heads
    assert products.layer_products and not target.layer_products
    assert (layer_kernels(products), layer_kernels(target)) == ("products", "torch")   # what a bench JSON says
    steps = StaticSteps(products, 96, "triton", (0, 2), Recording(warmup=0, freeze=False))
    ref = target.new_cache(96)
    mask = ancestor_mask(torch.tensor([-1, 0, 0, 1, 1, 2]))
    cases = [([3, 4, 5, 6, 7], list(range(5)), causal(5, "cpu")), ([9], [5], None),
             ([1, 2, 3, 4, 5, 6], [6, 7, 7, 8, 8, 8], mask)]
    for tokens, pos, m in cases:
        want = target.forward(torch.tensor(tokens), torch.tensor(pos), ref, m, feature_layers=(0, 2))
        got = steps.forward(tokens, pos, m)
        assert torch.allclose(got.logits, want.logits, atol=1e-4, rtol=0)
        assert torch.allclose(got.features, want.features, atol=1e-4, rtol=0)
    assert torch.allclose(steps.cache.k[:, :, :ref.length], ref.k[:, :, :ref.length], atol=1e-5, rtol=0)
    assert torch.allclose(steps.cache.v[:, :, :ref.length], ref.v[:, :, :ref.length], atol=1e-5, rtol=0)


@pytest.mark.parametrize("features", [None, (0, 2)], ids=["plain", "features"])
@torch.inference_mode()
def test_the_five_kernel_layer_is_five_launches_a_layer(wide_heads, launches, monkeypatch, features):
    """A plain step on the five-kernel layer: five launches a layer and PRODUCTS_FIXED besides (the embedding, P as
    int32, the final norm, the LM head, the argmax: RoPE read from its tables and the slots counted in the q/k/v
    product, a one-token step's mask a constant); an EAGLE-3 step's features add their copies."""
    count_head_kernels(launches, monkeypatch)
    products = wide_heads[1]
    ops = Ops()
    steps = StaticSteps(products, 96, "triton", features, Recording(warmup=0, freeze=False))
    steps.forward([1, 2], [0, 1], causal(2, "cpu"))
    steps.forward([3], [2], None)
    launches.clear()
    with ops:
        steps.forward([4], [3], None)
    layers_n = products.num_layers
    assert launches == {"norm_qkv_rope": layers_n, "matmul_residual": 2 * layers_n, "norm_gate_up": layers_n,
                        "attention": layers_n, "add_rms_norm": 1}
    assert ops.work["linear.default"] == 1 and ops.items == 0          # the LM head: every other product fused
    total = sum(ops.work.values()) + sum(launches.values())
    copies = 0 if features is None else len(features) + 1             # each layer's rows kept, then joined
    assert total <= PRODUCTS_PER_LAYER * layers_n + PRODUCTS_FIXED + copies, (ops.work.most_common(), launches)
    # SmolLM2-135M's 30 layers: a plain token in 155 kernels (five a layer, five besides), within the bar of 160
    assert PRODUCTS_PER_LAYER * 30 + PRODUCTS_FIXED <= 160


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
@torch.inference_mode()
def test_greedy_eagle_on_the_five_kernel_layer_writes_plain_decodings_tokens(wide_heads, arch):
    """fp32 on the five-kernel layer: EAGLE's greedy tokens are plain decoding's, the default tree and a fixed
    one, and both are PyTorch's eager plain decoding's; an EAGLE-3 head's drafting on the same products (the fixed
    tree). (An EAGLE-3 head's run leaves out the products' own plain run: the layer's forward is held to the eager
    one's by `test_the_five_kernel_layer_gives_the_eager_forwards_results`; the EAGLE-1 run, in the slow suite,
    keeps it.)"""
    target, products = wide_heads
    sampling = SamplingConfig(max_new_tokens=10)  # several cycles of each tree (in Triton's interpreter)
    outputs = {}
    for name, model, decode in (("eager", target, "eager"), ("products", products, "static")):
        e = Engine(model, random_head(model, arch, seed=1, std=0.5), "random", decode=decode, compiled_sampling=False)
        e.make_graphs = lambda: Recording(warmup=0, freeze=False)
        ids = e.encode_prompt(PROMPT)
        # (an EAGLE-3 head: the fixed tree alone, each of its cycles drafted; the interpreter makes a run ~10 s)
        trees = (TreeConfig.create(),) * (arch == "eagle1") + (TreeConfig.create(3, 2, 6, adaptive=False),)
        plain = (None,) if name == "eager" or arch == "eagle1" else ()
        for tree in (*plain, *trees):
            run = e.new_run(PROMPT, ids, tree, sampling)
            for _ in e.plain(ids, sampling, run) if tree is None else e.speculate(ids, tree, sampling, run):
                pass
            outputs[name, tree is None] = outputs.get((name, tree is None), []) + [run.token_ids]
    runs = [ids for v in outputs.values() for ids in v]
    assert all(r == runs[0] for r in runs) and len(runs[0]) == 10, outputs


def count_head_kernels(launches: Counter, monkeypatch) -> None:
    """`launches` counts the kernels a head's drafting launches beside the layer kernels: the five-kernel layer's
    products, a level's children and its frontier (each run with the operation count suspended)."""
    from kernels import draft_select, layer_products as lp

    for module, names in ((lp, ("norm_qkv_rope", "matmul_residual", "norm_gate_up", "norm_matmul")),
                          (draft_select, ("log_softmax_topk", "frontier"))):
        for name in names:
            def counted(*args, _fn=getattr(module, name), _name=name, **kwargs):
                launches[_name] += 1
                with _disable_current_modes():
                    return _fn(*args, **kwargs)
            monkeypatch.setattr(module, name, counted)


def drafted_on(models, head: DraftHead, tree: TreeConfig, arch: str, launches: Counter) -> tuple[list, list, list]:
    """The same head's captured drafting over each of `models` (their engines' `DeviceDrafter`), three pending
    positions: what each drafted (ids, log-probabilities, frontiers), its kernels (PyTorch's operations that do
    work, plus each Triton launch counted) and whether the engine's head ran the layer kernels."""
    from eagleviz.decoding.device_draft import DeviceDrafter

    drafted, kernels, fused = [], [], []
    for model in models:
        e = Engine(model, head, "random", decode="static", compiled_sampling=False, ledger=False)
        fused.append(e.head.layer_kernels)
        drafter = DeviceDrafter(e, 96, tree, Recording(warmup=0, freeze=False))
        c = e.head.config
        feats = torch.randn(3, c.feature_size if arch == "eagle3" else c.hidden_size, dtype=model.dtype,
                            generator=torch.Generator().manual_seed(0))
        drafter.draft(feats, [5, 6, 7])  # the bucket's capture
        drafter.reset()
        launches.clear()
        with Ops() as ops:
            drafted.append(drafter.draft(feats, [5, 6, 7]))
        kernels.append(sum(ops.work.values()) + sum(launches.values()))
    return drafted, kernels, fused


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_the_heads_children_in_one_kernel_draft_what_pytorch_drafts(wide_heads, arch, launches, monkeypatch):
    """Where the target runs the five-kernel layer, each drafted level's children (log-softmax, top-k, target ids)
    are one kernel (`kernels.draft_select`): the same tokens, log-probabilities (to rounding) and frontiers as
    PyTorch's operations, one launch a level, and fewer kernels a drafting."""
    count_head_kernels(launches, monkeypatch)
    target, products = wide_heads
    head, tree = random_head(target, arch, seed=1, std=0.5), TreeConfig.create(4, 2, 8, adaptive=False)
    drafted, kernels, _ = drafted_on((target, products), head, tree, arch, launches)
    (ids, logprobs, fronts), (f_ids, f_logprobs, f_fronts) = drafted
    assert f_ids == ids and f_fronts == fronts
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4) for a, b in zip(logprobs, f_logprobs))
    assert launches["log_softmax_topk"] == tree.steps
    print(f"{arch}: {kernels[0]} kernels a drafting on PyTorch's operations, {kernels[1]} on the layer products")
    assert kernels[1] < kernels[0], kernels


def _shaped_head(target, layers_n: int, norm_first: bool) -> DraftHead:
    """A random EAGLE-3 head whose norms are not ones (a norm's weight read in the wrong place shows)."""
    head = random_head(target, "eagle3", seed=1, std=0.5, num_layers=layers_n)
    head.config = dataclasses.replace(head.config, norm_before_residual=norm_first)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
    return head


@pytest.mark.parametrize("layers_n,norm_first,k,deep", [(1, True, 4, 5), (2, False, 2, 3)])
def test_an_eagle3_heads_levels_on_the_five_kernel_layer_are_eight_kernels_each(wide_heads, launches, monkeypatch,
                                                                               layers_n, norm_first, k, deep):
    """Where the target runs the five-kernel layer, an EAGLE-3 head's captured drafting runs its layers as the same
    products (`DraftHead.step_products`), each level's frontier, rows and ancestry in one kernel
    (`draft_select.frontier`), its logits' norm in the LM head's prologue: the tokens, frontiers and (to
    rounding) log-probabilities PyTorch's operations draft, in 3 + 5 kernels a layer a level (8 for a one-layer
    head: ~40 before), and a drafting's fixed kernels few."""
    from eagleviz.decoding.device_draft import DeviceDrafter

    count_head_kernels(launches, monkeypatch)
    target, products = wide_heads
    head = _shaped_head(target, layers_n, norm_first)
    per_depth = {}
    for steps in (2, deep):   # (a two-layer head one level deeper only: each level ~10 s in the interpreter)
        tree = TreeConfig.create(steps, k, 1 + k * steps, adaptive=False)
        drafted, kernels, _ = drafted_on((target, products), head, tree, "eagle3", launches)
        (ids, logprobs, fronts), (p_ids, p_logprobs, p_fronts) = drafted
        assert p_ids == ids and p_fronts == fronts
        assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4) for a, b in zip(logprobs, p_logprobs))
        assert launches["frontier"] == steps - 1 and launches["norm_qkv_rope"] == steps * layers_n
        per_depth[steps] = kernels
    per_level = (per_depth[deep][1] - per_depth[2][1]) / (deep - 2)
    assert per_level == 3 + 5 * layers_n, per_depth
    assert per_depth[deep][0] - per_depth[2][0] >= (deep - 2) * 25, per_depth   # PyTorch's operations: ~40 a level
    e = Engine(products, head, "random", attn_impl="triton", decode="static", compiled_sampling=False, ledger=False)
    assert DeviceDrafter(e, 96, TreeConfig.create(), Recording()).products
    # a drafting's fixed kernels: the fused features' product, the encoded rows' five a layer, the last row
    # picked, P as int32 twice, S, the last row's offset; plus the read and the stand-in's staging writes
    assert per_depth[2][1] - 2 * per_level - 5 * layers_n <= 16, per_depth


def test_the_five_kernel_layer_is_refused_in_words_where_it_cannot_run(target, monkeypatch):
    with pytest.raises(ValueError, match="multiple of 32"):
        TargetModel(target.hf, target.tokenizer, target.name, fused=False, layer_kernels="products")
    monkeypatch.setenv("EAGLEVIZ_LAYER_KERNELS", "products")           # asked by the environment: taken if it can
    assert not TargetModel(target.hf, target.tokenizer, target.name, fused=False).layer_products


@pytest.mark.parametrize("decode", ["static", "eager"])
@pytest.mark.parametrize("tree", [None, TreeConfig.create(5, 4, 16, adaptive=False), TreeConfig.create()],
                         ids=["plain", "fixed", "default"])
def test_reads_of_device_values(target, tree, decode):
    """A plain step reads the device once (the token). A greedy EAGLE cycle over static steps reads once: a
    resting cycle its token, a drafted one its record (`device_cycle`), except a drafted cycle with a lookup's
    chain to merge: twice (the whole drafting once, `device_draft`, and the verdict once). The host's drafting
    (eager, a CPU's path) reads once per level. Nothing reads past the counted helper."""
    e = engine(target, decode, Recording() if decode == "static" else None)
    sampling = SamplingConfig(max_new_tokens=48)
    ids = e.encode_prompt(PROMPT)
    run = e.new_run(PROMPT, ids, tree, sampling)
    with Ops() as ops, counting_reads() as reads:
        for _ in e.plain(ids, sampling, run) if tree is None else e.speculate(ids, tree, sampling, run):
            pass
    assert ops.items == 0
    if tree is None:
        assert reads[0] == len(run.output)  # the prefill's, then one a step
    elif decode == "static":
        assert reads[0] == 1 + sum(1 + (c.lookup_ngram > 0 and c.draft_levels > 0) for c in run.cycles)
    else:
        assert reads[0] == 1 + sum(1 + c.draft_levels for c in run.cycles)


def test_a_capture_that_fails_falls_back_and_says_so(target):
    """The run's notes say why, and its decode path is the one taken: static steps uncaptured, not graphs."""
    tree, sampling = TreeConfig.create(4, 2, 8, adaptive=False), SamplingConfig(max_new_tokens=16)
    runs = {}
    for graphs in (Refusing(), Recording()):
        e = engine(target, "static", graphs)
        e.decode = "graphs"  # as a GPU's engine is labelled (the stand-ins capture on a CPU)
        runs[type(graphs)] = e.generate(PROMPT, tree, sampling)
    run, want = runs[Refusing], engine(target, "eager").generate(PROMPT, tree, sampling)
    assert [o.token for o in run.output] == [o.token for o in want.output]
    assert any(n.startswith("CUDA-graph capture failed (RuntimeError: operation not permitted") for n in run.notes)
    assert run.decode == "static" and runs[Recording].decode == "graphs" and want.decode == "eager"


def test_runs_lease_states_and_never_share_one(target):
    e = engine(target, "static", Recording())
    sampling = SamplingConfig(max_new_tokens=8)
    ids = e.encode_prompt(PROMPT)
    a, b = (e.plain(ids, sampling, e.new_run(PROMPT, ids, None, sampling)) for _ in range(2))
    next(a), next(b)  # two runs at once: two states
    assert e.pool.free() == 0
    for _ in a:
        pass
    b.close()  # a run stopped early gives its state back too
    assert e.pool.free() == 2


def test_the_decode_path_by_device():
    assert decode_path("auto", "cpu") == ("eager", [])
    assert decode_path("auto", "cuda")[0] == "graphs"
    assert "captured at 1, 2, 4, 8, 16, 32, 64 tokens" in decode_path("graphs", "cuda")[1][0]
    assert BUCKETS[-1] == 64
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        decode_path("graphs", "cpu")
    with pytest.raises(ValueError, match="must be one of"):
        decode_path("fast", "cpu")


def test_a_zerogpu_space_decodes_eagerly_and_says_so(monkeypatch):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    path, notes = decode_path("auto", "cuda")
    assert path == "eager" and "ZeroGPU" in notes[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_resting_cycle_is_a_plain_step_read_once(target, temperature, monkeypatch):
    """Outside the step's replay (what a GPU's host does), a cycle whose head rests does what a plain step does:
    one read of the device, greedy and sampled (the draw, the argmax and its probability together), no hidden
    read (`probs[index]` with an index tensor would read it), and at most three more operations (the argmax's
    probability for the trace, and keeping the root's features for the head)."""
    replay = StaticSteps._replay

    def uncounted(self, b):
        step = replay(self, b)

        def run():
            with _disable_current_modes():
                return step()
        return run

    monkeypatch.setattr(StaticSteps, "_replay", uncounted)
    e = engine(target, "static", Recording())
    sampling = SamplingConfig(max_new_tokens=24, temperature=temperature)
    ids = e.encode_prompt(PROMPT)
    seen = {}
    for kind, tree in (("plain", None), ("rest", TreeConfig.create(source="eagle"))):
        if tree is not None:
            monkeypatch.setattr(HeadRest, "head_runs", lambda self: False)
        run = e.new_run(PROMPT, ids, tree, sampling)
        steps = e.plain(ids, sampling, run) if tree is None else e.speculate(ids, tree, sampling, run)
        next(steps), next(steps)  # the prefill, and a first step (a resting cycle: the head never runs)
        with Ops() as ops, counting_reads() as reads:
            n = sum(1 for _ in steps)
        work = {k: v for k, v in ops.work.items() if not k.startswith("resolve_")}  # a CPU's `tolist`
        seen[kind] = (sum(work.values()) / n, reads[0] / n, ops.items, work)
    assert all(c.draft_levels == 0 and len(c.tokens) == 1 for c in run.cycles)
    (plain_ops, plain_reads, _, _), (rest_ops, rest_reads, items, work) = seen["plain"], seen["rest"]
    assert plain_reads == rest_reads == 1 and items == 0 and "item.default" not in work
    assert rest_ops <= plain_ops + 3, (seen["plain"][3], work)


@pytest.fixture
def queued(monkeypatch):
    """Static steps that return before their kernels finish, as a GPU's do (`StaticSteps.queued`)."""
    init = StaticSteps.__init__

    def made(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.queued = True

    monkeypatch.setattr(StaticSteps, "__init__", made)


def landings(monkeypatch) -> list[tuple[str, int]]:
    """The order in which the fed-back steps' tokens are sent to the host and read (`Landing`)."""
    seen = []
    send, read = Landing.send, Landing.read
    monkeypatch.setattr(Landing, "send", lambda self, j, value: seen.append(("send", j)) or send(self, j, value))
    monkeypatch.setattr(Landing, "read", lambda self, j: seen.append(("read", j)) or read(self, j))
    return seen


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_plain_decoding_fed_back_on_the_device_writes_the_eager_paths_tokens(target, queued, monkeypatch,
                                                                             temperature, top_p):
    """Over queued static steps, plain decoding replays one step that writes its own token, prefix and position
    as the next step's inputs (`StaticSteps.fed_back`; recorded once and replayed without its Python, as a CUDA
    graph: a host number it read would stay the capture's), launched up to FED_AHEAD steps ahead of the host's
    reads: the eager path's tokens, greedy and sampled (its draw on the device from a uniform the host writes
    before each launch, one draw of the run's generator a step), one read a token, each token read after its
    step was launched and never more than FED_AHEAD steps in flight; where the host is quick, FED_AHEAD are."""
    seen = landings(monkeypatch)
    sampling = SamplingConfig(max_new_tokens=40, temperature=temperature, top_p=top_p, seed=3)
    graphs = Counting()
    e = engine(target, "static", graphs)
    ids = e.encode_prompt(PROMPT)
    fed = 1 if sampling.greedy else 2  # the greedy step fed back, and the one drawn at this temperature
    assert e.prepare(kv_slots(len(ids), 40, None), sampling=sampling) == len(BUCKETS) + fed  # captured beforehand
    captures, replays = graphs.captures, graphs.replays
    run = e.new_run(PROMPT, ids, None, sampling)
    with counting_reads() as reads:
        for _ in e.plain(ids, sampling, run):
            pass
    assert graphs.captures == captures
    eager = engine(target, "eager").generate(PROMPT, None, sampling)
    assert [o.token for o in run.output] == [o.token for o in eager.output] and len(run.output) == 40
    if not sampling.greedy:  # the draws themselves, not a distribution whose argmax every path would write
        assert len({o.token for o in run.output}) > 10
    assert reads[0] == len(run.output)  # the prefill's token, then one read a step
    sent, flight = set(), []
    for kind, j in seen:
        if kind == "send":
            sent.add(j)
        else:
            assert j in sent
            flight.append(len(sent) - j)
    assert max(flight) == FED_AHEAD and len(sent) == 39
    assert graphs.replays - replays == 39 + 1  # a replay a step (and the prefill's chunk): nothing written between


def test_a_run_fed_back_on_the_device_ends_at_its_end_of_sequence_and_leaves_its_state_whole(target, queued,
                                                                                          monkeypatch):
    """Steps launched past an end of sequence the host reads later are dropped: the run ends with plain decoding's
    tokens, its cache's length is the committed slots, and the next run over the same state writes its own
    tokens again; a context that fills ends the run as plain decoding's does ("context")."""
    sampling = SamplingConfig(max_new_tokens=40)
    eager = engine(target, "eager").generate(PROMPT, None, sampling)
    end = eager.output[12].token
    monkeypatch.setattr(target, "eos_token_ids", frozenset({end}))
    want = [o.token for o in engine(target, "eager").generate(PROMPT, None, sampling).output]
    assert want[-1] == end and len(want) <= 13
    e = engine(target, "static", Recording())
    kept = []  # each run's state as it is given back: its committed length, and its keys of those slots
    release = e.pool.give_back
    monkeypatch.setattr(e.pool, "give_back", lambda state: kept.append(
        (state.cache.length, state.cache.k[:, :, :state.cache.length].clone())) or release(state))
    for _ in range(2):
        assert [o.token for o in e.generate(PROMPT, None, sampling).output] == want
    ids = e.encode_prompt(PROMPT) + want[:-1]  # the last token is never fed through the model
    ref = target.new_cache(len(ids))
    with torch.inference_mode():
        target.forward(torch.tensor(ids), torch.arange(len(ids)), ref, causal(len(ids), "cpu"))
    for length, keys in kept:  # every committed key at its own position (rotated by it) and slot
        assert length == len(ids) and torch.allclose(keys, ref.k[:, :, :length], atol=1e-5, rtol=0)
    monkeypatch.setattr(target, "eos_token_ids", frozenset())
    monkeypatch.setattr(Engine, "_capacity", lambda self, n, sampling, tree: n + 9)
    full = e.generate(PROMPT, None, sampling)
    assert full.stop_reason == "context" and len(full.output) == 9
    assert [o.token for o in full.output] == [o.token for o in eager.output[:9]]


@pytest.mark.parametrize("source, ending, temperature", [("eagle", "limit", 0.0), ("eagle", "end of sequence", 0.0),
                                                         ("eagle+lookup", "limit", 0.0), ("eagle", "limit", 1.0),
                                                         ("eagle", "end of sequence", 0.7)])
def test_resting_stretches_fed_back_on_the_device_make_the_unqueued_runs_cycles(target, monkeypatch, source, ending,
                                                                               temperature):
    """Over queued static steps a stretch of resting cycles replays the step that feeds its token back
    (`Engine._rest_fed`), launched ahead of the host's reads; the head rests five cycles after each it drafts, so
    drafted cycles follow stretches of five. The cycles are the unqueued run's, field for field but their timings
    (sampled: the same draws of the run's generator, the target's argmax and its probability in each trace);
    each resting cycle's token is read once off its landing. An end of sequence read inside a stretch drops the
    steps launched after it; while the lookups look (each token decides whether the next cycle rests) no step is
    launched ahead of the read that decides, so none is dropped."""

    def head_runs(rest: HeadRest) -> bool:  # (HeadRest's own count, so a stretch takes all five at once)
        if rest.left:
            rest.left -= 1
            return False
        rest.left = 5
        return True

    monkeypatch.setattr(HeadRest, "head_runs", head_runs)
    sampling = SamplingConfig(max_new_tokens=48, temperature=temperature, top_p=0.9 if temperature == 0.7 else 1.0)
    tree = TreeConfig.create(source=source)

    def run():
        return engine(target, "static", Recording(), costs=CPU_COSTS, ledger=False).generate(PROMPT, tree, sampling)

    unqueued = run()
    if ending == "end of sequence":  # the first token a stretch writes before its last that the run had not yet
        cycles, written = unqueued.cycles, [unqueued.output[0].token]
        for k, c in enumerate(cycles[:-1]):
            if not c.draft_levels and not cycles[k + 1].draft_levels and c.bonus_token not in written:
                break
            written += c.committed
        monkeypatch.setattr(target, "eos_token_ids", frozenset({c.bonus_token}))
        unqueued = run()
        assert unqueued.cycles[-1].index == k
    seen = landings(monkeypatch)
    init = StaticSteps.__init__

    def marked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.queued = True

    monkeypatch.setattr(StaticSteps, "__init__", marked)
    queued = run()
    kinds = "".join("d" if c.draft_levels else "r" for c in queued.cycles)
    assert "drrrrrd" in kinds or ending != "limit"  # stretches of five between drafted cycles
    for a, b in zip(queued.cycles, unqueued.cycles, strict=True):
        assert dataclasses.replace(a, timings_ms={}) == dataclasses.replace(b, timings_ms={})
    sent = [j for kind, j in seen if kind == "send"]
    reads = [j for kind, j in seen if kind == "read"]
    resting = sum(not c.draft_levels and len(c.tokens) == 1 for c in queued.cycles)
    if source == "eagle":
        assert len(reads) == resting > (10 if ending == "limit" else 0)  # each resting token read once off its landing
        assert (len(sent) > len(reads)) == (ending == "end of sequence")  # dropped: only past an end of sequence
    else:
        assert resting > 3 and len(sent) == len(reads) == 0  # (the stretches' steps read one at a time, as before)


class Slow(Recording):
    """A capture that takes 0.2 s, as a first use of a CUDA graph's size takes tens of milliseconds on a GPU."""

    def capture(self, fn):
        time.sleep(0.2)
        return super().capture(fn)


def test_the_runs_clock_never_counts_a_captures_time(target, monkeypatch):
    """The `Ledger` judges the head by what its cycles take; a cycle that captured a graph (the target's step at
    a new size, or the head's drafting at a new pending size) took its capture's time once, so it is left out:
    otherwise a first resting cycle timed during a capture would make every drafted cycle look cheap."""
    seen = {}  # per ledger: the head's sees every cycle, the context's lookups' those the head did not run
    observe = Ledger.observe
    monkeypatch.setattr(Ledger, "observe",
                        lambda self, ms, *args: seen.setdefault(id(self), []).append(ms) or observe(self, ms, *args))
    graphs = Slow(warmup=0)
    run = engine(target, "static", graphs).generate(PROMPT, TreeConfig.create(), SamplingConfig(max_new_tokens=40))
    head = max(seen.values(), key=len)
    # how many cycles each ledger sees follows the run's own clock (resting stretches are judged as one): a busy
    # machine gives fewer, so the floor only asks that the ledger judged a run's worth
    assert graphs.captures >= 2 and 5 <= len(head) < len(run.cycles)
    assert all(len(times) < len(run.cycles) for times in seen.values())
    assert max(max(times) for times in seen.values()) < 200  # no capture's 0.2 s


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
@torch.inference_mode()
def test_the_heads_levels_on_the_layer_kernels_draft_what_pytorch_drafts_in_fewer_launches(target, fused_target,
                                                                                           arch, launches):
    """Where the target's steps fuse their small operations (a GPU's; here Triton's interpreter), the captured
    drafting runs the head's norms, RoPE with its cache writes and SwiGLU gate as the same Triton kernels
    (`DraftHead._stack_fused`): the tokens, log-probabilities (to rounding) and frontiers PyTorch's operations
    draft, in fewer kernels a drafting (PyTorch's operations that do work, plus each Triton launch)."""
    head, tree = random_head(target, arch, seed=1, std=0.5), TreeConfig.create(4, 2, 8, adaptive=False)
    drafted, kernels, fused = drafted_on((target, fused_target), head, tree, arch, launches)
    assert fused == [False, True]
    (ids, logprobs, fronts), (f_ids, f_logprobs, f_fronts) = drafted
    assert f_ids == ids and f_fronts == fronts
    # a random head's log-probabilities run to -2e5 by the last level: rounding is relative
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4) for a, b in zip(logprobs, f_logprobs))
    levels = tree.steps  # one head step encodes the pending positions (its last row drafts level 0), one a level
    assert launches["silu_mul"] == launches["rope_store"] == levels * head.config.num_layers
    assert kernels[0] - kernels[1] >= 10 * levels, kernels  # 223 -> 171 (EAGLE-1), 292 -> 184 (EAGLE-3)


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_a_static_prefill_replays_the_captured_steps_chunk_by_chunk(target, monkeypatch, arch):
    """Over static steps the prompt after the chat opening runs as the state's captured steps, a causal chain of at
    most BUCKETS[-1] tokens each (a prompt past the largest bucket in two): no eager forward of the target, one
    replay a chunk, nothing captured in the run after `Engine.prepare`; the first token and the prompt's features
    (the head's first input) are the eager prefill's."""
    prompt = "0123456789 " * 8  # ~90 tokens after the opening: chunks of 64 and the rest
    runs = {}
    for decode in ("static", "eager"):
        e = Engine(target, random_head(target, arch, seed=1, std=0.5), "random", decode=decode,
                   compiled_sampling=False)
        made: list[Counting] = []
        e.make_graphs = lambda: made.append(Counting()) or made[-1]
        ids = e.encode_prompt(prompt)
        n = len(ids) - e.prefix.covers(ids)
        assert n > BUCKETS[-1]
        tree = TreeConfig.create(3, 2, 4, adaptive=False, source="eagle")
        e.prepare(512, tree)
        eager_calls, forward = [], type(target).forward

        def counted(self, *args, **kwargs):
            eager_calls.append(args[0].numel())
            return forward(self, *args, **kwargs)

        monkeypatch.setattr(type(target), "forward", counted)
        run = e.new_run(prompt, ids, tree, SamplingConfig(max_new_tokens=1))
        before = sum(g.replays for g in made)
        steps = e.speculate(ids, tree, SamplingConfig(max_new_tokens=1), run)
        for _ in steps:
            pass
        monkeypatch.setattr(type(target), "forward", forward)
        replays = sum(g.replays for g in made) - before
        drafted = e.generate(prompt, tree, SamplingConfig(max_new_tokens=6)).cycles[0]  # from the prompt's features
        runs[decode] = run, eager_calls, replays, drafted
    (static, static_calls, replays, a), (eager, eager_calls, _, b) = runs["static"], runs["eager"]
    assert static_calls == [] and eager_calls == [n]
    assert replays == 2  # the prompt's two chunks, then the run ends at its first token
    assert static.output[0].token == eager.output[0].token
    assert [(x.token, x.parent) for x in a.nodes] == [(x.token, x.parent) for x in b.nodes]
    assert [x.prob for x in a.nodes] == pytest.approx([x.prob for x in b.nodes], rel=1e-4)
