"""Stage 2 exercises (notebook 02_block_table). Check: ``python -m exercises stage2``.

Replace each ``raise NotImplementedError`` with your code. Keep the names and signatures: the
tests import them from this file.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def physical(block_ids: Sequence[int], block_size: int, pos: int) -> tuple[int, int]:
    """``(physical block id, offset in that block)`` of token position ``pos``.

    block_ids: a sequence's block table (physical block ids in logical order). Raise
    ``IndexError`` when ``pos`` lies past the last block (``pos >= len(block_ids) * block_size``).

    Example, block size 16, table ``[7, 3]``: position 0 -> ``(7, 0)``, 15 -> ``(7, 15)``,
    16 -> ``(3, 0)``, 23 -> ``(3, 7)``, 32 -> ``IndexError``.

    Then compare with ``BlockTable.physical`` (``minipaged/kv/block_table.py``): where does it
    stop, and why?
    """
    raise NotImplementedError


def gather(cache: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Your own ``gather_kv``: one sequence's first ``num_tokens`` rows of a paged cache, in logical order.

    cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``; block_ids: the sequence's block
    table (a list of ints or a 1-D int tensor, at least ``ceil(num_tokens / block_size)`` long).
    Returns a new tensor ``[num_tokens, num_kv_heads, head_dim]`` of the cache's dtype (``num_tokens``
    may be 0).

    Write it with a Python loop over positions and :func:`physical` (or the same arithmetic), no
    fancy indexing: ``out[pos] = cache[block, offset]``. It must equal
    ``minipaged.attention.reference.gather_kv`` exactly, for any block size.

    Hint: ``torch.empty((num_tokens, *cache.shape[2:]), dtype=cache.dtype)``; ``int(t)`` turns a
    0-d tensor into an int.
    """
    raise NotImplementedError
