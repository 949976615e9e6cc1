"""Stage 2: block tables map a sequence's logical blocks to physical blocks of the pool."""

from __future__ import annotations

import random

import pytest
import torch

from minipaged.attention.reference import gather_kv
from minipaged.kv.block_pool import BlockPool, NoFreeBlocksError
from minipaged.kv.block_table import BlockTable, padded_block_tables
from minipaged.kv.contiguous import ContiguousKVCache


def test_grows_exactly_at_block_boundaries():
    pool, table = BlockPool(10), BlockTable(block_size=4)
    assert table.append_tokens(1, pool) == [0]  # the first token needs a block
    assert table.append_tokens(3, pool) == []  # tokens 1-3 fill block 0
    assert table.append_tokens(1, pool) == [1]  # token 4 starts block 1
    assert table.append_tokens(0, pool) == []
    assert table.append_tokens(8, pool) == [2, 3]  # tokens 5-12: block 1 fills, blocks 2 and 3 open
    assert (table.block_ids, table.num_tokens, pool.num_used_blocks) == ([0, 1, 2, 3], 13, 4)
    assert repr(table) == "BlockTable([0, 1, 2, 3], tokens=13)"
    with pytest.raises(ValueError, match="cannot append -1 tokens"):
        table.append_tokens(-1, pool)


def test_block_and_slot_counts():
    table = BlockTable(block_size=16)
    assert [table.num_blocks_needed(n) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]
    assert [table.slots_needed(n) for n in (0, 1, 16, 17)] == [0, 16, 16, 32]
    table = BlockTable.from_blocks([7, 3], num_tokens=24, block_size=16)
    assert [table.new_blocks_needed(n) for n in (0, 8, 9, 41)] == [0, 0, 1, 3]


def test_append_is_all_or_nothing():
    pool, table = BlockPool(3), BlockTable(block_size=4)
    table.append_tokens(6, pool)  # blocks 0 and 1, two slots left in block 1
    with pytest.raises(NoFreeBlocksError, match="asked for 2 blocks, only 1 free of 3"):
        table.append_tokens(7, pool)  # tokens 6-12 would need two more blocks
    assert (table.block_ids, table.num_tokens, pool.num_free_blocks) == ([0, 1], 6, 1)
    assert table.append_tokens(6, pool) == [2]  # what fits still goes through
    assert table.num_tokens == 12


def test_seed_example_shared_first_block():
    """Block size 16: A holds 24 tokens in [7, 3], B shares A's first block and continues in 9."""
    pool = BlockPool(10)
    others = [b for b in pool.allocate(10) if b.block_id not in (7, 3, 9)]  # a busy pool...
    for block_id in (7, 3, 9):  # ...where 7, 3 and 9 were freed one by one, so come back in this order
        pool.free([block_id])
    a = BlockTable(16)
    assert a.append_tokens(24, pool) == [7, 3]
    assert repr(a) == "BlockTable([7, 3], tokens=24)"
    assert (a.physical(0), a.physical(15), a.physical(16), a.physical(23)) == ((7, 0), (7, 15), (3, 0), (3, 7))
    assert sum(a.physical(p)[0] == 3 for p in range(a.num_tokens)) == 8  # block 3 holds 8 tokens

    pool.share(7)  # B's first 16 tokens are A's
    b = BlockTable.from_blocks([7, pool.allocate(1)[0].block_id], num_tokens=20, block_size=16)
    assert b.block_ids == [7, 9]
    assert all(b.physical(p) == a.physical(p) for p in range(16))
    assert b.physical(16) == (9, 0)
    assert [pool.blocks[i].ref_cnt for i in (7, 3, 9)] == [2, 1, 1]

    a.free(pool)
    assert (a.block_ids, a.num_tokens) == ([], 0)
    assert [pool.blocks[i].ref_cnt for i in (7, 3, 9)] == [1, 0, 1]  # B still holds block 7
    b.free(pool)
    pool.free(others)
    assert pool.num_free_blocks == 10
    pool.check_invariants()


