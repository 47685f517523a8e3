"""eagleviz/models/compat.py: a head that does not fit its target is refused before a single token, in one line
naming the mismatch; every published layout that fits passes with no mismatch at all."""

import pytest
import torch

from eagleviz.errors import UserFacingError
from eagleviz.models.compat import mismatches
from eagleviz.models.draft import load_head
from eagleviz.models.layouts import read_checkpoint
from published_heads import DRAFT_VOCAB, LAYOUT_CASES, edit_config, edit_weights, write_layout
from tiny import tiny_target

VOCAB = 32


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab=VOCAB)


def refused(path, target, *patterns):
    """Load `path` expecting one line that matches every pattern."""
    with pytest.raises(UserFacingError) as info:
        load_head(path, target)
    message = str(info.value)
    assert "\n" not in message and "does not fit the target tiny-llama" in message, message
    for pattern in patterns:
        assert pattern in message, message
    return message


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_every_published_layout_that_fits_has_no_mismatch(case, target, tmp_path):
    write_layout(tmp_path, case, target)
    assert mismatches(read_checkpoint(tmp_path), target) == []


def test_hidden_size(target, tmp_path):
    write_layout(tmp_path, "eagle1", target)
    edit_config(tmp_path, hidden_size=96)
    refused(tmp_path, target, "hidden size: the head is 96 wide, the target 64")


def test_target_hidden_size_of_an_eagle3_head(target, tmp_path):
    write_layout(tmp_path, "eagle3-safetensors", target)
    edit_config(tmp_path, target_hidden_size=80)
    refused(tmp_path, target, "target_hidden_size: the head fuses target features of width 80")


def test_vocab_size(target, tmp_path):
    other = tiny_target(vocab=48)
    write_layout(tmp_path, "eagle1", other)
    refused(tmp_path, target, "vocab size: the head was made for a vocabulary of 48, the target has 32")


def _vocab_maps():
    """Maps that agree: the draft vocabulary is the target's first DRAFT_VOCAB ids."""
    return {"t2d": torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, torch.arange(DRAFT_VOCAB), True),
            "d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.long)}


@pytest.mark.parametrize("change,phrase", [
    ({"d2t": torch.zeros(DRAFT_VOCAB + 2, dtype=torch.long)}, f"d2t has {DRAFT_VOCAB + 2} entries, draft_vocab_size "
                                                               f"is {DRAFT_VOCAB}"),
    ({"t2d": torch.ones(VOCAB + 1, dtype=torch.bool)}, f"t2d has {VOCAB + 1} entries, the target vocabulary {VOCAB}"),
    ({"d2t": torch.full((DRAFT_VOCAB,), VOCAB, dtype=torch.long)}, "d2t sends 8 draft tokens outside the target "
                                                                   "vocabulary"),
    ({"t2d": torch.ones(VOCAB, dtype=torch.bool)}, f"t2d marks {VOCAB} target tokens, draft_vocab_size is "
                                                   f"{DRAFT_VOCAB}"),
    ({"d2t": torch.full((DRAFT_VOCAB,), 10, dtype=torch.long)}, "d2t sends draft tokens to target ids that t2d does "
                                                                "not mark"),
    ({"d2t": None, "t2d": None}, "draft_vocab_size 8 is smaller than the vocabulary but the weights have no "
                                 "d2t"),
], ids=["d2t-length", "t2d-length", "d2t-outside", "t2d-count", "maps-disagree", "no-d2t"])
def test_draft_vocab_maps(change, phrase, target, tmp_path):
    write_layout(tmp_path, "eagle3-safetensors", target)
    edit_weights(tmp_path, **(_vocab_maps() | change))
    refused(tmp_path, target, "draft vocab maps: " + phrase)


def test_an_eagle3_config_over_eagle1_weights(target, tmp_path):
    write_layout(tmp_path, "eagle1", target)
    edit_config(tmp_path, draft_vocab_size=DRAFT_VOCAB)
    refused(tmp_path, target, "architecture: config.json describes an EAGLE-3 head but the weights are EAGLE-1's")


def test_an_eagle1_fusion_layer_in_an_eagle3_head(target, tmp_path):
    write_layout(tmp_path, "eagle3-safetensors", target)
    edit_weights(tmp_path, **{"fc.weight": torch.zeros(64, 128)})
    refused(tmp_path, target, "fc.weight has shape (64, 128) where an EAGLE-3 head of width 64 has (64, 192)")


def test_eagle1_layer_count_the_weights_contradict(target, tmp_path):
    write_layout(tmp_path, "eagle1", target)
    edit_config(tmp_path, num_hidden_layers=2)
    refused(tmp_path, target, "layer count: config.json says 2 decoder layers, the weights hold 1")


def test_an_eagle3_head_needs_a_target_three_layers_deep(tmp_path):
    shallow = tiny_target(vocab=VOCAB, layers=2)
    write_layout(tmp_path, "eagle3-safetensors", target=shallow)
    with pytest.raises(UserFacingError, match="target depth: .* the target has 2 layers"):
        load_head(tmp_path, shallow)


def test_target_layers_named_by_the_head(target, tmp_path):
    """vLLM's reading (the inputs of the named layers) and SGLang's (their outputs) of the layers eagleviz
    feeds are accepted; any other set is refused."""
    write_layout(tmp_path, "speculators-eagle3", target)
    ours = list(target.eagle3_layers)
    for fits in (ours, [i - 1 for i in ours]):
        edit_config(tmp_path, eagle_aux_hidden_state_layer_ids=fits)
        load_head(tmp_path, target)
    edit_config(tmp_path, eagle_aux_hidden_state_layer_ids=[0, 1, 3])
    refused(tmp_path, target, "target layers: the head was trained on the hidden states of target layers [0, 1, 3]")


