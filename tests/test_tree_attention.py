"""kernels/tree_attention.py: the Triton kernel (run by Triton's interpreter on CPU, see conftest.py) against a
float64 reference over the grid of kernels/cases.py, the defining path invariant, the engine's entry, input
validation, the ahead-of-time build for sm_80/sm_90, the benchmark's smoke mode, and the package name clash
with Hugging Face's `kernels`."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import cases
from kernels import tree_attention as ta
from kernels.cases import DEFAULT_CASES, GRID, TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
_case_id, _parents, _inputs, reference = cases.case_id, cases.parents, cases.inputs, cases.reference


def _randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen).to(dtype)


def _assert_close(out, ref, dtype, what="output"):
    err = cases.relative_error(out, ref)
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.2e} > {TOLERANCE[dtype]:.0e} (inf: non-finite)"


def _run_kernel(q, k, v, prefix_len, tree_mask, sm_scale, **kwargs):
    """Launch into a NaN-poisoned output buffer, so any element the kernel fails to write fails the test."""
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    result, lse = ta.tree_attention_triton(q, k, v, prefix_len, tree_mask, sm_scale, out=out, **kwargs)
    assert result is out
    return out, lse


def _check_grid_case(index: int):
    result = cases.run_case(GRID[index], seed=index)
    assert result.ok, result


@pytest.mark.triton
@pytest.mark.parametrize("index", sorted(DEFAULT_CASES), ids=[_case_id(GRID[i]) for i in sorted(DEFAULT_CASES)])
def test_kernel_matches_float64_reference(index):
    _check_grid_case(index)


@pytest.mark.slow
@pytest.mark.parametrize("index", [i for i in range(len(GRID)) if i not in DEFAULT_CASES],
                         ids=[_case_id(c) for i, c in enumerate(GRID) if i not in DEFAULT_CASES])
@pytest.mark.triton
def test_kernel_matches_float64_reference_full_grid(index):
    _check_grid_case(index)


@pytest.mark.triton
@pytest.mark.parametrize("prefix_len,splits", [(130, 2), (130, 3), (700, 4), (700, 11)])
def test_split_k_merge_matches_reference(prefix_len, splits):
    gen = torch.Generator().manual_seed(prefix_len * 100 + splits)
    t, g, d = 9, 2, 64
    q, k, v = _inputs(t, prefix_len + t, 2, g, d, torch.float32, gen)
    mask = ta.ancestor_mask(_parents("random", t, gen))
    out, lse = _run_kernel(q, k, v, prefix_len, mask, d ** -0.5, num_splits=splits)
    ref, ref_lse = reference(q, k, v, prefix_len, mask, d ** -0.5)
    _assert_close(out, ref, torch.float32)
    assert torch.allclose(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def _root_to_leaf_paths(parents: list[int]) -> list[list[int]]:
    leaves = set(range(len(parents))) - set(parents)
    paths = []
    for leaf in sorted(leaves):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.triton), "torch"])
def test_every_path_equals_causal_attention_over_prefix_and_path(impl):
    gen = torch.Generator().manual_seed(7)
    p, t, hkv, g, d = 17, 16, 2, 2, 32
    parents = _parents("random", t, gen)
    q, k, v = _inputs(t, p + t, hkv, g, d, torch.float32, gen)
    out = ta.tree_attention(q, k, v, p, parents, impl=impl)
    for path in _root_to_leaf_paths(parents.tolist()):
        rows = torch.tensor(path)
        keys = torch.cat([torch.arange(p), p + rows])
        causal = torch.ones(len(path), len(path), dtype=torch.bool).tril()  # plain causal over the path
        ref, _ = reference(q[rows], k[keys], v[keys], p, causal, d ** -0.5)
        _assert_close(out[rows], ref, torch.float32, what=f"path {path}")


@pytest.mark.triton
@pytest.mark.parametrize("tk,tq", [(10, 4), (100, 7)])
def test_fewer_queries_than_tree_keys(tk, tq):
    """The draft's expansion step: the newest tq nodes query every tree key so far (tk > 64: 4 mask words)."""
    gen = torch.Generator().manual_seed(tk)
    p, g, d = 17, 2, 64
    full = ta.ancestor_mask(_parents("random", tk, gen))
    mask = full[-tq:]
    q, k, v = _inputs(tq, p + tk, 2, g, d, torch.float32, gen)
    out = ta.tree_attention_masked(q, k, v, p, mask, impl="triton")
    _assert_close(out, reference(q, k, v, p, mask, d ** -0.5)[0], torch.float32)


