"""kernels/cpu_ops.py: each compiled operation against the PyTorch code it replaces (bitwise in bf16 where
that code rounds step by step, within float tolerance for sums), attention against the tree-attention
reference over every branch of its loops, the build (one library per CPU, a clear reason when there is no
compiler), and TargetModel's use of it (the same logits as its PyTorch layer, the fallback, `fused=True`)."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

from kernels import capability, cpu_ops
from kernels.tree_attention import tree_attention_torch
from eagleviz.models.layers import apply_rope, rms_norm
from eagleviz.models.target import TargetModel
from tiny import compiled_or_fail, tiny_target, unbuilt


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return compiled_or_fail(cpu_ops.load, cpu_ops.last_error, tmp_path_factory.mktemp("kernels"), "kernels/cpu_ops.c")


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_delta", [False, True])
def test_rms_norm_matches_torch(ops, dtype, with_delta):
    h, delta = _randn(5, 576, dtype=dtype), _randn(5, 576, dtype=dtype, seed=1)
    weight = (1 + 0.3 * _randn(576, seed=2)).to(dtype)
    want_h = h + delta if with_delta else h.clone()
    want = rms_norm(want_h, weight, 1e-5)
    got = ops.rms_norm(h, weight, 1e-5, delta=delta if with_delta else None)
    assert torch.equal(h, want_h)  # the residual add happened in place, rounded like `h + delta`
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:  # the sum of squares runs in another order
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        ordered = ops.rms_norm(want_h.clone(), weight, 1e-5, ordered=True)
        torch.testing.assert_close(ordered, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_to_cache_rotates_q_and_writes_k_v_at_their_slots(ops, dtype):
    t, hq, hkv, d, cap, start, layer = 3, 6, 2, 32, 40, 17, 1
    qkv, cos, sin = _randn(t, (hq + 2 * hkv) * d, dtype=dtype), _randn(t, d, dtype=dtype, seed=1), _randn(t, d, dtype=dtype, seed=2)
    k_cache, v_cache = torch.full((3, hkv, cap, d), 7.0), torch.full((3, hkv, cap, d), 7.0)
    q = ops.rope_to_cache(qkv, cos, sin, k_cache, v_cache, layer, start, hq, hkv)
    q_ref, k_ref, v_ref = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    want_q, want_k = apply_rope(q_ref.view(t, hq, d), cos, sin), apply_rope(k_ref.view(t, hkv, d), cos, sin)
    exact = dtype == torch.bfloat16  # fp32 may fuse a multiply-add where PyTorch rounds twice
    check = torch.testing.assert_close if not exact else (lambda a, b: torch.testing.assert_close(a, b, atol=0, rtol=0))
    check(q, want_q.float())
    check(k_cache[layer, :, start:start + t], want_k.float().transpose(0, 1))
    assert torch.equal(v_cache[layer, :, start:start + t], v_ref.view(t, hkv, d).float().transpose(0, 1))
    written = torch.zeros_like(k_cache, dtype=torch.bool)
    written[layer, :, start:start + t] = True
    assert (k_cache[~written] == 7.0).all() and (v_cache[~written] == 7.0).all()  # nothing else touched


def test_rope_to_cache_refuses_to_overflow(ops):
    cache = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match="overflow"):
        ops.rope_to_cache(_randn(2, 48), _randn(2, 16), _randn(2, 16), cache, cache.clone(), 0, 3, 1, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul_matches_torch(ops, dtype):
    gate_up = _randn(4, 2 * 1536, dtype=dtype) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = ops.silu_mul(gate_up)
    if dtype == torch.bfloat16:  # exp differs from PyTorch's in the last float bits: a rare bf16 rounding flip
        assert (got != want).float().mean() < 0.01
        torch.testing.assert_close(got, want, atol=0, rtol=1e-2)
    else:
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rows,prefix,tree,d,group", [
    (1, 200, 1, 64, 3),    # a decode step, 201 keys: 12 tiles of 16 and a remainder of 9
    (8, 200, 8, 64, 3),    # an 8-token tree
    (16, 31, 16, 128, 1),  # a head size with its own copy of the loops, no grouping
    (5, 0, 5, 48, 2),      # the generic copy (48), no prefix: every key under the mask
    (3, 16, 3, 16, 4),     # the smallest head size
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ordered", [False, True])
def test_attention_matches_the_reference(ops, rows, prefix, tree, d, group, dtype, ordered):
    hkv, cap, layer = 2, prefix + tree + 5, 1
    hq = hkv * group
    k_cache, v_cache = _randn(3, hkv, cap, d), _randn(3, hkv, cap, d, seed=1)
    q = _randn(rows, hq, d, seed=2)
    gen = torch.Generator().manual_seed(3)
    mask = None if rows == 1 else (torch.rand(rows, tree, generator=gen) < 0.5) | torch.eye(rows, tree, dtype=torch.bool)
    n = prefix + tree
    scale = d ** -0.5
    got = ops.attention(q, k_cache, v_cache, layer, n, mask, dtype, scale, ordered=ordered)
    keys, values = k_cache[layer, :, :n].transpose(0, 1), v_cache[layer, :, :n].transpose(0, 1)
    want = tree_attention_torch(q, keys, values, prefix if mask is not None else n, mask, scale)
    want = want.reshape(rows, hq * d).to(dtype)
    assert got.dtype == dtype
    if dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    else:
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("ordered", [False, True])
def test_attention_gives_the_same_bits_on_any_number_of_threads(ops, ordered):
    """The query rows of each KV head are cut into slices that threads share; a row's result is the same in
    any slice, so the thread count changes no bit (a decode step, a tree, a prefill)."""
    k, v = _randn(2, 3, 300, 64, seed=5), _randn(2, 3, 300, 64, seed=6)
    for rows, prefix in ((1, 200), (5, 250), (40, 0)):
        q = _randn(rows, 9, 64, seed=rows)
        tree = (torch.rand(rows, rows, generator=torch.Generator().manual_seed(7)) < 0.6) | torch.eye(rows, dtype=torch.bool)
        tree = None if rows == 1 else tree
        one = ops.attention(q, k, v, 1, prefix + rows, tree, torch.float32, 0.125, ordered=ordered, threads=1)
        for threads in (2, 3, 4):
            assert torch.equal(ops.attention(q, k, v, 1, prefix + rows, tree, torch.float32, 0.125, ordered=ordered,
                                             threads=threads), one), (rows, threads)


@pytest.mark.parametrize("march, defines", [("haswell", ()), ("x86-64", ()), (None, ("-DCPU_OPS_NO_SHUFFLE",))],
                         ids=["avx2", "x86-64 without fma", "lane sums without shuffles"])
def test_other_builds_give_the_same_bits(ops, tmp_path, monkeypatch, march, defines):
    """With `ordered`, the sums go in one order whatever the vector width (`FixedSum`, the 16-key tiles) and every
    fused multiply-add is written out (`fma1`, `fma16`; the file is built with -ffp-contract=off), so the library
    built for an AVX2-only CPU, for plain x86-64 (no FMA: libm's exact fmaf) and with the lane sums of compilers
    without vector shuffles (GCC < 12) computes norms, RoPE, attention and SiLU bit for bit as this CPU's own."""
    if march is not None:
        monkeypatch.setitem(capability.EMULATED_MARCH, "avx2", march)
        emulated = dataclasses.replace(capability.detect(), emulating="avx2")
        monkeypatch.setattr(capability, "detect", lambda: emulated)
    other = cpu_ops.CpuOps(ctypes.CDLL(str(cpu_ops.build_library(cpu_ops.SOURCE, tmp_path, cpu_ops.FLAGS + defines))))
    h, w, delta = _randn(5, 576, seed=1), _randn(576, seed=2), _randn(5, 576, seed=8)
    assert torch.equal(other.rms_norm(h.clone(), w, 1e-5, delta=delta, ordered=True),
                       ops.rms_norm(h.clone(), w, 1e-5, delta=delta, ordered=True))
    gate_up = _randn(5, 2 * 1536, seed=3) * 3
    wide = _randn(3, 2 * 1539, seed=12) * 40   # past exp's floor, and a width that leaves a tail of 3 past 8 lanes
    wide[:, :4] = torch.tensor([0.0, -0.0, 88.5, -88.5])
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(other.silu_mul(gate_up.to(dtype)), ops.silu_mul(gate_up.to(dtype))), dtype
        assert torch.equal(other.silu_mul(wide.to(dtype)), ops.silu_mul(wide.to(dtype))), dtype
    qkv, cos, sin = _randn(5, 12 * 64, seed=9), _randn(5, 64, seed=10), _randn(5, 64, seed=11)
    caches = [(torch.zeros(2, 2, 64, 64), torch.zeros(2, 2, 64, 64)) for _ in range(2)]
    rotated = [lib.rope_to_cache(qkv, cos, sin, kc, vc, 1, 32, 8, 2) for lib, (kc, vc) in zip((other, ops), caches)]
    assert torch.equal(*rotated) and torch.equal(caches[0][0], caches[1][0])
    q, k, v = _randn(5, 8, 64, seed=4), _randn(2, 2, 64, 64, seed=5), _randn(2, 2, 64, 64, seed=6)
    mask = torch.rand(5, 5, generator=torch.Generator().manual_seed(7)) < 0.6
    for n_keys, tree, spread in ((37, None, 1.0), (37, mask, 1.0), (64, mask, 1.0), (61, mask, 40.0)):
        wide = q * spread  # (scores far below the largest: exp's floor at -87)
        assert torch.equal(other.attention(wide, k, v, 1, n_keys, tree, torch.float32, 0.125, ordered=True),
                           ops.attention(wide, k, v, 1, n_keys, tree, torch.float32, 0.125, ordered=True)), n_keys
    q, k, v = _randn(4, 6, 128, seed=12), _randn(1, 3, 80, 128, seed=13), _randn(1, 3, 80, 128, seed=14)
    assert torch.equal(other.attention(q, k, v, 0, 79, mask[:4, :4], torch.float32, 0.09, ordered=True),
                       ops.attention(q, k, v, 0, 79, mask[:4, :4], torch.float32, 0.09, ordered=True))


def test_a_library_per_cpu_and_a_reason_without_a_compiler(ops, tmp_path, monkeypatch):  # ops: skip without cc
    first = cpu_ops.build_library(cpu_ops.SOURCE, tmp_path)
    assert cpu_ops.build_library(cpu_ops.SOURCE, tmp_path) == first  # built once
    monkeypatch.setattr(cpu_ops, "_cpu_signature", lambda: "flags : another cpu")
    other = cpu_ops.build_library(cpu_ops.SOURCE, tmp_path)
    assert other != first and other.exists()  # a cache shared with another CPU never loads this one's build
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert cpu_ops.load(tmp_path / "empty") is None
    assert "no-such-compiler" in cpu_ops.last_error(tmp_path / "empty")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_target_model_runs_the_fused_layer_with_the_same_results(ops, dtype):
    base = tiny_target("llama", layers=4, dtype=dtype)
    fused = TargetModel(base.hf, base.tokenizer, base.name, fused=True)
    plain = TargetModel(base.hf, base.tokenizer, base.name, fused=False, kv_dtype=torch.float32)
    assert fused.ops is not None and plain.ops is None and fused.kv_dtype == torch.float32
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    caches = [model.new_cache(64) for model in (fused, plain)]
    ids, n = torch.tensor([3, 9, 4, 1, 7]), 5
    for tokens, mask in ((ids, torch.ones(n, n, dtype=torch.bool).tril()), (torch.tensor([2]), None),
                         (torch.tensor([5, 6, 8]), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool))):
        start = caches[0].length
        positions = torch.arange(start, start + len(tokens))
        outs = [model.forward(tokens, positions, cache, mask, feature_layers=model.eagle3_layers)
                for model, cache in zip((fused, plain), caches)]
        torch.testing.assert_close(outs[0].logits, outs[1].logits, **tol)
        torch.testing.assert_close(outs[0].features, outs[1].features, **tol)
        assert caches[0].length == caches[1].length == start + len(tokens)
    torch.testing.assert_close(caches[0].k, caches[1].k, **tol)
    torch.testing.assert_close(caches[0].v, caches[1].v, **tol)