def test_rope_scaling_that_cannot_be_reproduced(target, tmp_path):
    write_layout(tmp_path, "eagle1", target)
    edit_config(tmp_path, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    refused(tmp_path, target, "rope scaling: the head uses 'yarn' RoPE scaling")


def test_llama3_rope_scaling_and_a_theta_of_its_own_are_honoured(target, tmp_path):
    """Not mismatches: the draft rotates its own keys with the base and scaling it was trained with."""
    from eagleviz.models.layers import rope_inv_freq

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    write_layout(tmp_path, "eagle3-safetensors", target)
    edit_config(tmp_path, rope_theta=500000.0, rope_scaling=scaling)
    head = load_head(tmp_path, target)
    assert head.config.rope_theta == 500000.0 and dict(head.config.rope_scaling)["rope_type"] == "llama3"
    assert torch.equal(head.inv_freq, rope_inv_freq(16, 500000.0, scaling))
    assert not torch.equal(head.inv_freq, rope_inv_freq(16, 500000.0))


@pytest.mark.parametrize("change,phrase", [
    ({"num_key_value_heads": 3}, "attention heads: 4 query heads are not a multiple of 3 key/value heads"),
    ({"head_dim": 15}, "head_dim: RoPE rotates pairs of dimensions, the head's size is 15"),
    ({"head_dim": 32}, "head_dim: 4 heads of 32 need 128 query rows, q_proj has 64"),
    ({"num_attention_heads": 5}, "head_dim: config.json gives none and hidden size 64 is not a multiple of 5 heads"),
], ids=["kv-heads", "odd-head-dim", "head-dim-rows", "no-head-dim"])
def test_attention_shape(change, phrase, target, tmp_path):
    write_layout(tmp_path, "eagle1", target)
    edit_config(tmp_path, **change)
    refused(tmp_path, target, phrase)


@pytest.mark.parametrize("flag", ["norm_before_fc", "layernorms"])
def test_speculators_features_without_an_implementation(flag, target, tmp_path):
    write_layout(tmp_path, "speculators-eagle3" if flag == "norm_before_fc" else "speculators-eagle", target)
    edit_config(tmp_path, **{flag: True})
    refused(tmp_path, target, f"speculators' {flag}")


def test_several_mismatches_share_the_one_line(target, tmp_path):
    write_layout(tmp_path, "eagle1", target)
    edit_config(tmp_path, vocab_size=48, num_key_value_heads=3)
    message = refused(tmp_path, target, "vocab size", "attention heads")
    assert message.count("; ") >= 1


def _published(hidden, heads, kv, vocab, layers, arch, draft_vocab=None, **config):
    """A stand-in target of the given shape and a head checkpoint with a published config and weights of the
    published shapes (on the meta device: shapes without memory)."""
    from types import SimpleNamespace

    from eagleviz.models.layouts import Checkpoint

    target = SimpleNamespace(hidden_size=hidden, vocab_size=vocab, num_layers=layers, name="target",
                             eagle3_layers=(2, layers // 2, layers - 3))
    cfg = {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "intermediate_size": 4 * hidden, "num_hidden_layers": 1, "rms_norm_eps": 1e-5} | config
    head_dim = hidden // heads
    prefix = "midlayer." if arch == "eagle3" else "layers.0."
    state = {"fc.weight": torch.empty(hidden, (3 if arch == "eagle3" else 2) * hidden, device="meta"),
             prefix + "self_attn.q_proj.weight": torch.empty(heads * head_dim, (2 if arch == "eagle3" else 1) * hidden,
                                                             device="meta")}
    if draft_vocab:
        cfg["draft_vocab_size"] = draft_vocab
        used = torch.arange(0, vocab, vocab // draft_vocab)[:draft_vocab]
        state["d2t"] = used - torch.arange(draft_vocab)
        state["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, used, True)
    return Checkpoint("eagle3" if arch == "eagle3" else "eagle1", cfg, state), target


@pytest.mark.parametrize("pair", ["llama31-eagle3", "vicuna7b-eagle1", "llama3-eagle1", "qwen3-8b-speculators"])
def test_the_documented_pairs_fit_their_targets(pair):
    """docs/models.md's pairs, with the config fields their Hub pages show, against their targets' shapes:
    no mismatch (the EAGLE-3 Llama-3.1 head's RoPE base 10000 under a 500000 target included)."""
    ckpt, target = {
        "llama31-eagle3": lambda: _published(4096, 32, 8, 128256, 32, "eagle3", 32000, bos_token_id=128000),
        "vicuna7b-eagle1": lambda: _published(4096, 32, None, 32000, 32, "eagle1", bias=True),
        "llama3-eagle1": lambda: _published(4096, 32, 8, 128256, 32, "eagle1", bias=False, rope_theta=500000.0),
        "qwen3-8b-speculators": lambda: _published(4096, 32, 8, 151936, 36, "eagle3", 32000, head_dim=128,
                                                   rope_theta=10000.0, norm_before_residual=True,
                                                   eagle_aux_hidden_state_layer_ids=[2, 18, 33]),
    }[pair]()
    assert mismatches(ckpt, target) == []
