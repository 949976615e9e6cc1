"""``load_model``: a checkpoint folder in, a decoder out, or an error that names the problem."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from modelkit import make_hf_model
from safetensors.torch import load_file, save_file

from minipaged.model import EMBEDDED_MODEL_DIR, load_model


@pytest.fixture
def folder(tiny_model_dir, tmp_path):
    """A writable copy of the tiny random Qwen3 checkpoint."""
    return shutil.copytree(tiny_model_dir, tmp_path / "ckpt")


def edit_config(folder, **fields):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **fields}))


def test_missing_things_are_named(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    (folder / "model.safetensors").rename(tmp_path / "weights")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(folder)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(model_type="gpt2"), "unsupported model_type 'gpt2'"),
        (dict(hidden_size=32), "shape"),
        (dict(num_hidden_layers=3, layer_types=None), r"lacks 11 tensors, e.g. \['model.layers.2"),
        (dict(num_hidden_layers=1, layer_types=None), r"has 11 unknown tensors, e.g. \['model.layers.1"),
        (dict(attention_bias=True), r"lacks 8 tensors, e.g. \['model.layers.0.self_attn.k_proj.bias"),
        (
            dict(use_sliding_window=True, sliding_window=8, max_window_layers=0, layer_types=None),
            "use_sliding_window=True with sliding_window=8",
        ),
    ],
)
def test_bad_configs_are_refused_with_the_reason(folder, fields, match):
    edit_config(folder, **fields)
    with pytest.raises(ValueError, match=match):
        load_model(folder)


def test_tied_embeddings_share_one_matrix_even_if_lm_head_is_saved(folder):
    """With tie_word_embeddings, transformers ignores a saved lm_head copy: so do we."""
    edit_config(folder, tie_word_embeddings=True)
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = torch.zeros_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, folder / "model.safetensors")
    model, _ = load_model(folder)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"])


def test_nothing_is_left_on_the_meta_device(tiny_model_dir):
    model, _ = load_model(tiny_model_dir, dtype=torch.bfloat16)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert tensors and not any(t.is_meta for t in tensors.values())
    assert {t.dtype for n, t in model.named_parameters()} == {torch.bfloat16}


def test_generation_config_stop_ids_reach_the_model_config(tmp_path):
    """Llama 3 lists several EOS ids; generation_config.json may add more. All of them stop generation."""
    hf = make_hf_model("llama", eos_token_id=[5, 6])
    hf.generation_config.eos_token_id = [6, 9]
    hf.save_pretrained(tmp_path)
    model, _ = load_model(tmp_path)
    assert model.config.eos_token_ids == (5, 6, 9)
    assert model.config.eos_token_id == 5


def test_embedded_model_loads_with_its_byte_tokenizer():
    model, tok = load_model()
    assert model.config.eos_token_ids == (tok.eos_token_id,) == (258,)
    assert tok.decode(tok.encode("abc<copy>")) == "abc"
    assert (EMBEDDED_MODEL_DIR / "config.json").exists()