def test_long_forwards_and_unsupported_models_keep_torch(ops):
    base = tiny_target("llama", layers=2)
    model = TargetModel(base.hf, base.tokenizer, base.name)
    calls = []
    model.ops = type("Spy", (), {"__getattr__": lambda self, name: calls.append(name) or getattr(ops, name)})()
    n = cpu_ops.MAX_ROWS + 1
    model.forward(torch.arange(n) % 7, torch.arange(n), model.new_cache(64), torch.ones(n, n, dtype=torch.bool).tril())
    assert calls == []  # a prefill longer than MAX_ROWS runs PyTorch's operations
    model.forward(torch.tensor([1]), torch.tensor([0]), model.new_cache(8), None)
    assert "self_attention" in calls
    qwen3 = tiny_target("qwen3", layers=2)  # per-head q/k norms
    assert TargetModel(qwen3.hf, qwen3.tokenizer, qwen3.name).ops is None
    with pytest.raises(ValueError, match="per-head norms"):
        TargetModel(qwen3.hf, qwen3.tokenizer, qwen3.name, fused=True)
    with pytest.raises(ValueError, match="pinned"):
        TargetModel(base.hf, base.tokenizer, base.name, fused=True, kv_dtype=torch.bfloat16)


@pytest.mark.parametrize("arch", ["eagle1", "eagle3"])
def test_the_drafting_copy_of_a_head_runs_the_fused_layer_with_the_same_results(ops, arch):
    from eagleviz.models.draft import random_head

    target = tiny_target("llama", layers=4)
    head = random_head(target, arch, seed=1, num_layers=2, std=0.3)  # EAGLE-3: the midlayer and one more
    fused, plain = head.for_drafting(ops=ops), head.for_drafting()
    assert fused.ops is ops and plain.ops is None and head.ops is None  # the trained head is untouched
    feature = 3 * 64 if arch == "eagle3" else 64
    caches = [h.new_cache(32, torch.float32, "cpu") for h in (fused, plain)]
    steps = ((_randn(4, feature), torch.ones(4, 4, dtype=torch.bool).tril()),  # the pending tokens
             (_randn(2, 64, seed=5), torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]], dtype=torch.bool)))
    for features, mask in steps:
        start = caches[0].length
        embeds, positions = _randn(len(features), 64, seed=7), torch.arange(start, start + len(features))
        with torch.inference_mode():
            outs = [h(features, embeds, positions, cache, mask[:, -mask.shape[1]:]) for h, cache in zip((fused, plain), caches)]
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)  # fp32 sums in another order
    torch.testing.assert_close(caches[0].k[:, :, :6], caches[1].k[:, :, :6], atol=1e-4, rtol=1e-4)


