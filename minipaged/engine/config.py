"""The engine's settings, checked before anything is built, and the size of the KV pool.

Without ``num_kvcache_blocks`` the pool is sized from a memory budget, as vLLM sizes it from
``gpu_memory_utilization``: ``kv_cache_memory`` bytes (default: 1 GiB on a CPU, half the free
GPU memory on CUDA), but never more blocks than ``max_num_seqs`` sequences of
``max_model_len`` tokens could fill at once. One block costs ``2 (K and V) x num_layers x
block_size x num_kv_heads x head_dim x bytes per element``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from minipaged.attention.backends import BACKENDS
from minipaged.model.config import ModelConfig
from minipaged.utils import cdiv

CPU_KV_CACHE_MEMORY = 1 << 30
KV_LAYOUTS = ("paged", "contiguous")
PREEMPTION_MODES = ("recompute", "swap")
RESERVE_POLICIES = ("max", "pow2", "oracle")  # Orca's three, for the contiguous layout


def _positive_int(name: str, value: object, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    num_kvcache_blocks: int | None = None
    kv_cache_memory: int | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = False
    attention_backend: str = "auto"
    kv_layout: str = "paged"
    preemption_mode: str = "recompute"
    swap_space: int | None = None  # bytes of host memory for swapped blocks (default: as many blocks as the pool)
    contiguous_reserve: str = "max"

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            _positive_int(name, getattr(self, name))
        for name in ("num_kvcache_blocks", "kv_cache_memory", "max_model_len", "swap_space"):
            _positive_int(name, getattr(self, name), allow_none=True)
        for name, allowed in (
            ("kv_layout", KV_LAYOUTS),
            ("preemption_mode", PREEMPTION_MODES),
            ("contiguous_reserve", RESERVE_POLICIES),
            ("attention_backend", BACKENDS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        for conflict, why in self._conflicts():
            if conflict:
                raise ValueError(why)

    def _conflicts(self) -> list[tuple[bool, str]]:
        """Settings that are each fine but cannot go together, and why."""
        contiguous = self.kv_layout == "contiguous"
        return [
            (contiguous and self.enable_prefix_caching,
             "prefix caching needs kv_layout='paged' (a contiguous cache cannot share blocks)"),
            (contiguous and self.preemption_mode == "swap",
             "swapping needs kv_layout='paged' (a contiguous reservation is never preempted)"),
            (self.swap_space is not None and self.preemption_mode != "swap",
             "swap_space is used only with preemption_mode='swap'"),
            (not contiguous and self.contiguous_reserve != "max",
             "contiguous_reserve chooses Orca's reservation for kv_layout='contiguous' only"),
            (self.num_kvcache_blocks is not None and self.kv_cache_memory is not None,
             "give num_kvcache_blocks or kv_cache_memory, not both"),
        ]  # fmt: skip

    def model_len(self, model: ModelConfig) -> int:
        """``max_model_len``, defaulting to (and never above) the model's ``max_position_embeddings``."""
        if self.max_model_len is None:
            return model.max_position_embeddings
        if self.max_model_len > model.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{model.max_position_embeddings}: positions beyond it were never trained"
            )
        return self.max_model_len

    def num_blocks(self, model: ModelConfig, dtype: torch.dtype, device: torch.device) -> tuple[int, str]:
        """The pool's size in blocks, and a line saying how it was chosen."""
        if self.num_kvcache_blocks is not None:
            return self.num_kvcache_blocks, f"{self.num_kvcache_blocks} blocks (num_kvcache_blocks)"
        max_len = self.model_len(model)
        block_bytes = block_nbytes(model, self.block_size, dtype)
        budget = self.kv_cache_memory or default_kv_cache_memory(device)
        fit = budget // block_bytes
        per_seq = cdiv(max_len, self.block_size)
        if fit < per_seq:
            raise ValueError(
                f"a KV budget of {budget / 2**20:.1f} MiB holds {fit} blocks of {self.block_size} tokens, but one "
                f"sequence of max_model_len={max_len} needs {per_seq}: raise kv_cache_memory to at least "
                f"{per_seq * block_bytes} bytes or lower max_model_len"
            )
        num = min(fit, self.max_num_seqs * per_seq)
        why = "max_num_seqs x max_model_len" if num < fit else f"the {budget / 2**20:.1f} MiB budget"
        return num, f"{num} blocks x {self.block_size} tokens = {num * block_bytes / 2**20:.1f} MiB (limited by {why})"


def block_nbytes(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block of K and V across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * model.num_hidden_layers * block_size * model.num_key_value_heads * model.head_dim * elem


def default_kv_cache_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return CPU_KV_CACHE_MEMORY
