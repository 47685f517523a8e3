"""eagleviz/models: our forward matches Hugging Face's; EAGLE features; draft-head checkpoints in the official
formats (EAGLE-1 pytorch_model.bin, EAGLE-3 model.safetensors with a draft vocabulary) load and are checked."""

import json

import pytest
import torch

from eagleviz.errors import UserFacingError
from eagleviz.models.draft import DraftConfig, DraftHead, load_head, random_head, save_head
from eagleviz.models import layers
from eagleviz.models.layers import attention_dtype
from eagleviz.models.loading import resolve_kv_dtype
from eagleviz.models.target import TargetModel
from tiny import TinyTokenizer, random_hf_model, tiny_target


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mistral"])
def test_forward_matches_hf_logits_and_features(model_type):
    target = tiny_target(model_type, layers=8)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # HF initialises biases to 0 and norms to 1: make them count
        for name, param in target.hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5 + (1.0 if "norm" in name else 0.0))
    target = TargetModel(target.hf, target.tokenizer, target.name)  # fuse and pack the new values
    ids = torch.tensor([1, 5, 2, 7, 3, 9, 4])
    n = len(ids)
    with torch.no_grad():
        ref = target.hf(ids[None], output_hidden_states=True)
    out = target.forward(ids, torch.arange(n), target.new_cache(16), torch.ones(n, n, dtype=torch.bool).tril())
    torch.testing.assert_close(out.logits, ref.logits[0].float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.features, ref.hidden_states[-1][0], atol=1e-5, rtol=1e-5)
    low, mid, high = target.eagle3_layers
    e3 = target.forward(ids, torch.arange(n), target.new_cache(16), torch.ones(n, n, dtype=torch.bool).tril(),
                        feature_layers=target.eagle3_layers).features
    want = torch.cat([ref.hidden_states[i][0] for i in (low, mid, high)], dim=-1)
    torch.testing.assert_close(e3, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_rope_rows_read_from_the_table_are_the_rotary_modules_own(head_dim):
    """`_rope_rows` reads a table made in blocks (a head of 64 or 128) or a row at a time (16): every row is bit for
    bit what the model's rotary module gives for that position alone, as the forward used to call it; the table
    grows when a longer cache asks."""
    shape = {"model_type": "llama", "vocab_size": 32, "hidden_size": 2 * head_dim, "intermediate_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": head_dim,
             "max_position_embeddings": 4096, "tie_word_embeddings": False}
    target = TargetModel(random_hf_model(shape, 0, torch.float32), TinyTokenizer(), "rope")
    probe = torch.empty(1)
    for capacity in (300, 1500):
        positions = torch.arange(capacity)
        cos, sin = target._rope_rows(capacity, torch.float32, positions)
        assert cos.shape == (capacity, head_dim) and target._rope_table[0].shape[0] >= capacity
        for p in range(0, capacity, 1 if capacity == 300 else 7):
            want_cos, want_sin = target._rotary(probe, torch.tensor([[p]]))
            assert torch.equal(cos[p], want_cos[0, 0]) and torch.equal(sin[p], want_sin[0, 0]), (head_dim, p)
    tree = torch.tensor([40, 41, 41, 42])  # a tree's positions: depths repeat
    assert torch.equal(target._rope_rows(64, torch.float32, tree)[0], target._rotary(probe, tree[None])[0][0])


def test_attention_dtype_takes_fp32_only_where_it_wins_clearly(monkeypatch):
    calls = []

    def probe(dtype, kv_dtype, *shape):  # microseconds: fp32 costs `ratio` of the native dtype
        calls.append(kv_dtype)
        return 100.0 * (ratio if kv_dtype == torch.float32 else 1.0)

    monkeypatch.setattr(layers, "_attention_probe_us", probe)
    for ratio, want in ((0.5, torch.float32), (0.79, torch.float32), (0.9, torch.bfloat16), (1.5, torch.bfloat16)):
        assert attention_dtype(torch.bfloat16, "cpu", 4, 2, 16) == want
    calls.clear()
    assert attention_dtype(torch.float32, "cpu", 4, 2, 16) == torch.float32
    assert attention_dtype(torch.bfloat16, "cuda:0", 4, 2, 16) == torch.bfloat16
    assert calls == []  # fp32 models and CUDA are never probed


def test_the_real_probe_times_both_dtypes():
    assert all(layers._attention_probe_us(torch.bfloat16, kv, 4, 2, 16, prefix=32, repeats=2) > 0
               for kv in (torch.bfloat16, torch.float32))


def test_kv_dtype_choices_resolve():
    assert resolve_kv_dtype("auto", torch.bfloat16) is None
    assert resolve_kv_dtype("model", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_dtype("float32", torch.bfloat16) == torch.float32
    with pytest.raises(UserFacingError, match="kv_dtype"):
        resolve_kv_dtype("int8", torch.bfloat16)


def test_fp32_keys_and_values_of_a_bf16_model_lose_nothing():
    """A bf16 model keeping its cache in fp32 stores exactly its bf16 keys and values, and its logits stay as
    close to Hugging Face's bf16 forward as the all-bf16 path's."""
    target = tiny_target(dtype=torch.bfloat16, layers=6)
    ids = torch.tensor([1, 5, 2, 7, 3, 9, 4, 8])
    n, causal = len(ids), torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    with torch.no_grad():
        ref = target.hf(ids[None]).logits[0].float()
    errors = {}
    for kv in (torch.bfloat16, torch.float32):
        model = TargetModel(target.hf, target.tokenizer, target.name, kv_dtype=kv)
        cache = model.new_cache(16)
        out = model.forward(ids, torch.arange(n), cache, causal)
        assert cache.k.dtype == kv and cache.v.dtype == kv
        for stored in (cache.k[:, :, :n], cache.v[:, :, :n]):
            assert torch.equal(stored.bfloat16().to(kv), stored)  # bf16 values, whatever the storage
        errors[kv] = (out.logits - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert errors[torch.float32] < 0.02 * scale and errors[torch.bfloat16] < 0.02 * scale, (errors, scale)


def test_a_bf16_head_drafts_over_an_fp32_cache():
    from eagleviz.config import SamplingConfig, TreeConfig
    from eagleviz.decoding.engine import Engine

    target = tiny_target(dtype=torch.bfloat16)
    fp32kv = TargetModel(target.hf, target.tokenizer, target.name, kv_dtype=torch.float32)
    engine = Engine(fp32kv, random_head(fp32kv, "eagle3", seed=1, std=0.5), "random")
    run = engine.generate("abcde", TreeConfig.create(3, 2, 6), SamplingConfig(max_new_tokens=12), chat=False)
    assert len(run.output) == 12 and run.cycles and all(len(c.tokens) <= 6 for c in run.cycles)


def official_eagle1_state(head: DraftHead, target) -> dict:
    """The key set of yuhuili/EAGLE-* checkpoints: includes the frozen embedding copy, no norm/lm_head."""
    state = {k: v.clone() for k, v in head.state_dict().items()}
    state["embed_tokens.weight"] = target.hf.model.embed_tokens.weight.detach().clone()
    return state


def test_eagle1_pytorch_model_bin_loads(tmp_path):
    target = tiny_target()
    head = random_head(target, "eagle1", seed=3)
    assert "layers.0.input_layernorm.weight" not in head.state_dict()
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"} <= set(head.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(head.config.to_hf()))
    torch.save(official_eagle1_state(head, target), tmp_path / "pytorch_model.bin")
    loaded = load_head(tmp_path, target)
    for k, v in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)


def test_eagle3_safetensors_with_draft_vocab_loads(tmp_path):
    target = tiny_target(vocab=32)
    cfg = DraftConfig.for_target(target, "eagle3", draft_vocab_size=8)
    head = DraftHead(cfg)
    used = torch.tensor([0, 2, 3, 5, 8, 13, 21, 30])
    head.d2t.copy_(used - torch.arange(8))
    head.t2d.zero_()
    head.t2d[used] = True
    keys = set(head.state_dict())
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight", "lm_head.weight",
            "d2t", "t2d"} <= keys
    assert head.state_dict()["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * target.hidden_size
    assert head.fc.weight.shape == (target.hidden_size, 3 * target.hidden_size)
    save_head(head, tmp_path, dtype=torch.float32)
    loaded = load_head(tmp_path, target)
    assert loaded.config.arch == "eagle3" and loaded.config.draft_vocab_size == 8
    assert loaded.to_target_ids(torch.arange(8)).tolist() == used.tolist()


def test_head_that_does_not_fit_names_both_shapes(tmp_path):
    small, other = tiny_target(), tiny_target(vocab=48)
    save_head(random_head(other), tmp_path)
    with pytest.raises(UserFacingError, match=r"48.*32|vocabulary of 48"):
        load_head(tmp_path, small)


def test_head_with_wrong_tensor_shape_names_both(tmp_path):
    target = tiny_target()
    head = random_head(target)
    save_head(head, tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["fc.weight"] = torch.zeros(64, 100)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserFacingError, match=r"\(64, 100\).*\(64, 128\)"):
        load_head(tmp_path, target)


def test_corrupt_head_file_is_a_clear_error(tmp_path):
    target = tiny_target()
    save_head(random_head(target), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(UserFacingError, match="corrupt"):
        load_head(tmp_path, target)


def test_model_loads_with_our_kernels_package_importable(tmp_path):
    """`kernels` is also the name of Hugging Face's kernel-hub library, which transformers probes for while
    loading a model: ours must never be taken for it."""
    import kernels.tree_attention  # noqa: F401  (ours, importable from the repo)
    from transformers import AutoModelForCausalLM
    from transformers.utils import import_utils

    tiny_target().hf.save_pretrained(tmp_path)
    import_utils.is_kernels_available.cache_clear()
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert import_utils.is_kernels_available() is False
    assert model.config.model_type == "llama"


@pytest.mark.parametrize("params", [
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
], ids=["llama3", "linear"])
def test_rope_scalings_match_transformers(params):
    """The RoPE scalings a draft head may carry (its config's rope_scaling) rotate as Hugging Face's do."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, head_dim=128, max_position_embeddings=131072,
                      rope_parameters=params)
    want, attention_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    assert attention_scale == 1.0  # only the angles change: what rope_inv_freq reproduces
    torch.testing.assert_close(layers.rope_inv_freq(128, params["rope_theta"], params), want, rtol=0, atol=0)


def test_a_head_named_by_hub_id_is_downloaded_once_and_a_directory_is_used_as_is(monkeypatch, tmp_path):
    import huggingface_hub

    from eagleviz.decoding.load import local_head

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, allow_patterns: asked.append(repo) or str(tmp_path / "snapshot"))
    assert local_head("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == str(tmp_path / "snapshot")
    assert local_head(str(tmp_path)) == str(tmp_path) and local_head("random") == "random"
    assert local_head(None) is None and asked == ["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]

    def offline(repo, allow_patterns):
        raise OSError("We couldn't connect to 'https://huggingface.co'\nmore")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(UserFacingError, match="not a directory here, and as a Hub id it could not be downloaded: OSError: We couldn't"):
        local_head("owner/head")