def test_a_failed_build_is_a_warning_and_torch_takes_over(monkeypatch):
    from eagleviz.models import target as target_module

    base = tiny_target("llama", layers=2)
    monkeypatch.setattr(target_module.cpu_ops, "load", lambda build_dir: None)
    monkeypatch.setattr(target_module.cpu_ops, "last_error", lambda build_dir: "OSError: no cc here")
    with pytest.warns(RuntimeWarning, match="no cc here"):
        model = TargetModel(base.hf, base.tokenizer, base.name)
    assert model.ops is None
    out = model.forward(torch.tensor([1, 2]), torch.arange(2), model.new_cache(8), torch.ones(2, 2, dtype=torch.bool).tril())
    assert out.logits.shape == (2, 32)
    with pytest.raises(ValueError, match="no cc here"):
        TargetModel(base.hf, base.tokenizer, base.name, fused=True)


# ------------------------------------------------------------------ memory safety: every pointer checked


def _layer_inputs(t=3, hq=4, hkv=2, d=64, cap=16, layers=2, dtype=torch.float32):
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype)
    cos, sin = _randn(t, d, dtype=dtype, seed=1), _randn(t, d, dtype=dtype, seed=2)
    k = torch.zeros(layers, hkv, cap, d)
    return qkv, cos, sin, k, torch.zeros_like(k)


