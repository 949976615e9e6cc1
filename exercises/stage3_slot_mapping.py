"""Stage 3 exercises (notebook 03_slot_mapping). Check: ``python -m exercises stage3``.

Try them without looking at ``minipaged/kv/slot_mapping.py``. Replace each
``raise NotImplementedError`` with your code; keep the names and signatures.

The one formula: ``slot = block_table[pos // block_size] * block_size + pos % block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD_SLOT = -1  # a slot_mapping entry that writes nothing


def decode_slot_mapping(
    block_tables: Sequence[Sequence[int]] | torch.Tensor,
    context_lens: Sequence[int] | torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """The ``slot_mapping`` of a decode batch: ``int64 [num_seqs]``.

    Sequence ``i`` brings one new token, at position ``context_lens[i] - 1`` (``context_lens``
    counts the new token); its block table already has room for it. Entry ``i`` is that token's slot.

    block_tables: one list of block ids per sequence, or an int32 tensor ``[num_seqs, max_blocks]``
    padded on the right (as ``padded_block_tables`` builds it; the padding is never read);
    context_lens: a list of ints or an int tensor ``[num_seqs]``.

    Example, block size 16: the running example's decode step, tables ``[[7, 3], [7, 9]]``,
    context_lens ``[25, 27]`` -> positions 24 and 26 -> ``tensor([56, 154])``.

    Hint: ``.tolist()`` turns a tensor into lists; build a Python list, then ``torch.tensor(..., dtype=torch.int64)``.
    """
    raise NotImplementedError


def prefill_slot_mapping(
    block_tables: Sequence[Sequence[int]] | torch.Tensor,
    prompt_lens: Sequence[int],
    block_size: int,
    pad_to: int,
) -> torch.Tensor:
    """The ``slot_mapping`` of a prefill batch, padded: ``int64 [pad_to]``.

    Sequence ``i`` writes its whole prompt, positions ``0 .. prompt_lens[i] - 1``. The slots of
    all prompts are packed in order (sequence 0's first), then ``PAD_SLOT`` (-1) up to ``pad_to``
    entries (padding tokens, which ``store_kvcache`` skips). ``pad_to < sum(prompt_lens)``
    raises ``ValueError``.

    Example, block size 4: tables ``[[2], [0, 5]]``, prompt_lens ``[3, 6]``, pad_to 10 ->
    ``tensor([8, 9, 10, 0, 1, 2, 3, 20, 21, -1])``.
    """
    raise NotImplementedError


def gather_sequence_kv(
    cache: torch.Tensor, block_table: Sequence[int] | torch.Tensor, context_len: int
) -> torch.Tensor:
    """One sequence's first ``context_len`` rows of a paged cache, in logical order (what ``gather_kv`` does).

    cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``; block_table: its block ids (a list
    or a 1-D int tensor, at least ``ceil(context_len / block_size)`` long). Returns
    ``[context_len, num_kv_heads, head_dim]``.

    Use only the slot formula and **one** index operation: compute every position's slot, view the
    cache as ``[num_slots, num_kv_heads, head_dim]`` (``cache.reshape(-1, *cache.shape[2:])``) and
    index it with the slots.
    """
    raise NotImplementedError
