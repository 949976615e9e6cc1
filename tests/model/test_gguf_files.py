"""Bad GGUF files get a clear error before anything large is allocated; metadata keys are classified."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minipaged.model import load_model
from minipaged.model.gguf_reader import classify, unpermute_qk

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 8, 16, 2, 1, 4


def write_gguf(path, arch="llama", skip=(), wrong_shape=None, extra_keys=None, f16_ffn=False, int_norm=False):
    """A one-layer llama GGUF with random weights and a 4-token byte-level vocabulary."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(["a", "b", "ab", "<|im_end|>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(3)
    for key, value in (extra_keys or {}).items():
        w.add_string(key, value) if isinstance(value, str) else w.add_uint32(key, value)
    head = HIDDEN // HEADS
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.ffn_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HEADS * head, HIDDEN),
        "blk.0.attn_k.weight": (KV_HEADS * head, HIDDEN),
        "blk.0.attn_v.weight": (KV_HEADS * head, HIDDEN),
        "blk.0.attn_output.weight": (HIDDEN, HEADS * head),
        "blk.0.ffn_gate.weight": (FFN, HIDDEN),
        "blk.0.ffn_up.weight": (FFN, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN),
    }
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        if name in skip:
            continue
        shape = wrong_shape if name == "blk.0.ffn_up.weight" and wrong_shape else shape
        dtype = np.float16 if f16_ffn and "ffn_" in name and len(shape) == 2 else np.float32
        dtype = np.int32 if int_norm and name == "output_norm.weight" else dtype
        w.add_tensor(name, rng.standard_normal(shape).astype(dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_small_gguf_loads(tmp_path):
    model, tok = load_model(write_gguf(tmp_path / "m.gguf", f16_ffn=True))
    assert model.config.num_hidden_layers == 1 and model.config.tie_word_embeddings
    assert model.config.eos_token_ids == (3,)
    assert tok.encode("abab<|im_end|>") == [2, 2, 3]


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda p: p.write_bytes(b"PK\x03\x04 not a gguf at all"), ValueError, "not a GGUF file"),
        (lambda p: p.write_bytes(b"GGUF\x03\x00"), ValueError, "truncated"),
        (lambda p: p.write_bytes(write_gguf(p).read_bytes()[:-40]), ValueError, "truncated"),
        (lambda p: write_gguf(p, arch="gemma2"), ValueError, "architecture 'gemma2' is not supported"),
        (lambda p: write_gguf(p, skip=("blk.0.ffn_up.weight",)), ValueError, "lacks 1 tensors"),
        (lambda p: write_gguf(p, wrong_shape=(FFN + 1, HIDDEN)), ValueError, "ffn.*shape|up_proj.*shape"),
        (lambda p: write_gguf(p, extra_keys={"llama.expert_count": 8}), ValueError, "llama.expert_count=8"),
        (lambda p: write_gguf(p, extra_keys={"llama.attention.sliding_window": 4}), ValueError, "sliding_window"),
        (lambda p: write_gguf(p, extra_keys={"llama.rope.scaling.type": "yarn"}), ValueError, "rope.scaling.type"),
    ],
)
def test_bad_files_are_refused_clearly(tmp_path, make, error, match):
    path = tmp_path / "bad.gguf"
    make(path)
    with pytest.raises(error, match=match):
        load_model(path)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("llama.block_count", 2**31, "block_count=2147483648, but the file holds the tensors of 1 blocks"),
        ("llama.block_count", 0, "block_count=0 is not a size"),
        ("llama.attention.head_count", 0, "head_count=0 is not a size"),
    ],
)
def test_sizes_the_tensors_do_not_bear_out_are_refused(tmp_path, key, value, match):
    """A damaged count is refused before a model of 2^31 layers is built, or a size of 0 divides."""
    import gguf

    path = write_gguf(tmp_path / "m.gguf")
    field = gguf.GGUFReader(path).fields[key]
    at = field.offset + sum(int(p.nbytes) for p in field.parts[:3])  # after the key's length, name and type
    raw = bytearray(path.read_bytes())
    raw[at : at + 4] = value.to_bytes(4, "little")
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=match):
        load_model(path)


def test_unsupported_tensor_type_is_refused(tmp_path):
    """A tensor type the gguf package knows but minipaged does not read (I32) is named, before dequantizing."""
    with pytest.raises(ValueError, match="output_norm.weight has type I32"):
        load_model(write_gguf(tmp_path / "m.gguf", int_norm=True))


def test_keys_are_classified():
    assert classify("general.license", "apache-2.0", "llama") == "ignored"
    assert classify("llama.block_count", 30, "llama") == "config"
    assert classify("tokenizer.ggml.merges", [], "llama") == "tokenizer"
    assert classify("llama.rope.scaling.type", "none", "llama") == "ignored"
    with pytest.raises(ValueError, match="llama.mystery_switch"):
        classify("llama.mystery_switch", 1, "llama")


def test_unpermute_qk_undoes_llama_cpps_permutation():
    heads, head_dim = 3, 4
    w = torch.arange(heads * head_dim * 2, dtype=torch.float32).reshape(heads * head_dim, 2)
    # llama.cpp's converter: per head, rows of the two halves interleaved
    permuted = w.reshape(heads, 2, head_dim // 2, 2).transpose(1, 2).reshape(w.shape)
    assert torch.equal(unpermute_qk(permuted, heads), w)
    assert not torch.equal(permuted, w)
