"""The paged pool's memory: K and V tensors of every layer, one row of blocks per layer.

``k, v: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]``. Which block belongs to
which sequence lives elsewhere (the block pool and block tables); this module only holds the
tensors, and copies blocks by ``(src, dst)`` pairs: within the pool for copy-on-write, to and
from a host pool for swapping. Where a token goes inside them is stage 3's
slot mapping (:mod:`minipaged.kv.slot_mapping`).
"""

from __future__ import annotations

import torch


class PagedKVCache:
    """The physical pool: K and V of every layer, ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``
    (``k[layer]`` is that layer's ``[num_blocks, block_size, num_kv_heads, head_dim]`` cache).

    Which block belongs to which sequence lives elsewhere (the allocator and block tables);
    this class only holds memory.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        pin_memory: bool = False,
    ) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # pin_memory: a host pool that a GPU copies to and from without staging (swap space).
        self.k = torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
        self.v = torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_blocks(self, pairs: list[tuple[int, int]], into: PagedKVCache | None = None) -> None:
        """For each ``(src, dst)``: block ``src`` of this cache -> block ``dst`` of ``into`` (default
        this one), in every layer. One gather and one scatter per tensor, whatever the count:
        copy-on-write copies within the pool, and swapping moves blocks between device and host.
        """
        dst_cache = self if into is None else into
        src = torch.tensor([a for a, _ in pairs], dtype=torch.long, device=self.k.device)
        dst = torch.tensor([b for _, b in pairs], dtype=torch.long, device=dst_cache.k.device)
        for a, b in ((self.k, dst_cache.k), (self.v, dst_cache.v)):
            b.index_copy_(1, dst, a.index_select(1, src).to(b.device, non_blocking=True))