def test_add_blocks_for_prefix_hits_and_forks():
    pool = BlockPool(6)
    parent = BlockTable(4)
    parent.append_tokens(10, pool)  # blocks 0, 1, 2 (two tokens in block 2)
    hit = BlockTable(4)
    for block_id in parent.block_ids[:2]:  # a prefix-cache hit on the two full blocks
        pool.touch(block_id)
    hit.add_blocks(parent.block_ids[:2], 8)
    assert hit.append_tokens(3, pool) == [3]  # its own tokens continue in a fresh block
    assert (hit.physical(7), hit.physical(8)) == ((1, 3), (3, 0))
    fork = BlockTable(4)
    fork.add_blocks(parent.block_ids, parent.num_tokens)  # a fork may end in a partial block
    assert repr(fork) == "BlockTable([0, 1, 2], tokens=10)"
    fork.block_ids.append(99)
    assert parent.block_ids == [0, 1, 2]  # the fork holds a copy of the list, not the parent's
    with pytest.raises(ValueError, match="cannot add blocks after a partly filled block"):
        parent.add_blocks([4], 4)
    with pytest.raises(ValueError, match="5 tokens need 2 blocks of 4, got 1"):
        BlockTable(4).add_blocks([4], 5)
    assert (parent.block_ids, parent.num_tokens) == ([0, 1, 2], 10)


def test_physical_rejects_positions_outside_the_sequence():
    table = BlockTable.from_blocks([7, 3], num_tokens=24, block_size=16)
    for pos in (24, 32, -1):
        with pytest.raises(IndexError, match=f"position {pos} is outside"):
            table.physical(pos)


def test_from_blocks_needs_exactly_the_right_number_of_blocks():
    with pytest.raises(ValueError, match="24 tokens need 2 blocks of 16, got 3"):
        BlockTable.from_blocks([7, 3, 1], num_tokens=24, block_size=16)
    with pytest.raises(ValueError, match="24 tokens need 2 blocks of 16, got 1"):
        BlockTable.from_blocks([7], num_tokens=24, block_size=16)


def test_gather_through_scattered_blocks_equals_contiguous_buffer():
    block_size, num_blocks, context_len, kv_heads, head_dim = 8, 9, 37, 2, 4
    pool = BlockPool(num_blocks)
    everything = pool.allocate(num_blocks)
    random.Random(0).shuffle(everything)
    for block in everything:  # the free queue now hands blocks out in a random order
        pool.free([block])
    table = BlockTable(block_size)
    table.append_tokens(context_len, pool)
    assert table.block_ids != sorted(table.block_ids)

    contiguous = ContiguousKVCache(1, kv_heads, head_dim, max_seq_len=40, max_seqs=1)
    contiguous.add_sequence("s")
    k_paged = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_paged = torch.zeros_like(k_paged)
    torch.manual_seed(0)
    k, v = torch.randn(context_len, kv_heads, head_dim), torch.randn(context_len, kv_heads, head_dim)
    for pos in range(context_len):  # one token at a time, like decoding
        contiguous.write(0, "s", pos, k[pos : pos + 1], v[pos : pos + 1])
        block_id, offset = table.physical(pos)
        k_paged[block_id, offset], v_paged[block_id, offset] = k[pos], v[pos]

    ids = torch.tensor(table.block_ids, dtype=torch.int32)
    k_contig, v_contig = contiguous.read(0, "s", context_len)
    assert torch.equal(gather_kv(k_paged, ids, context_len), k_contig)
    assert torch.equal(gather_kv(v_paged, ids, context_len), v_contig)
    assert torch.equal(k_contig, k)


def test_padded_block_tables():
    out = padded_block_tables([[7, 3], [9], []])
    assert out.dtype == torch.int32
    assert out.tolist() == [[7, 3], [9, 0], [0, 0]]
    assert padded_block_tables([[1], [2, 5]], pad=-1).tolist() == [[1, -1], [2, 5]]
    assert padded_block_tables([]).shape == (0, 0)
