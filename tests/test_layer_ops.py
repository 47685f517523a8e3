"""kernels/layer_ops.py: each fused layer kernel against its PyTorch reference, in Triton's interpreter (fp32 and
fp16: the interpreter's bf16 products are garbage), and ahead of time for sm_80 and sm_90 in bf16 too.""" 

from __future__ import annotations

import pytest
import torch

from kernels import layer_ops

pytestmark = pytest.mark.triton
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter cannot multiply bf16
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_updates_the_stream_and_normalises(dtype, with_delta):
    gen = torch.Generator().manual_seed(1)
    h, delta = _randn(5, 72, dtype=dtype, gen=gen), _randn(5, 72, dtype=dtype, gen=gen)
    weight = _randn(72, dtype=dtype, gen=gen)
    h_ref = h.clone()
    want = layer_ops.add_rms_norm_torch(h_ref, delta if with_delta else None, weight, 1e-5)
    got = layer_ops.add_rms_norm(h, delta if with_delta else None, weight, 1e-5)
    assert torch.allclose(h, h_ref, atol=TOL[dtype], rtol=0)  # the residual stream, in place
    assert torch.allclose(got.float(), want.float(), atol=TOL[dtype] * 4, rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_store_rotates_q_and_writes_k_and_v_at_their_slots(dtype):
    gen = torch.Generator().manual_seed(2)
    t, hq, hkv, d, capacity = 3, 4, 2, 16, 40
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype, gen=gen)
    angles = torch.rand(t, d // 2, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    slots = torch.tensor([7, 30, 8])
    caches = [_randn(hkv, capacity, d, dtype=dtype, gen=gen) for _ in range(2)]
    ref = [c.clone() for c in caches]
    want = layer_ops.rope_store_torch(qkv, cos, sin, *ref, slots, hq, hkv)
    got = layer_ops.rope_store(qkv, cos, sin, *caches, slots, hq, hkv)
    assert torch.allclose(got.float(), want.float(), atol=TOL[dtype] * 4, rtol=0)
    for c, r in zip(caches, ref):
        assert torch.allclose(c.float(), r.float(), atol=TOL[dtype] * 4, rtol=0)
    untouched = [s for s in range(capacity) if s not in slots.tolist()]
    assert torch.equal(caches[1][:, untouched], ref[1][:, untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul_gates(dtype):
    gen = torch.Generator().manual_seed(3)
    gate_up = _randn(4, 2 * 300, dtype=dtype, gen=gen)
    want = layer_ops.silu_mul_torch(gate_up)
    assert torch.allclose(layer_ops.silu_mul(gate_up, block=128).float(), want.float(), atol=TOL[dtype] * 4, rtol=0)
