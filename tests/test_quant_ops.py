"""kernels/quant_ops.py: products from Q4_1 and Q8_0 blocks agree with the dequantized weight's exact product,
a row's result is bitwise the same whatever rows, grouping or threads come with it, the 8-lane (AVX2) and
16-lane (AVX-512) builds give the same bits, and the block layouts convert exactly."""

import ctypes
import dataclasses

import pytest
import torch

from eagleviz.models import packed
from kernels import capability, cpu_ops, quant_ops
from tiny import compiled_or_fail


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return compiled_or_fail(quant_ops.load, quant_ops.last_error, tmp_path_factory.mktemp("quant"),
                            "kernels/quant_ops.c")


def random_blocks(fmt: str, n: int, k: int, seed: int = 0) -> tuple[quant_ops.QuantWeight, dict]:
    """Blocks as a quantizer writes them (q4_1: each block's minimum is m, its maximum d * 15 + m; q8_0: its
    largest magnitude is 127 d)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = n * k // 32
    d = (torch.rand(blocks, generator=gen) * 0.02 + 1e-3).half()
    if fmt == "q4_1":
        q = torch.randint(0, 16, (blocks, 32), generator=gen, dtype=torch.uint8)
        q[:, 0], q[:, 1] = 0, 15
        parts = {"q": q[:, 0::2] | (q[:, 1::2] << 4), "d": d, "m": (-torch.rand(blocks, generator=gen) * 0.1).half()}
    else:
        q = torch.randint(-127, 128, (blocks, 32), generator=gen, dtype=torch.int8)
        q[:, 0] = 127  # d = the block's largest magnitude / 127
        parts = {"q": q, "d": d}
    return quant_ops.QuantWeight.from_blocks(fmt, parts, (n, k)), parts


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_blocks_convert_exactly_from_the_packed_layout(fmt):
    weight, parts = random_blocks(fmt, 48, 96)
    assert torch.equal(weight.dequantize(), packed._dequantize(fmt, parts, [48, 96]))
    found, again = packed.pack_tensor(weight.dequantize())  # the values found back in the same blocks
    assert found == fmt and torch.equal(quant_ops.QuantWeight.from_blocks(fmt, again, (48, 96)).q, weight.q)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_the_interleaved_layout_round_trips_and_concatenates_whole_groups(fmt):
    """Columns in groups of 16 (zero columns pad the last), bytes interleaved four at a time: the canonical
    blocks come back exactly; weights concatenate when every one but the last fills its groups."""
    weight, parts = random_blocks(fmt, 37, 64, seed=5)
    q, d, m = weight.canonical()
    assert q.shape == (37 * 2, 16 if fmt == "q4_1" else 32) and d.shape == (37 * 2,)
    assert torch.equal(d, parts["d"]) and (m is None or torch.equal(m, parts["m"]))
    assert weight.q.shape[0] == 3 * 2 and weight.d.shape == (3 * 2 * 16,)  # 3 groups of 2 blocks
    assert weight.d.dtype == torch.float16  # the scales as the file stores them
    assert torch.equal(quant_ops.QuantWeight.from_canonical(fmt, q, d, m, (37, 64)).q, weight.q)
    whole, _ = random_blocks(fmt, 32, 64, seed=6)
    joined = quant_ops.QuantWeight.concat([whole, weight])
    assert torch.equal(joined.dequantize(), torch.cat((whole.dequantize(), weight.dequantize())))
    assert quant_ops.QuantWeight.concat([weight, whole]) is None  # 37 columns leave a group part-filled


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 4, 9, 64])
def test_the_product_is_the_dequantized_weights(ops, fmt, rows):
    weight, _ = random_blocks(fmt, 80, 192, seed=rows)
    gen = torch.Generator().manual_seed(100 + rows)
    x, bias = torch.randn(rows, 192, generator=gen), torch.randn(80, generator=gen)
    for b in (None, bias):
        got, want = ops.matmul(x, weight, b), quant_ops.reference(x, weight, b)
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-5 * want.abs().max().item())


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_a_rows_result_does_not_depend_on_its_batch(ops, fmt, int8):
    weight, _ = random_blocks(fmt, 67, 160, seed=3)
    x = torch.randn(37, 160, generator=torch.Generator().manual_seed(4)) * 3
    full = ops.matmul(x, weight, threads=2, int8=int8)
    for start, stop, threads in ((0, 1, 1), (5, 6, 2), (3, 7, 1), (10, 26, 2), (0, 37, 1), (36, 37, 3)):
        assert torch.equal(ops.matmul(x[start:stop], weight, threads=threads, int8=int8), full[start:stop]), (start, stop)


def test_8_and_16_lane_builds_give_the_same_bits(ops, tmp_path, monkeypatch):
    """The AVX2 build (8-float vectors) and this CPU's native build compute every lane alike."""
    emulated = dataclasses.replace(capability.detect(), emulating="avx2")
    monkeypatch.setattr(capability, "detect", lambda: emulated)
    haswell = quant_ops.QuantOps(ctypes.CDLL(str(cpu_ops.build_library(quant_ops.SOURCE, tmp_path, quant_ops.FLAGS))))
    for fmt in ("q4_1", "q8_0"):
        weight, _ = random_blocks(fmt, 50, 128, seed=7)
        x = torch.randn(6, 128, generator=torch.Generator().manual_seed(8))
        assert torch.equal(haswell.matmul(x, weight), ops.matmul(x, weight)), fmt


