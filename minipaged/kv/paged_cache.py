"""The paged pool's memory: K and V tensors of every layer, one row of blocks per layer.

``k, v: [num_layers, num_blocks, block_size, num_kv_heads, head_dim]``. Which block belongs to
which sequence lives elsewhere (the block pool and block tables); this module only holds the
tensors, and copies one block for copy-on-write. Where a token goes inside them is stage 3's
slot mapping (:mod:`minipaged.kv.slot_mapping`).
"""

from __future__ import annotations

import torch


class PagedKVCache:
    """The physical pool: K and V tensors of every layer, ``[num_blocks, block_size, num_kv_heads, head_dim]``.

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
    ) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one physical block's K/V in every layer (copy-on-write)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