@pytest.mark.triton
def test_strided_views_of_the_engine_cache():
    """k, v as the engine passes them, cache_k[layer, :, :n].transpose(0, 1); q sliced from a fused projection."""
    gen = torch.Generator().manual_seed(3)
    layers, hkv, max_len, g, d, p, t = 3, 2, 96, 3, 32, 40, 6
    cache_k = _randn(layers, hkv, max_len, d, dtype=torch.float16, gen=gen)
    cache_v = _randn(layers, hkv, max_len, d, dtype=torch.float16, gen=gen)
    fused = _randn(t, 2 * hkv * g * d, dtype=torch.float16, gen=gen)
    q = fused[:, : hkv * g * d].view(t, hkv * g, d)
    k, v = cache_k[1, :, : p + t].transpose(0, 1), cache_v[1, :, : p + t].transpose(0, 1)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    mask = ta.ancestor_mask(_parents("random", t, gen))
    out, _ = _run_kernel(q, k, v, p, mask, d ** -0.5)
    _assert_close(out, reference(q, k, v, p, mask, d ** -0.5)[0], torch.float16)
    torch.testing.assert_close(out, ta.tree_attention_masked(q, k, v, p, mask, impl="torch"), rtol=2e-3, atol=2e-3)


@pytest.mark.triton
@pytest.mark.parametrize("tq", [1, 3])
def test_no_mask_means_every_key_visible(tq):
    gen = torch.Generator().manual_seed(tq)
    q, k, v = _inputs(tq, 50, 1, 4, 32, torch.float32, gen)
    out = ta.tree_attention_masked(q, k, v, 50 - tq, None, impl="triton")
    _assert_close(out, reference(q, k, v, 50, None, 32 ** -0.5)[0], torch.float32)


@pytest.mark.triton
def test_bf16_runs_in_the_interpreter_through_fp32_tiles():
    gen = torch.Generator().manual_seed(11)
    q, k, v = _inputs(5, 35, 1, 2, 64, torch.bfloat16, gen)
    parents = _parents("random", 5, gen)
    out = ta.tree_attention(q, k, v, 30, parents, impl="triton")
    assert out.dtype == torch.bfloat16
    _assert_close(out, reference(q, k, v, 30, ta.ancestor_mask(parents), 64 ** -0.5)[0], torch.bfloat16)


def test_pack_mask_bits_is_lsb_first_with_one_word_per_32_keys():
    gen = torch.Generator().manual_seed(5)
    mask = torch.rand(6, 70, generator=gen) < 0.5
    mask[0, 31] = True  # the sign bit of word 0
    words = ta.pack_mask_bits(mask)
    assert words.dtype == torch.int32 and words.shape == (6, 3)
    assert words[0, 0] < 0
    unpacked = (words.long()[:, :, None] >> torch.arange(32)) & 1
    assert torch.equal(unpacked.view(6, 96)[:, :70].bool(), mask)
    assert not unpacked.view(6, 96)[:, 70:].any()


@pytest.mark.triton
def test_default_tiling_keeps_every_dot_dimension_at_least_16():
    for rows, d in itertools.product((1, 3, 16, 17, 64, 100, 256, 512), (16, 32, 64, 80, 128, 256)):
        cfg = ta.kernel_config(rows, d)
        assert min(cfg.block_m, cfg.block_n, cfg.block_d) >= 16 and cfg.block_d >= d
    assert ta.default_num_splits(32768, 8, 64, torch.device("cpu")) == 1


BAD_CALLS = ("root-not-first", "parent-after-child", "parents-2d", "parents-empty", "parents-too-short", "k-rows",
             "gqa-ratio", "head-dim", "v-shape", "q-2d", "mask-shape", "prefix-range", "dtype-mix", "impl-name")


