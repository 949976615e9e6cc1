"""A Qwen3 / Qwen2 / Llama / Mistral decoder, written for reading.

Tokens of all sequences in a step are packed into one flat batch: ``input_ids: [num_tokens]``,
``positions: [num_tokens]``. Attention is the only place where tokens of one sequence meet, so
the decoder hands it to a cache attention object (see :mod:`minipaged.attention.cache_attention`):
``attn.attend(layer, q, k, v)``. The decoder stays unaware of how the KV cache is laid out.

**Fused projections.** Q, K and V read the same input, and so do the MLP's gate and up: after
the weights are loaded, :meth:`DecoderModel.fuse` stacks each group into one matrix, so a layer
runs 4 matrix products instead of 7 (vLLM's ``QKVParallelLinear`` and
``MergedColumnParallelLinear`` do the same). At one row a product is a matrix-vector read of
its weights, and each call has a fixed cost; fewer, wider calls read the same bytes in fewer
launches. The separate ``q_proj`` ... ``up_proj`` weights become views into the stacked matrix:
no memory is spent twice, and the parameter names (Hugging Face's) stay what the loader checks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minipaged.attention.cache_attention import CacheAttention
from minipaged.model.config import SUPPORTED_ACTIVATIONS, ModelConfig
from minipaged.model.rope import RotaryEmbedding

# The MLP activations config.json may name (``hidden_act``), as transformers defines them.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # the same tanh formula, written out in transformers
    "relu": F.relu,
}
assert set(ACTIVATIONS) == set(SUPPORTED_ACTIVATIONS), "config.SUPPORTED_ACTIVATIONS lists what is implemented here"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as Hugging Face does, so fp32 logits match to 1e-5.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _stack(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight ``[sum of out_features, in_features]`` (and bias) for linears that read the same
    input; each linear's weight (and bias) becomes a view of its rows, so the values live once."""
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    row = 0
    for m in linears:
        rows = slice(row, row + m.out_features)
        m.weight = nn.Parameter(weight[rows], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[rows], requires_grad=False)
        row += m.out_features
    return weight, bias


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(
            self.num_heads * self.head_dim, cfg.hidden_size, bias=bias and cfg.model_type != "qwen2"
        )
        if cfg.qk_norm:  # Qwen3 normalises each head's query and key before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.rotary = rotary  # one module shared by every layer: cos/sin are computed once per step
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by fuse()

    def fuse(self) -> None:
        """Stack q_proj, k_proj, v_proj into one ``[(heads + 2 kv_heads) * head_dim, hidden]`` weight."""
        if self.qkv is None:
            self.qkv = _stack([self.q_proj, self.k_proj, self.v_proj])

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: CacheAttention) -> torch.Tensor:
        n, heads, kv_heads = x.shape[0], self.num_heads, self.num_kv_heads
        if self.qkv is not None and not hasattr(self, "q_norm"):
            # Fused: q's and k's heads sit side by side in one output, so one rotation serves both.
            qkv = F.linear(x, *self.qkv).view(n, heads + 2 * kv_heads, self.head_dim)
            q, k = self.rotary(qkv[:, : heads + kv_heads], positions).split([heads, kv_heads], dim=1)
            v = qkv[:, heads + kv_heads :]
        else:
            if self.qkv is None:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            else:
                q, k, v = F.linear(x, *self.qkv).split([heads * self.head_dim, *[kv_heads * self.head_dim] * 2], -1)
            q, k, v = q.view(n, heads, -1), k.view(n, kv_heads, -1), v.view(n, kv_heads, -1)
            if hasattr(self, "q_norm"):
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        out = attn.attend(self.layer, q, k, v)  # [num_tokens, num_heads, head_dim]
        return self.o_proj(out.reshape(n, -1))


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); with SiLU (the usual ``hidden_act``) this is SwiGLU."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by fuse()

    def fuse(self) -> None:
        """Stack gate_proj and up_proj into one ``[2 * intermediate, hidden]`` weight."""
        if self.gate_up is None:
            self.gate_up = _stack([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, *self.gate_up).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: CacheAttention) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nn.Module):
    """What sits between the tokens and the LM head: Hugging Face's ``model.`` prefix.

    It holds the parts; :meth:`DecoderModel.forward` runs them.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderModel(nn.Module):
    """Parameter names follow Hugging Face (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse(self) -> DecoderModel:
        """Stack each layer's Q/K/V and gate/up weights (see the module's docstring); call it once
        the weights are loaded and on their device. The state dict keeps its names and values, so
        loading into a fused model still works (in place). Fusing twice changes nothing."""
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse()
        return self

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: CacheAttention,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> logits [num_tokens or len(logits_indices), vocab] (fp32).

        ``logits_indices`` picks the tokens whose next-token logits are wanted (the last of
        each sequence when generating), which spares the LM head most of a prefill.
        """
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions, attn)
        x = self.model.norm(x)
        if logits_indices is not None:
            x = x[logits_indices]
        return self.lm_head(x).float()