@pytest.mark.parametrize("break_it,message", [
    (lambda a: a.update(cos=a["cos"].double()), "cos must be"),
    (lambda a: a.update(sin=a["sin"].to(torch.bfloat16)), "sin must be"),  # the embeddings' dtype, not qkv's
    (lambda a: a.update(cos=a["cos"][:, :32]), "cos must be"),
    (lambda a: a.update(qkv=a["qkv"][:, :-64].contiguous()), "qkv must be"),
    (lambda a: a.update(qkv=a["qkv"][:, :-64]), "contiguous bf16 or fp32"),
    (lambda a: a.update(k_cache=a["k_cache"].transpose(2, 3)), "contiguous fp32"),
    (lambda a: a.update(k_cache=a["k_cache"].half()), "contiguous fp32"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :, :8]), "value cache must match"),
    (lambda a: a.update(layer=2), "outside the cache's 2 layers"),
    (lambda a: a.update(num_kv_heads=3), "KV cache holds 2 heads"),
    (lambda a: a.update(tree_mask=torch.ones(3, 3, dtype=torch.int32)), "tree_mask must be"),
    (lambda a: a.update(tree_mask=torch.ones(2, 3, dtype=torch.bool)), "tree_mask must be"),
])
def test_the_wrappers_refuse_wrong_dtypes_layouts_and_shapes(ops, break_it, message):
    qkv, cos, sin, k, v = _layer_inputs()
    args = dict(qkv=qkv, cos=cos, sin=sin, k_cache=k, v_cache=v, layer=1, start=0, tree_mask=None, num_heads=4,
                num_kv_heads=2)
    ops.self_attention(**args)  # the unbroken call runs
    break_it(args)
    with pytest.raises(ValueError, match=message):
        ops.self_attention(**args)