def _bad_call(case: str, impl: str):
    gen = torch.Generator().manual_seed(0)
    q, k, v = _inputs(4, 14, 2, 2, 16, torch.float32, gen)
    parents = torch.tensor([-1, 0, 0, 1])
    calls = {
        "root-not-first": lambda: ta.tree_attention(q, k, v, 10, torch.tensor([0, 0, 0, 1]), impl=impl),
        "parent-after-child": lambda: ta.tree_attention(q, k, v, 10, torch.tensor([-1, 0, 3, 1]), impl=impl),
        "parents-2d": lambda: ta.tree_attention(q, k, v, 10, parents.view(2, 2), impl=impl),
        "parents-empty": lambda: ta.tree_attention(q, k, v, 10, torch.tensor([], dtype=torch.long), impl=impl),
        "parents-too-short": lambda: ta.tree_attention(q, k, v, 10, parents[:3], impl=impl),
        "k-rows": lambda: ta.tree_attention(q, k[:-1], v[:-1], 10, parents, impl=impl),
        "gqa-ratio": lambda: ta.tree_attention(q[:, :3], k, v, 10, parents, impl=impl),
        "head-dim": lambda: ta.tree_attention(q[..., :8], k, v, 10, parents, impl=impl),
        "v-shape": lambda: ta.tree_attention(q, k, v[:, :1], 10, parents, impl=impl),
        "q-2d": lambda: ta.tree_attention_masked(q[:, 0], k, v, 10, None, impl=impl),
        "mask-shape": lambda: ta.tree_attention_masked(q, k, v, 10, torch.ones(4, 3, dtype=torch.bool), impl=impl),
        "prefix-range": lambda: ta.tree_attention_masked(q, k, v, 15, None, impl=impl),
        "dtype-mix": lambda: ta.tree_attention(q.half(), k, v, 10, parents, impl="triton"),
        "impl-name": lambda: ta.tree_attention(q, k, v, 10, parents, impl="cuda"),
    }
    return calls[case]


@pytest.mark.parametrize("case", BAD_CALLS)
@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_invalid_inputs_raise_value_error(case, impl):
    with pytest.raises(ValueError):
        _bad_call(case, impl)()


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
@pytest.mark.parametrize("prefix,tokens,splits", [(0, 1, None), (37, 1, 3), (0, 16, None), (61, 20, 4), (95, 33, 2)])
def test_a_static_step_sees_its_prefix_and_tree_whatever_the_cache_holds_beyond(impl, prefix, tokens, splits):
    """A captured step attends over the whole static cache with P from device memory: it equals the engine's
    eager entry over exactly P + T keys, while every slot past them holds values large enough to show any
    leak (what a longer run left behind), and splits past P drop out of the merge."""
    gen = torch.Generator().manual_seed(prefix + tokens)
    capacity, kv_heads, group, head_dim = 160, 2, 3, 64
    q = _randn(tokens, kv_heads * group, head_dim, dtype=torch.float32, gen=gen)
    k, v = (_randn(capacity, kv_heads, head_dim, dtype=torch.float32, gen=gen) for _ in range(2))
    k[prefix + tokens:], v[prefix + tokens:] = 50.0, 1e4
    mask = ta.ancestor_mask(_parents("random", tokens, gen))
    want = ta.tree_attention_masked(q, k[:prefix + tokens], v[:prefix + tokens], prefix, mask, impl="torch")
    p = torch.tensor([prefix], dtype=torch.int32)
    if impl == "torch":
        got = ta.attention_static(q, k, v, p, ta.static_visibility(p, mask, capacity), impl="torch")
    else:
        got, _ = ta.tree_attention_static(q, k, v, p, ta.pack_mask_bits(mask), head_dim ** -0.5, num_splits=splits)
    _assert_close(got, want.double(), torch.float32)


def test_the_static_entry_refuses_a_prefix_the_host_holds():
    q, k = torch.zeros(2, 2, 16), torch.zeros(8, 1, 16)
    words = ta.pack_mask_bits(torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="int32"):
        ta.tree_attention_static(q, k, k, torch.tensor([3]), words, 0.25)


def _subprocess_env(**overrides) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env.update(overrides)
    return env


@pytest.mark.triton
@pytest.mark.parametrize("covering", [pytest.param(True, id="covering"),
                                      pytest.param(False, id="every-target", marks=pytest.mark.slow)])
