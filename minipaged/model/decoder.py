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

**Products.** Once fused, every weight product of a step (Q/K/V, the attention output, gate/up,
down, the LM head) goes through a :class:`~minipaged.model.products.Product`: ``F.linear`` in the
weights' dtype, or, after :meth:`DecoderModel.pack_bf16`, bf16 weights prepacked for the CPU's
bf16 arithmetic while everything between the products stays fp32 (``LLM(dtype="auto")``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from minipaged.attention.cache_attention import CacheAttention
from minipaged.model.config import SUPPORTED_ACTIVATIONS, ModelConfig
from minipaged.model.products import PackedProduct, Product
from minipaged.model.rope import inverse_frequencies

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


class RotaryEmbedding(nn.Module):
    """Applies RoPE to packed queries or keys: ``x: [num_tokens, heads, head_dim]``, ``positions: [num_tokens]``.

    Dimensions ``i`` and ``i + head_dim/2`` form a pair rotated by ``position * inv_freq[i]`` (the
    "rotate half" layout of Hugging Face checkpoints; the frequencies: :mod:`minipaged.model.rope`).
    """

    inv_freq: torch.Tensor  # a buffer, registered below

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None) -> None:
        super().__init__()
        # Built on the CPU even when the model is built on the meta device (the loader does that):
        # a computed buffer is never in the checkpoint, so it must hold real numbers from the start.
        inv_freq, self.attention_scaling = inverse_frequencies(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

        self._cached: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[num_tokens, 1, head_dim]`` of ``positions``; every layer's queries and keys
        of a step use the same ones, so they are computed for the first and reused."""
        c = self._cached
        if c is not None and c[0] is positions and c[1] == dtype:
            return c[2], c[3]
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # fp32, as transformers computes them
        # On a CPU cos and sin are computed in float64 by numpy and rounded once: torch's own CPU
        # cos/sin were seen to return values off by up to 1.5e-4 in the first call of a process on a
        # busy machine (in 2-3 processes out of 30-45), so that two identical forwards in one
        # process gave logits 3e-3 apart and notebook 00's cache-vs-recompute check failed once in
        # CI. Other devices use torch's.
        if angles.device.type == "cpu":
            a = angles.numpy().astype(np.float64)
            cos_sin = (torch.from_numpy(np.cos(a)).float(), torch.from_numpy(np.sin(a)).float())
        else:
            cos_sin = (angles.cos(), angles.sin())
        cos, sin = (torch.cat([t, t], dim=-1)[:, None, :] for t in cos_sin)
        cos = (cos * self.attention_scaling).to(dtype)
        sin = (sin * self.attention_scaling).to(dtype)
        self._cached = (positions, dtype, cos, sin)
        return cos, sin

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin(positions, x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


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


def _stack(linears: list[nn.Linear]) -> Product:
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
    return Product(weight, bias)


def _packed(product: Product | None) -> PackedProduct | None:
    return None if product is None else PackedProduct(product.weight, product.bias)


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
        self.qkv: Product | None = None  # set by fuse()
        self.out: Product | None = None

    def fuse(self) -> None:
        """Stack q_proj, k_proj, v_proj into one ``[(heads + 2 kv_heads) * head_dim, hidden]`` weight."""
        if self.qkv is None:
            self.qkv = _stack([self.q_proj, self.k_proj, self.v_proj])
            self.out = Product(self.o_proj.weight, self.o_proj.bias)

    def pack_bf16(self) -> None:
        self.qkv, self.out = _packed(self.qkv), _packed(self.out)

    def products(self) -> list[Product | None]:
        return [self.qkv, self.out]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: CacheAttention) -> torch.Tensor:
        n, heads, kv_heads = x.shape[0], self.num_heads, self.num_kv_heads
        if self.qkv is not None and not hasattr(self, "q_norm"):
            # Fused: q's and k's heads sit side by side in one output, so one rotation serves both.
            qkv = self.qkv(x).view(n, heads + 2 * kv_heads, self.head_dim)
            q, k = self.rotary(qkv[:, : heads + kv_heads], positions).split([heads, kv_heads], dim=1)
            v = qkv[:, heads + kv_heads :]
        else:
            if self.qkv is None:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            else:
                q, k, v = self.qkv(x).split([heads * self.head_dim, *[kv_heads * self.head_dim] * 2], -1)
            q, k, v = q.view(n, heads, -1), k.view(n, kv_heads, -1), v.view(n, kv_heads, -1)
            if hasattr(self, "q_norm"):
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        out = attn.attend(self.layer, q, k, v)  # [num_tokens, num_heads, head_dim]
        return (self.out or self.o_proj)(out.reshape(n, -1))


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); with SiLU (the usual ``hidden_act``) this is SwiGLU."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_up: Product | None = None  # set by fuse()
        self.down: Product | None = None

    def fuse(self) -> None:
        """Stack gate_proj and up_proj into one ``[2 * intermediate, hidden]`` weight."""
        if self.gate_up is None:
            self.gate_up = _stack([self.gate_proj, self.up_proj])
            self.down = Product(self.down_proj.weight, self.down_proj.bias)

    def pack_bf16(self) -> None:
        self.gate_up, self.down = _packed(self.gate_up), _packed(self.down)

    def products(self) -> list[Product | None]:
        return [self.gate_up, self.down]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None or self.down is None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


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


def _new_modules(module: nn.Module, memo: dict[int, nn.Module]) -> Any:
    """A copy of ``module``'s tree of modules that shares its parameters and buffers (a module
    shared within the tree, such as the rotary embedding, stays shared once)."""
    if id(module) not in memo:
        new = copy.copy(module)  # a new __dict__; _parameters and _buffers still name the same tensors
        memo[id(module)] = new
        # torch has no public call that copies a module tree without copying its tensors
        children = module._modules.items()  # noqa: SLF001
        new._modules = {k: None if m is None else _new_modules(m, memo) for k, m in children}  # noqa: SLF001
    return memo[id(module)]


class DecoderModel(nn.Module):
    """Parameter names follow Hugging Face (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.head: Product | None = None  # set by fuse()

    def fuse(self) -> DecoderModel:
        """Stack each layer's Q/K/V and gate/up weights (see the module's docstring); call it once
        the weights are loaded and on their device. The state dict keeps its names and values, so
        loading into a fused model still works (in place). Fusing twice changes nothing."""
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse()
        if self.head is None:
            self.head = Product(self.lm_head.weight)
        return self

    def product_bytes(self) -> int:
        """Bytes the weight products read in one step (the LM head included, each fused matrix
        once; the embedding is read a row per token, so it counts only as the tied LM head)."""
        products = [self.head] + [p for m in self.modules() if isinstance(m, (Attention, MLP)) for p in m.products()]
        if any(p is None for p in products):
            raise RuntimeError("call fuse() first: the products are set up there")
        return sum(
            p.nbytes if isinstance(p, PackedProduct) else p.weight.numel() * p.weight.element_size()
            for p in products
            if p
        )

    def pack_bf16(self) -> DecoderModel:
        """A model whose weight products are all prepacked for the CPU (:mod:`minipaged.model.products`):
        in bf16, but the LM head in fp32. It is a new tree of modules over the same weights (this
        model is left as it is: one loaded model may serve several engines); the fp32 weights stay
        for the state dict and the embedding. The packed copies do not follow later weight changes."""
        self.fuse()
        packed = _new_modules(self, {})
        for module in packed.modules():
            if isinstance(module, (Attention, MLP)):
                module.pack_bf16()
        # The LM head stays fp32, packed too: logits rounded to bf16 (3 significant digits) flipped
        # the first greedy token of 6 of 128 real chats against fp32; an fp32 head, 1 of 128.
        if packed.head is not None:
            packed.head = PackedProduct(packed.head.weight, None, torch.float32)
        return packed

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
        return (self.head or self.lm_head)(x).float()
