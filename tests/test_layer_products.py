"""kernels/layer_products.py: each product with its prologue and epilogue against its PyTorch reference, in
Triton's interpreter (fp32 and fp16: the interpreter's bf16 products are garbage), over a decode step's one row,
a tree's rows and more rows than one program holds; and a whole layer in five launches."""

from __future__ import annotations

import pytest
import torch

from kernels import layer_products as lp

pytestmark = pytest.mark.triton
TOL = {torch.float32: 2e-5, torch.float16: 4e-3}
ROWS = (1, 5, 19)   # a plain step, a small tree, two row blocks


def _randn(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _close(got, want, dtype, scale=1.0):
    assert torch.allclose(got.float(), want.float(), atol=TOL[dtype] * 4 * scale, rtol=TOL[dtype]), \
        (got.float() - want.float()).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t", ROWS)
def test_norm_gate_up_gives_the_activation_of_the_normed_rows(dtype, t):
    gen = torch.Generator().manual_seed(10 + t)
    k_dim, inter = 72, 100                                   # neither a multiple of its tile
    h = _randn(t, k_dim, dtype=dtype, gen=gen)
    norm_w = _randn(k_dim, dtype=dtype, gen=gen)
    w = _randn(2 * inter, k_dim, dtype=dtype, gen=gen, scale=k_dim ** -0.5)
    got = lp.norm_gate_up(h, norm_w, w, 1e-5)
    assert got.shape == (t, inter)
    _close(got, lp.norm_gate_up_torch(h, norm_w, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t", ROWS)
def test_matmul_residual_adds_the_product_to_the_stream_in_place(dtype, t):
    gen = torch.Generator().manual_seed(20 + t)
    k_dim, n = 100, 72
    x = _randn(t, k_dim, dtype=dtype, gen=gen)
    w = _randn(n, k_dim, dtype=dtype, gen=gen, scale=k_dim ** -0.5)
    h = _randn(t, n, dtype=dtype, gen=gen)
    want = lp.matmul_residual_torch(x, w, h.clone())
    got = lp.matmul_residual(x, w, h)
    assert got is h
    _close(h, want, dtype)


def test_shapes_that_do_not_fit_are_refused_in_words():
    gen = torch.Generator().manual_seed(0)
    h = _randn(2, 64, dtype=torch.float32, gen=gen)
    with pytest.raises(ValueError, match="2 I"):
        lp.norm_gate_up(h, h[0], _randn(7, 64, dtype=torch.float32, gen=gen), 1e-5)
    with pytest.raises(ValueError, match="multiple of 32"):
        caches = torch.zeros(1, 8, 16)
        lp.norm_qkv_rope(h, h[0], None, None, None, _randn(5 * 16, 64, dtype=torch.float32, gen=gen), None,
                         (torch.ones(8, 16), torch.zeros(8, 16)), torch.arange(2), 0, torch.tensor([0]), 0, caches,
                         caches.clone(), 3, 1, 1e-5)
    with pytest.raises(ValueError, match="unit column stride"):
        lp.matmul_residual(h.t(), _randn(4, 2, dtype=torch.float32, gen=gen), torch.zeros(64, 4))


def _tables(rows: int, d: int, dtype, gen):
    angles = torch.rand(rows, d // 2, generator=gen) * 6
    return torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t", ROWS)
@pytest.mark.parametrize("form", ["eagle3", "plain", "unnormed", "bias"])
def test_norm_qkv_rope_normalises_projects_rotates_and_writes_the_cache(dtype, t, form):
    """The q/k/v product with its norms, RoPE and cache writes: one normed input at each row's position (a target
    layer), [RMSNorm(table[ids]), RMSNorm(b)] side by side (a draft head's EAGLE-3 midlayer), one unnormed, with a
    bias; RoPE read from tables (one position for every row but in the target's form: a draft level's nodes), the
    cache written from P in device memory, no other slot touched."""
    gen = torch.Generator().manual_seed(30 + t)
    k_a, k_b, hq, hkv, d, capacity = 80, 48, 3, 1, 32, 64
    eagle3 = form == "eagle3"
    a = _randn(50 if eagle3 else t, k_a, dtype=dtype, gen=gen)
    ids = torch.randint(0, 50, (t,), generator=gen) if eagle3 else None
    b = _randn(t, k_b, dtype=dtype, gen=gen) if eagle3 else None
    norm_a = None if form == "unnormed" else _randn(k_a, dtype=dtype, gen=gen)
    norm_b = _randn(k_b, dtype=dtype, gen=gen) if eagle3 else None
    w = _randn((hq + 2 * hkv) * d, k_a + (k_b if eagle3 else 0), dtype=dtype, gen=gen, scale=k_a ** -0.5)
    bias = _randn((hq + 2 * hkv) * d, dtype=dtype, gen=gen) if form == "bias" else None
    rope = _tables(40, d, dtype, gen)
    one = t > 1 and form != "plain"
    positions = torch.tensor([7]) if one else torch.randint(0, 30, (t,), generator=gen)
    prefix, slot_add = torch.tensor([5]), 3
    caches = [_randn(hkv, capacity, d, dtype=dtype, gen=gen) for _ in range(2)]
    ref = [c.clone() for c in caches]
    args = (norm_a, ids, b, norm_b, w, bias, rope, positions, 2, prefix, slot_add)
    want = lp.norm_qkv_rope_torch(a, *args, *ref, hq, hkv, 1e-5)
    got = lp.norm_qkv_rope(a, *args, *caches, hq, hkv, 1e-5)
    assert got.shape == (t, hq, d)
    _close(got, want, dtype)
    for c, r in zip(caches, ref):
        _close(c, r, dtype)
    written = set(range(8, 8 + t))
    untouched = [s for s in range(capacity) if s not in written]
    assert torch.equal(caches[1][:, untouched], ref[1][:, untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("t", ROWS)
@pytest.mark.parametrize("normed", [True, False])
def test_norm_matmul_gives_a_heads_fp32_logits(dtype, t, normed):
    gen = torch.Generator().manual_seed(40 + t)
    k_dim, n = 72, 100
    h = _randn(t, k_dim, dtype=dtype, gen=gen)
    norm_w = _randn(k_dim, dtype=dtype, gen=gen) if normed else None
    w = _randn(n, k_dim, dtype=dtype, gen=gen, scale=k_dim ** -0.5)
    got = lp.norm_matmul(h, norm_w, w, 1e-5)
    assert got.dtype == torch.float32 and got.shape == (t, n)
    _close(got, lp.norm_matmul_torch(h, norm_w, w, 1e-5), dtype)
