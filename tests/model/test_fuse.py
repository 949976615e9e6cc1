"""DecoderModel.fuse(): Q/K/V and gate/up as one matrix each, the same logits, the same state dict."""

from __future__ import annotations

import torch
from test_model_parity import logits

from minipaged.model import load_model


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
    qkv, _ = attn.qkv
    assert qkv.shape == (attn.q_proj.out_features + 2 * attn.k_proj.out_features, attn.q_proj.in_features)
    # the separate weights are views of the stacked one: the values live once
    assert attn.v_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp.gate_up[0].untyped_storage().data_ptr()
    fused.fuse()  # twice changes nothing
    assert fused.model.layers[0].self_attn.qkv[0] is qkv
    with torch.inference_mode():
        for p in prompts:
            torch.testing.assert_close(logits(fused, p), logits(plain, p), rtol=1e-5, atol=1e-5)


def test_loading_into_a_fused_model_updates_the_stacked_weights(hf_checkpoint, prompts):
    _, folder = hf_checkpoint
    fused = load_model(folder)[0].fuse()
    state = {k: torch.zeros_like(v) if k.endswith("k_proj.weight") else v for k, v in fused.state_dict().items()}
    fused.load_state_dict(state)  # in place, into the views
    qkv, _ = fused.model.layers[1].self_attn.qkv
    q_rows = fused.model.layers[1].self_attn.q_proj.out_features
    k_rows = fused.model.layers[1].self_attn.k_proj.out_features
    assert torch.count_nonzero(qkv[q_rows : q_rows + k_rows]) == 0
    assert torch.count_nonzero(qkv[:q_rows]) > 0
