"""The one place the KV cache layout is chosen: memory manager, cache tensors, attention.

``kv_layout="paged"`` (the default) gives a block pool of ``num_blocks x block_size`` slots
managed block by block (:class:`~minipaged.engine.kv_manager.PagedKVManager`), and with
``preemption_mode="swap"`` a host pool that preempted blocks move to. ``"contiguous"`` gives
the same slots managed as stage 0 manages them, one reservation per sequence
(:class:`~minipaged.engine.contiguous_manager.ContiguousKVManager`), stored as a pool of
one-slot blocks so that the same attention reads both. Nothing else in the engine asks which
layout it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minipaged.attention.cache_attention import PagedAttention
from minipaged.engine.config import EngineConfig, block_nbytes
from minipaged.engine.contiguous_manager import ContiguousKVManager
from minipaged.engine.kv_cache_manager import KVCacheManager
from minipaged.engine.kv_manager import PagedKVManager
from minipaged.engine.plugins import EnginePlugins
from minipaged.kernels.choose import get_backend
from minipaged.kv.paged_cache import PagedKVCache
from minipaged.model.config import ModelConfig


@dataclass
class KVLayout:
    manager: KVCacheManager  # the scheduler's one door, whichever layout is behind it
    cache: PagedKVCache  # [num_layers, num_blocks, block_size, kv_heads, head_dim] for K and for V
    attention: PagedAttention
    host_cache: PagedKVCache | None = None  # swap space


def build_kv_layout(
    cfg: EngineConfig,
    model: ModelConfig,
    num_blocks: int,
    max_model_len: int,
    dtype: torch.dtype,
    device: torch.device,
    plugins: EnginePlugins | None = None,
) -> KVLayout:
    """``plugins``: the attention backend, and the paged manager's pool, hashing, prefix lookup,
    copy-on-write and fork (:mod:`minipaged.engine.plugins`)."""
    heads = (model.num_key_value_heads, model.head_dim)
    backend = plugins.attention_backend if plugins is not None else None
    backend = backend or get_backend(cfg.attention_backend, device)
    bs = cfg.block_size
    if cfg.kv_layout == "contiguous":
        num_slots = num_blocks * bs  # the same memory, as reservations
        if num_slots < max_model_len and cfg.contiguous_reserve == "max":
            raise ValueError(
                f"a contiguous cache of {num_slots} slots cannot hold one sequence of "
                f"max_model_len={max_model_len}: give more num_kvcache_blocks"
            )
        cache = PagedKVCache(model.num_hidden_layers, num_slots, 1, *heads, dtype=dtype, device=device)
        contiguous = ContiguousKVManager(num_slots, bs, max_model_len, cfg.contiguous_reserve)
        return KVLayout(contiguous, cache, PagedAttention(cache.k, cache.v, backend))
    cache = PagedKVCache(model.num_hidden_layers, num_blocks, bs, *heads, dtype=dtype, device=device)
    num_host_blocks, host = 0, None
    if cfg.preemption_mode == "swap":
        per_block = block_nbytes(model, bs, dtype)
        num_host_blocks = num_blocks if cfg.swap_space is None else cfg.swap_space // per_block
        if num_host_blocks < 1:
            raise ValueError(f"swap_space={cfg.swap_space} bytes holds no block of {per_block} bytes: give more")
        pin = device.type == "cuda"
        host = PagedKVCache(model.num_hidden_layers, num_host_blocks, bs, *heads, dtype=dtype, pin_memory=pin)
    p = plugins or EnginePlugins()
    manager = PagedKVManager(
        num_blocks, bs, cfg.enable_prefix_caching, num_host_blocks, block_pool=p.block_pool,
        append_tokens=p.append_tokens, block_hashes=p.block_hashes, prefix_lookup=p.prefix_lookup,
        copy_on_write=p.copy_on_write, fork=p.fork,
    )  # fmt: skip
    return KVLayout(manager, cache, PagedAttention(cache.k, cache.v, backend), host)
