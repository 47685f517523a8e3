"""kernels/sample_ops.py: each C pass against the PyTorch code it replaces (argmax and its rule for equal
values, top-k, the inverse-CDF draw bitwise), the checks before C, and the engine's use of it: the same
tokens with and without, greedy and sampled."""

from __future__ import annotations

import math

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.decoding.verify import draw, top_tokens, uniform
from eagleviz.paths import cache_dir
from kernels import sample_ops
from tiny import compiled_or_fail, tiny_engine, unbuilt

V = 49152  # SmolLM2's vocabulary: the rows these passes read


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    return compiled_or_fail(sample_ops.load, sample_ops.last_error, tmp_path_factory.mktemp("kernels"),
                            "kernels/sample_ops.c")


def _rows(seed: int, rows: int = 3, n: int = V, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, n, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("n", [1, 7, 16, 17, 1000, V])
def test_argmax_is_torchs_first_largest_with_its_value(ops, n):
    x = _rows(n, n=n)
    index, value = ops.argmax(x)
    assert index == x.argmax(dim=-1).tolist()
    assert value == x.max(dim=-1).values.tolist()


def test_the_passes_are_vector_code_on_this_cpu(ops):
    """The argmax takes less than one PyTorch softmax of the same vocabulary row (a pass that also computes an
    exponential and writes the row), medians of interleaved timings: a build whose vector comparisons fell back
    to scalar code fails here (16-float vectors compiled for AVX2 did: the argmax took twice a softmax's time,
    in the suite's AVX2 pass too)."""
    import statistics
    import time

    x = _rows(7, rows=1)[0]
    times = {"argmax": [], "softmax": []}
    for _ in range(40):
        for name, f in (("argmax", lambda: ops.argmax(x)), ("softmax", lambda: torch.softmax(x, -1))):
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    assert med["argmax"] < med["softmax"], med


def test_argmax_of_equal_values_takes_the_first_as_torch_does(ops):
    x = torch.zeros(4, 100)
    x[0, [90, 5, 40]] = 2.0       # equal maxima in different lanes and blocks
    x[1, [33, 17]] = 1.0          # same lane (33 = 17 + 16)
    x[2, [99, 98]] = 3.0          # in the tail after the last block of 16
    x[3] = -1.0                   # all equal
    assert ops.argmax(x)[0] == x.argmax(dim=-1).tolist() == [5, 17, 98, 0]


@pytest.mark.parametrize("k", [1, 5, 64])
def test_top_k_matches_torch_topk(ops, k):
    for seed in range(20):
        p = torch.softmax(_rows(seed, rows=1)[0] * (1 + seed % 5), dim=-1)
        if seed % 3 == 0:
            p[torch.randint(0, V, (5000,), generator=torch.Generator().manual_seed(seed))] = 0.0
        index, value = ops.top_k(p, k)
        want_v, want_i = torch.topk(p, k)
        assert value == want_v.tolist()
        assert [float(p[i]) for i in index] == value and len(set(index)) == k
        assert set(index) == set(want_i.tolist()) or value[-1] == value[-2]  # equal values may trade places


def test_top_k_of_equal_values_keeps_the_lower_indices_first_and_cuts_k_to_the_row(ops):
    p = torch.zeros(40)
    p[[30, 3, 20, 10]] = 0.25
    assert ops.top_k(p, 3) == ([3, 10, 20], [0.25, 0.25, 0.25])
    index, value = ops.top_k(torch.tensor([0.2, 0.5, 0.3]), 10)
    assert index == [1, 2, 0] and value == pytest.approx([0.5, 0.3, 0.2])


def test_draw_is_bitwise_the_torch_inverse_cdf(ops):
    """The same uniform gives the same index as verify.draw's PyTorch path on 600 rows: peaked and flat ones,
    zeros inside, and uniforms at the edges (0 and just below 1)."""
    g = torch.Generator().manual_seed(0)
    for t in range(600):
        w = torch.softmax(torch.randn(V, generator=g) * (0.2 + t % 11), dim=-1)
        if t % 4 == 0:
            w[torch.randint(0, V, (20000,), generator=g)] = 0.0
        u = uniform(g, "cpu")
        want = draw(w, u)                      # PyTorch: cumsum in fp64, searchsorted
        assert draw(w, u, ops) == want, t      # the same uniform, drawn the same way
    w = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0])
    assert ops.draw(w, 0.0) == 1 and ops.draw(w, 1.0) == 3  # u01 * total rounded up: the last with weight