def test_ahead_of_time_build_for_ampere_and_hopper_has_no_spills(covering):
    """Compile for sm_80 and sm_90 (no GPU needed) at D = 64/128, fp16/bf16, at the default tilings: the default
    run compiles the four targets of `kernels.aot.COVERING` (each arch with both dtypes and both head dims: half the
    compilations of the full build, which took 225 s on a 2-core AVX2-only EPYC), `-m slow` all eight."""
    from kernels.aot import COVERING

    flags = ["--covering"] if covering else []
    proc = subprocess.run([sys.executable, "-m", "kernels.aot", "--json", *flags], cwd=ROOT, env=_subprocess_env(),
                          capture_output=True, text=True, timeout=900)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert results, proc.stderr[-3000:]
    for r in results:
        print(f"{r['kernel']:>14} sm_{r['arch']} {r['dtype']} D={r['head_dim']:<3} BLOCK_M={r['block_m']:<3} "
              f"BLOCK_N={r['block_n']:<3} warps={r['num_warps']} registers={r['registers']:<3} "
              f"spills={r['stack_bytes'] + r['local_bytes']}B")
    # eager launches, a captured step's, and the fused layer kernels (kernels/layer_ops.py)
    # and the five-kernel layer's products (kernels/layer_products.py)
    for kernel in ("tree_attention", "tree_attention_static", "add_rms_norm", "rope_store", "silu_mul",
                   "norm_qkv_rope", "norm_gate_up", "matmul_residual", "norm_matmul"):
        combos = {(r["arch"], r["dtype"], r["head_dim"]) for r in results if r["kernel"] == kernel}
        assert combos == (set(COVERING) if covering else set(itertools.product((80, 90), ("fp16", "bf16"),
                                                                               (64, 128)))), kernel
    assert {r["arch"] for r in results if r["kernel"] == "log_softmax_topk"} == {80, 90}   # kernels/draft_select.py
    assert {(r["arch"], r["dtype"]) for r in results if r["kernel"] == "frontier"} == {
        (a, d) for a, d, _ in (COVERING if covering else itertools.product((80, 90), ("fp16", "bf16"), (64,)))}
    assert all(r["cubin_bytes"] > 0 for r in results)
    assert [r for r in results if r["stack_bytes"] + r["local_bytes"]] == []
    assert proc.returncode == 0


@pytest.mark.triton
def test_benchmark_smoke_mode_runs_in_the_interpreter():
    proc = subprocess.run([sys.executable, "-m", "kernels.bench", "--smoke"], cwd=ROOT,
                          env=_subprocess_env(TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 4


def test_roofline_table_covers_the_sweep():
    from kernels import bench

    table = bench.roofline_table().splitlines()
    assert len(table) == 2 + len(bench.PREFIXES) * len(bench.GROUPS)
    mem, comp = bench.predicted_us(bench.Case(32768, 4, 1))
    assert mem == pytest.approx(2 * 32768 * 8 * 128 * 2 / 3.35e6, rel=1e-3) and comp < mem


def test_not_mistaken_for_the_hugging_face_kernels_library():
    import kernels
    from transformers.utils import import_utils

    assert Path(importlib.util.find_spec("kernels").origin).resolve() == ROOT / "kernels" / "__init__.py"
    assert not hasattr(kernels, "__version__")
    import_utils.is_kernels_available.cache_clear()
    assert import_utils.is_kernels_available() is False


def test_torch_path_needs_no_triton(monkeypatch):
    """Triton has Linux wheels only: without it the module still imports and impl="auto" means torch."""
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("tree_attention_without_triton", ROOT / "kernels" / "tree_attention.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert module.resolve_impl("auto", torch.device("cuda")) == "torch"
    with pytest.raises(ValueError):
        module.resolve_impl("triton", torch.device("cpu"))
    gen = torch.Generator().manual_seed(2)
    q, k, v = _inputs(3, 8, 1, 2, 16, torch.float32, gen)
    parents = torch.tensor([-1, 0, 0])
    out = module.tree_attention(q, k, v, 5, parents)
    _assert_close(out, reference(q, k, v, 5, module.ancestor_mask(parents), 0.25)[0], torch.float32)
