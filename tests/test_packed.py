"""eagleviz/models/packed.py: tensors already in a block form (GGUF's Q4_1 and Q8_0) are found in it and stored
exactly; anything else is kept as it is; a packed directory builds the same Hugging Face model."""

import json

import pytest
import torch

from eagleviz.models import packed
from eagleviz.models.synthetic import random_hf_model


def q4_1_values(shape, seed=0) -> torch.Tensor:
    """Values as llama.cpp's Q4_1 quantizer leaves them: per block of 32, d = (max - min) / 15 and m = min
    stored in fp16, q = round((x - min) / d), dequantized d * q + m in fp32."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).reshape(-1, 32)
    lo, hi = x.min(1, keepdim=True).values, x.max(1, keepdim=True).values
    d = ((hi - lo) / 15)
    q = ((x - lo) / d).round().clamp(0, 15)
    return (d.half().float() * q + lo.half().float()).reshape(shape)


def q8_0_values(shape, seed=0) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).reshape(-1, 32)
    d = x.abs().max(1, keepdim=True).values / 127
    return (d.half().float() * (x / d).round().clamp(-128, 127)).reshape(shape)


@pytest.mark.parametrize("fmt,values", [("q4_1", q4_1_values), ("q8_0", q8_0_values)])
def test_a_tensor_in_a_block_form_is_found_in_it_and_restored_bit_for_bit(fmt, values):
    x = values((96, 64))
    got, parts = packed.pack_tensor(x)
    assert got == fmt
    assert torch.equal(packed._dequantize(fmt, parts, [96, 64]), x)
    stored = sum(p.numel() * p.element_size() for p in parts.values())
    assert stored <= x.numel() * x.element_size() * (5 / 32 if fmt == "q4_1" else 8.5 / 32) + 1


def test_a_block_of_equal_values_and_a_block_of_zeros_are_exact():
    x = torch.cat([torch.full((1, 32), 0.5), torch.zeros(1, 32)]).repeat(2, 1)
    fmt, parts = packed.pack_tensor(x)
    assert fmt == "q4_1" and torch.equal(packed._dequantize(fmt, parts, list(x.shape)), x)


@pytest.mark.parametrize("x", [torch.randn(64, 64), torch.randn(32), torch.randn(8, 30),
                               torch.arange(64).reshape(2, 32), torch.randn(64, 64).bfloat16()])
def test_anything_else_is_kept_as_it_is(x):
    fmt, parts = packed.pack_tensor(x)
    assert fmt == "raw" and parts[""].dtype == x.dtype and torch.equal(parts[""], x)


def test_a_packed_state_round_trips_exactly(tmp_path):
    state = {"a": q4_1_values((64, 32), 1), "b": q8_0_values((32, 64), 2), "norm": torch.randn(64),
             "half": torch.randn(4, 32).half()}
    counts = packed.save_packed(state, tmp_path, source="org/model")
    assert counts == {"q4_1": 1, "q8_0": 1, "raw": 2}
    assert packed.is_packed(tmp_path) and packed.source_name(tmp_path) == "org/model"
    back = packed.load_packed(tmp_path)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    assert back["half"].dtype == torch.float16


TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 128, "tie_word_embeddings": True}


def test_a_packed_directory_builds_the_same_model_with_tied_embeddings(tmp_path):
    hf = random_hf_model(TINY, seed=3)
    with torch.no_grad():  # weights in the block forms, as a GGUF file's dequantized weights are
        for i, (name, p) in enumerate(hf.named_parameters()):
            if p.dim() == 2:
                p.copy_(q4_1_values(tuple(p.shape), i) if "embed" not in name else q8_0_values(tuple(p.shape), i))
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    assert packed.save_packed(state, tmp_path)["raw"] == 2 * 2 + 1  # the norms
    hf.config.save_pretrained(tmp_path)
    built = packed.load_model(tmp_path, torch.bfloat16)
    assert built.lm_head.weight.data_ptr() == built.model.embed_tokens.weight.data_ptr()
    want = hf.to(torch.bfloat16).state_dict()
    assert all(torch.equal(v, want[k]) for k, v in built.state_dict().items())


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path):
    hf = random_hf_model(TINY, seed=0)
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"} | {"extra.weight": torch.zeros(2)}
    packed.save_packed(state, tmp_path)
    hf.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="do not fit its config.json"):
        packed.load_model(tmp_path, torch.float32)
    info = json.loads((tmp_path / packed.PACKING_FILE).read_text())
    info["tensors"]["extra.weight"]["format"] = "q3_k"
    (tmp_path / packed.PACKING_FILE).write_text(json.dumps(info))
    with pytest.raises(ValueError, match="unknown format 'q3_k'"):
        packed.load_packed(tmp_path)