def test_refusals_are_one_line(ops):
    weight, _ = random_blocks("q4_1", 32, 64)
    with pytest.raises(ValueError, match="x must be an fp32 CPU tensor"):
        ops.matmul(torch.zeros(2, 64, dtype=torch.bfloat16), weight)
    with pytest.raises(ValueError, match="no quantized product for the format 'q5_k'"):
        quant_ops.QuantWeight.from_blocks("q5_k", {}, (32, 64))
    with pytest.raises(ValueError, match="k a multiple of 32"):
        quant_ops.QuantWeight("q4_1", weight.q, weight.d, weight.m, (64, 32 + 1))


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows,k", [(1, 192), (5, 160), (9, 576)])
def test_int8_rows_compute_the_int8_scheme(ops, fmt, rows, k):
    """Rows quantized per block of 32 to int8 and multiplied in integers: what `reference_int8` computes,
    and within int8 rounding of the fp32 product (k = 160: an odd number of blocks)."""
    weight, _ = random_blocks(fmt, 40, k, seed=rows)
    gen = torch.Generator().manual_seed(rows + k)
    x, bias = torch.randn(rows, k, generator=gen), torch.randn(40, generator=gen)
    got = ops.matmul(x, weight, bias, int8=True)
    want = quant_ops.reference_int8(x, weight, bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    exact = quant_ops.reference(x, weight, bias)
    assert (got - exact).abs().max() < 0.02 * exact.abs().max()


@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_int8_builds_for_other_cpus_give_the_same_bits(ops, tmp_path, monkeypatch, march):
    """The AVX2 build (maddubs) and the plain C build compute the same integer lanes and add the floats in the
    same order as this CPU's own build (AVX-512 VNNI here)."""
    monkeypatch.setitem(capability.EMULATED_MARCH, "avx2", march)
    emulated = dataclasses.replace(capability.detect(), emulating="avx2")
    monkeypatch.setattr(capability, "detect", lambda: emulated)
    other = quant_ops.QuantOps(ctypes.CDLL(str(cpu_ops.build_library(quant_ops.SOURCE, tmp_path, quant_ops.FLAGS))))
    for fmt in ("q4_1", "q8_0"):
        weight, _ = random_blocks(fmt, 50, 160, seed=7)
        x = torch.randn(6, 160, generator=torch.Generator().manual_seed(8))
        assert torch.equal(other.matmul(x, weight, int8=True), ops.matmul(x, weight, int8=True)), fmt


def test_q8_0_rounding_of_any_weight_is_within_half_a_step_and_keeps_q8_0_values():
    """`quantize_q8_0` rounds each block to its nearest Q8_0 values (d = largest magnitude / 127, fp16-exact),
    and a weight that already holds Q8_0 values comes back unchanged."""
    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(3))
    q = quant_ops.QuantWeight.quantize_q8_0(w)
    assert q.fmt == "q8_0" and q.d.dtype == torch.float16
    step = q.canonical()[1].float().reshape(24, 3, 1).expand(24, 3, 32).reshape(24, 96)
    error = (q.dequantize() - w).abs()
    assert (error <= step / 2 * (1 + 1e-3) + 1e-7).all() and error.max() > 0
    again = quant_ops.QuantWeight.quantize_q8_0(q.dequantize())
    assert torch.equal(again.dequantize(), q.dequantize())
    with pytest.raises(ValueError, match="multiple of 32"):
        quant_ops.QuantWeight.quantize_q8_0(torch.zeros(4, 40))