@pytest.mark.parametrize("d", [272, 512, 20])
def test_head_sizes_the_c_attention_cannot_hold_are_refused(ops, d):
    """head_dim > 256 would overflow the C attention's register tiles on the stack: a ValueError instead."""
    q = _randn(2, 4, d)
    k = torch.zeros(1, 2, 8, d)
    with pytest.raises(ValueError, match=f"head size {d}"):
        ops.attention(q, k, torch.zeros_like(k), 0, 4, None, torch.float32, 0.1)


def test_the_other_wrappers_refuse_mismatched_operands(ops):
    h = _randn(3, 64)
    with pytest.raises(ValueError, match="weight must be"):
        ops.rms_norm(h, _randn(64, dtype=torch.bfloat16), 1e-5)
    with pytest.raises(ValueError, match="weight must be"):
        ops.rms_norm(h, _randn(32), 1e-5)
    with pytest.raises(ValueError, match="delta must be"):
        ops.rms_norm(h, _randn(64), 1e-5, delta=_randn(3, 64).t().contiguous().t())
    with pytest.raises(ValueError, match="out must be"):
        ops.rms_norm(h, _randn(64), 1e-5, out=torch.empty(2, 64))
    with pytest.raises(ValueError, match="gate_up must be"):
        ops.silu_mul(_randn(3, 63))
    with pytest.raises(ValueError, match="contiguous bf16 or fp32"):
        ops.silu_mul(_randn(64, 3).t())
    q = _randn(2, 4, 64)
    k = torch.zeros(1, 2, 8, 64)
    with pytest.raises(ValueError, match="keys in a cache of 8"):
        ops.attention(q, k, torch.zeros_like(k), 0, 9, None, torch.float32, 0.1)


def test_a_library_in_a_folder_others_can_write_is_refused(ops, tmp_path):
    shared = tmp_path / "shared"
    cpu_ops.build_library(cpu_ops.SOURCE, shared, cpu_ops.FLAGS)  # a genuine build, then the folder is opened to everyone
    shared.chmod(0o777)
    assert cpu_ops.load(shared) is None and "writable by other users" in cpu_ops.last_error(shared)
    shared.chmod(0o700)
    lib = next(shared.glob("cpu_ops-*.so"))
    lib.chmod(0o766)
    assert cpu_ops.load(shared) is None and "writable by other users" in cpu_ops.last_error(shared)
    lib.chmod(0o700)
    assert cpu_ops.load(shared) is not None  # a refusal is not remembered: fixed, it loads


def test_a_compiler_command_with_arguments_and_a_retry_after_a_failure(ops, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert cpu_ops.load(tmp_path / "k") is None
    monkeypatch.setenv("CC", "env cc")  # a wrapper and its compiler, as CC="ccache gcc" is
    assert cpu_ops.load(tmp_path / "k") is not None and cpu_ops.last_error(tmp_path / "k") is None


def test_a_kernel_that_does_not_build_fails_the_suite_with_the_compilers_message(tmp_path):
    """Where a C compiler exists, a kernel source with an error is a failure naming the compiler's complaint,
    never a row of skips (every fixture of a compiled library goes through `tiny.unbuilt`)."""
    if capability.c_compiler() is None:
        pytest.skip("no C compiler here: nothing to build")
    broken = tmp_path / "broken_ops.c"
    broken.write_text("int broken(int x) { return x +; }\n")
    build = tmp_path / "build"
    assert cpu_ops.load_library(broken, build, (), lambda lib: lib) is None
    error = cpu_ops.last_error(build, broken)
    assert "error" in error.lower()
    with pytest.raises(pytest.fail.Exception, match="did not build although this machine has a C compiler") as raised:
        unbuilt("broken_ops.c", error)
    assert "return x +" in str(raised.value) or "expected expression" in str(raised.value)