@pytest.mark.parametrize("n", [1, 63, 64, 65, 128, 129, 1000])
def test_draw_lands_where_the_full_cumulative_sums_say_on_every_boundary(ops, n):
    """With uniforms on every index's boundary (the cumulative sum up to it over the total, and the doubles
    either side) and runs of zero weights, the index is the one the fp64 cumsum and searchsorted(right=True)
    give: the first whose sum exceeds u01 * total, never one a sum merely reaches."""
    g = torch.Generator().manual_seed(n)
    w = torch.rand(n, generator=g)
    if n == 1000:
        w[64:192] = 0.0  # a run of zero weights between two multiples of 64, and a shorter one
        w[500:520] = 0.0
    cdf = torch.cumsum(w.double(), 0)
    total = float(cdf[-1])

    def reference(u01: float) -> int:
        i = int(torch.searchsorted(cdf, torch.tensor([u01 * total], dtype=torch.float64), right=True))
        return i if i < n else int(torch.nonzero(w)[-1])

    for j in range(n):
        edge = float(cdf[j]) / total
        for u01 in (math.nextafter(edge, 0.0), edge, math.nextafter(edge, 1.0)):
            if 0.0 <= u01 < 1.0:
                assert ops.draw(w, u01) == reference(u01), (j, u01)


def test_draw_and_top_is_the_draw_and_the_first_largest_weight(ops):
    """A resting cycle's one call: the index `draw` gives for the same uniform, the first index of the largest
    weight (torch.argmax's rule), ties planted at both ends of the row and inside its vector blocks, and that
    weight as the row holds it."""
    g = torch.Generator().manual_seed(1)
    for t in range(300):
        n = (V, 17, 16, 1, 1000)[t % 5]
        w = torch.softmax(torch.randn(n, generator=g) * (0.5 + t % 7), dim=-1)
        if t % 3 == 0 and n > 2:  # equal largest weights: the lower index is the answer
            top = float(w.max())
            for i in torch.randint(0, n, (3,), generator=g).tolist() + [n - 1]:
                w[i] = top
        u = float(torch.rand(1, generator=g, dtype=torch.float64))
        best = int(torch.argmax(w))
        assert ops.draw_and_top(w, u) == (ops.draw(w, u), best, float(w[best])), t


@pytest.mark.parametrize("n", [1, 15, 16, 17, 257, 1000, V])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_prob_at_is_the_softmax_of_the_argmax_within_a_millionth(ops, n, temperature):
    """A root-alone cycle's probability of the target's argmax, without writing a distribution: within 1e-6 of
    the exact softmax (fp64), closer than PyTorch's fp32 softmax comes (up to 5e-6 off on such rows). At scale
    30 many exponentials fall under the pass's floor (EXP_LOW) and count as 0, as they do in fp32."""
    for seed, scale in enumerate((0.5, 3.0, 30.0)):
        x = _rows(seed, rows=1, n=n, scale=scale)[0]
        (index,), (value,) = ops.argmax(x)
        exact = float(torch.softmax(x.double() / temperature, -1)[index])
        assert ops.prob_at(x, index, value, temperature) == pytest.approx(exact, rel=1e-6)
        other = (index + 1) % n  # any index: as close as its fp32 argument (x - top) / T allows
        exact_other = float(torch.softmax(x.double() / temperature, -1)[other])
        assert ops.prob_at(x, other, value, temperature) == pytest.approx(exact_other, rel=1e-5, abs=1e-30)
    with pytest.raises(ValueError, match="outside a row"):
        ops.prob_at(x, n, value)


def test_draw_refuses_an_all_zero_row_and_bad_tensors(ops):
    with pytest.raises(ValueError, match="every weight is 0"):
        ops.draw(torch.zeros(10), 0.5)
    with pytest.raises(ValueError, match="fp32 CPU rows"):
        ops.draw(torch.ones(10, dtype=torch.float64), 0.5)
    with pytest.raises(ValueError, match="one row"):
        ops.top_k(torch.ones(2, 10), 3)
    with pytest.raises(ValueError, match="fp32 CPU rows"):
        ops.argmax(torch.ones(2, 3, 4))


def test_top_tokens_falls_back_to_torch_without_ops(ops):
    p = torch.softmax(_rows(3, rows=1)[0], dim=-1)
    assert top_tokens(p, 8)[1] == top_tokens(p, 8, ops)[1] == torch.topk(p, 8).values.tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_writes_the_same_tokens_with_and_without_the_compiled_sampling(temperature):
    """The engine reads its distributions in C where it can compile them; PyTorch's passes give the same
    output tokens, accepted paths and root distributions, greedy and sampled."""
    engine = tiny_engine()
    if engine.sample_ops is None:
        unbuilt("kernels/sample_ops.c", sample_ops.last_error(cache_dir() / "kernels"))
    reference = Engine(engine.target, engine.head, engine.head_name, engine.attn_impl, compiled_sampling=False,
                       costs=engine.costs, calibration=engine.calibration)
    assert reference.sample_ops is None
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=24, seed=3)
    tree = TreeConfig.create(3, 2, 6, adaptive=False)
    for prompt in ("the cat sat", "one two three four"):
        for cfg in (None, tree):
            a, b = engine.generate(prompt, cfg, sampling), reference.generate(prompt, cfg, sampling)
            assert [t.token for t in a.output] == [t.token for t in b.output]
            assert [c.path for c in a.cycles] == [c.path for c in b.cycles]
            assert [c.target_tokens for c in a.cycles] == [c.target_tokens for c in b.cycles]
            assert [[i for i, _, _ in c.root_top] for c in a.cycles] == [[i for i, _, _ in c.root_top]
                                                                       for c in b.cycles] or temperature == 0
