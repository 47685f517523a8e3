"""eagleviz/models/kv_cache.py: the commit ("KV rewind") equals a sequential prefill of the accepted tokens."""

import random

import pytest
import torch

from eagleviz.models.kv_cache import KVCache
from kernels.tree_attention import ancestor_mask
from tiny import tiny_target


def random_tree(rng: random.Random, t: int) -> list[int]:
    return [-1] + [rng.randrange(i) for i in range(1, t)]


def depths_of(parents):
    d = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_commit_equals_sequential_prefill(model_type):
    target = tiny_target(model_type)
    rng = random.Random(0)
    prompt = [3, 1, 4, 1, 5, 9, 2]
    for trial in range(10):
        t = rng.randint(2, 12)
        parents = random_tree(rng, t)
        tokens = [rng.randrange(target.vocab_size) for _ in range(t)]
        cache = target.new_cache(64)
        n = len(prompt)
        target.forward(torch.tensor(prompt), torch.arange(n), cache, torch.ones(n, n, dtype=torch.bool).tril())
        target.forward(torch.tensor(tokens), n + torch.tensor(depths_of(parents)), cache,
                       ancestor_mask(torch.tensor(parents)))
        leaf = rng.randrange(t)
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path = path[::-1]
        moves = cache.commit_path(n, [n + s for s in path])
        assert cache.length == n + len(path)
        assert all(dst < src for src, dst in moves)

        seq = prompt + [tokens[s] for s in path]
        ref = target.new_cache(64)
        m = len(seq)
        target.forward(torch.tensor(seq), torch.arange(m), ref, torch.ones(m, m, dtype=torch.bool).tril())
        torch.testing.assert_close(cache.k[:, :, :m], ref.k[:, :, :m], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.v[:, :, :m], ref.v[:, :, :m], atol=1e-5, rtol=1e-5)


def test_commit_of_a_prefix_in_place_moves_nothing():
    cache = KVCache.allocate(2, 1, 16, 4, torch.float32)
    cache.length = 10
    assert cache.commit_path(5, [5, 6, 7]) == [] and cache.length == 8


def test_rewind_and_overflow_are_checked():
    cache = KVCache.allocate(1, 1, 4, 2, torch.float32)
    with pytest.raises(ValueError, match="overflow"):
        cache.write(0, 3, torch.zeros(2, 1, 2), torch.zeros(2, 1, 2))
    with pytest.raises(ValueError):
        cache.rewind(1)
