"""DecoderModel.fuse(): Q/K/V and gate/up as one matrix each, the same logits, the same state dict."""

from __future__ import annotations

import torch
from test_model_parity import logits

from minipaged.model import load_model
from minipaged.model.products import PackedProduct, Product


def test_fused_model_gives_the_same_logits_and_keeps_its_state_dict(hf_checkpoint, prompts):
    """Both families: Qwen3 (q/k norms: the separate RoPE path) and a tied Llama (one RoPE for q and k)."""
    _, folder = hf_checkpoint
    plain, _ = load_model(folder)
    fused, _ = load_model(folder)
    before = {k: v.clone() for k, v in fused.state_dict().items()}
    assert fused.fuse() is fused
    assert fused.state_dict().keys() == before.keys()
    for name, value in fused.state_dict().items():
        assert torch.equal(value, before[name]), name
    attn, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert attn.qkv is not None and mlp.gate_up is not None
    qkv = attn.qkv.weight
    assert qkv.shape == (attn.q_proj.out_features + 2 * attn.k_proj.out_features, attn.q_proj.in_features)
    # the separate weights are views of the stacked one: the values live once
    assert attn.v_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp.gate_up.weight.untyped_storage().data_ptr()
    fused.fuse()  # twice changes nothing
    assert fused.model.layers[0].self_attn.qkv.weight is qkv
    with torch.inference_mode():
        for p in prompts:
            torch.testing.assert_close(logits(fused, p), logits(plain, p), rtol=1e-5, atol=1e-5)


def test_loading_into_a_fused_model_updates_the_stacked_weights(hf_checkpoint, prompts):
    _, folder = hf_checkpoint
    fused = load_model(folder)[0].fuse()
    state = {k: torch.zeros_like(v) if k.endswith("k_proj.weight") else v for k, v in fused.state_dict().items()}
    fused.load_state_dict(state)  # in place, into the views
    qkv = fused.model.layers[1].self_attn.qkv.weight
    q_rows = fused.model.layers[1].self_attn.q_proj.out_features
    k_rows = fused.model.layers[1].self_attn.k_proj.out_features
    assert torch.count_nonzero(qkv[q_rows : q_rows + k_rows]) == 0
    assert torch.count_nonzero(qkv[:q_rows]) > 0


def test_bf16_products_stay_close_to_fp32_and_keep_the_state_dict(hf_checkpoint, prompts):
    """pack_bf16(): every product in prepacked bf16 (dtype="auto" on a CPU with bf16 arithmetic)."""
    _, folder = hf_checkpoint
    plain = load_model(folder)[0].fuse()
    packed = load_model(folder)[0].fuse()
    before = {k: v.clone() for k, v in packed.state_dict().items()}
    unpacked = packed
    packed = unpacked.pack_bf16()
    assert packed is not unpacked and type(unpacked.head) is Product  # a new tree, the old one left as it was
    assert packed.lm_head.weight is unpacked.lm_head.weight  # over the same weights
    assert packed.model.layers[0].self_attn.rotary is packed.model.layers[1].self_attn.rotary
    assert isinstance(packed.model.layers[0].mlp.down, PackedProduct)
    assert isinstance(packed.head, PackedProduct) and packed.head.dtype == torch.float32  # fp32 logits
    for name, value in packed.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, before[name]), name
    agree = []
    with torch.inference_mode():
        for p in prompts:
            want, got = logits(plain, p), logits(packed, p)
            assert got.dtype == torch.float32 and not torch.equal(got, want)  # bf16 rounding shows
            # random weights (initializer_range 0.5) amplify rounding; a real model's are far closer
            # (tests/model/test_gguf_parity.py holds SmolLM2's answers and perplexity to fp32's)
            assert (got - want).abs().max() < 0.1 * want.abs().max()
            assert (got - want).abs().mean() < 0.05 * want.abs().mean()
            agree += (got.argmax(-1) == want.argmax(-1)).tolist()
    assert sum(agree) >= 0.85 * len(agree)  # near-ties of random logits may flip


def test_a_packed_product_is_f_linear_in_its_dtype_returned_in_the_inputs_dtype():
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32), torch.randn(48)
    packed = PackedProduct(weight, bias)
    for rows in (0, 1, 7, 33):
        x = torch.randn(rows, 32)
        y = packed(x)
        assert y.dtype == torch.float32 and y.shape == (rows, 48)
        want = torch.nn.functional.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16()).float()
        assert torch.equal(y, want)
        fp32 = PackedProduct(weight, bias, torch.float32)(x)  # fp32 packed: fp32 precision
        torch.testing.assert_close(fp32, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
