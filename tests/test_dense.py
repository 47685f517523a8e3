"""eagleviz/models/dense.py: packed bf16 linears compute bitwise what `linear` computes, packed fp32 ones run
`linear` for few rows and agree with it for more; fusing keeps the modules right; the inference copy of a
head is a snapshot that leaves the original alone."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from eagleviz.models.dense import FP32_PACKED_FROM, Dense, DenseModule, for_inference, fuse_linears, packing_available
from eagleviz.models.target import TargetModel
from kernels import capability
from tiny import tiny_target

needs_bf16_packing = pytest.mark.skipif(not packing_available(torch.zeros(1, dtype=torch.bfloat16)),
                                        reason=capability.detect().why_not_bf16() or "no oneDNN packed linear")
needs_fp32_packing = pytest.mark.skipif(not packing_available(torch.zeros(1)),
                                        reason="this torch build has no oneDNN packed linear")


@needs_bf16_packing
@pytest.mark.parametrize("rows", [1, 3, 16, 64, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_bf16_is_bitwise_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 80, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16() if bias else None
    x = torch.randn(rows, 80, generator=gen).bfloat16()
    dense = Dense(w, b)
    assert dense.packed is not None
    assert torch.equal(dense(x), nn.functional.linear(x, w, b))


def test_fp16_stays_unpacked():
    w = torch.randn(8, 4).half()
    assert Dense(w).packed is None
    with pytest.raises(ValueError, match="bf16 or fp32 CPU"):
        Dense(w, pack=True)


@needs_fp32_packing
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 16, 64])
def test_packed_fp32_runs_linear_below_packed_from_rows(rows, monkeypatch):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 80, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 80, generator=gen)
    dense = Dense(w, b)
    assert dense.packed is not None and dense.packed_from == FP32_PACKED_FROM == 4
    want = nn.functional.linear(x, w, b)
    calls, linear = [], nn.functional.linear
    monkeypatch.setattr(nn.functional, "linear", lambda *a: calls.append(a) or linear(*a))
    y = dense(x)
    assert len(calls) == (rows < FP32_PACKED_FROM)  # `linear` for few rows, oneDNN's packed product for more
    if rows < FP32_PACKED_FROM:
        assert torch.equal(y, want)
    else:  # oneDNN's fp32 kernel: the same product, rounded in another order
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_pack_false_keeps_linear():
    assert Dense(torch.randn(8, 4).bfloat16(), pack=False).packed is None


def test_bf16_runs_unpacked_on_a_cpu_that_cannot_pack_it(monkeypatch):
    """On an AVX2-only CPU oneDNN refuses bf16 packing: Dense then runs `linear` (bitwise the same product),
    fp32 still packs, and insisting on packing bf16 is refused with the reason."""
    unable = dataclasses.replace(capability.detect(), bf16_packing=False, native_bf16=False, emulating="avx2")
    monkeypatch.setattr(capability, "detect", lambda: unable)
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 80, generator=gen).bfloat16(), torch.randn(5, 80, generator=gen).bfloat16()
    dense = Dense(w)
    assert dense.packed is None and torch.equal(dense(x), nn.functional.linear(x, w))
    assert packing_available(w.float()) == packing_available(torch.zeros(1))  # fp32 packing is not bf16's business
    with pytest.raises(ValueError, match="refuses bf16 weight packing"):
        Dense(w, pack=True)
    frozen = for_inference(nn.Sequential(nn.Linear(80, 8)).bfloat16())
    assert frozen[0].dense.packed is None


def test_fused_linears_are_views_and_compute_the_same():
    torch.manual_seed(0)
    a, b = nn.Linear(6, 4), nn.Linear(6, 3)
    x = torch.randn(5, 6)
    want = torch.cat([a(x), b(x)], dim=-1).detach()
    fused = Dense.of(a, b)
    torch.testing.assert_close(fused(x), want)  # one product instead of two: fp32 rounding may differ
    assert a.weight.data_ptr() == fused.weight.data_ptr()  # the modules now view the fused weight
    assert torch.equal(torch.cat([a(x), b(x)], dim=-1), want)


def test_mixed_biases_are_not_fused():
    assert fuse_linears(nn.Linear(4, 2), nn.Linear(4, 2, bias=False)) is None
    assert Dense.of(nn.Linear(4, 2), nn.Linear(4, 2, bias=False)) is None


@needs_bf16_packing
def test_target_forward_is_bitwise_the_same_packed_or_not():
    target = tiny_target(dtype=torch.bfloat16)
    plain = TargetModel(target.hf, target.tokenizer, target.name, pack=False, kv_dtype=target.kv_dtype)
    assert target.unembed.packed is not None and plain.unembed.packed is None
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    a = target.forward(ids, torch.arange(8), target.new_cache(16), mask, feature_layers=target.eagle3_layers)
    b = plain.forward(ids, torch.arange(8), plain.new_cache(16), mask, feature_layers=plain.eagle3_layers)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)


def test_inference_copy_is_a_snapshot():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).bfloat16()
    frozen = for_inference(model)
    assert all(isinstance(frozen[i], DenseModule) for i in (0, 2)) and isinstance(model[0], nn.Linear)
    x = torch.randn(3, 4).bfloat16()
    want = model(x).detach()
    assert torch.equal(frozen(x), want)
    with torch.no_grad():
        model[0].weight.zero_()  # training the original further does not reach the snapshot
    assert torch.equal(frozen(x), want)
    again = for_inference(frozen, pack=False)  # a copy of a copy, re-made unpacked
    assert again[0].dense.packed is None and torch.equal(again(x), want)
    assert torch.equal(copy.deepcopy(frozen)(x), want)
