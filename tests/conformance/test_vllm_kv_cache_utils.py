"""Conformance with vLLM V1's tests/v1/core/test_kv_cache_utils.py: blocks, the free queue, block
hashes and the size check of the KV pool, against minipaged's public classes.

Each test names the vLLM test it follows; the facts carry over, the code is minipaged's. Where
minipaged differs on purpose, the test asserts minipaged's rule and says why:

- no null block: block 0 is an ordinary block (docs/vllm_v1.md, "Padding block");
- ``FreeBlockQueue`` has ``popleft``, ``append`` and ``remove`` only: vLLM's ``popleft_n`` and
  ``append_n`` are translated to ``BlockPool.allocate(n)`` and repeated appends, and there is no
  ``prepend_n`` (a freed block always goes to the back, see test_vllm_prefix_caching.py);
- popping an empty queue raises ``IndexError``, vLLM raises ``ValueError``;
- a block hash is a 64-bit blake2b of (parent hash, token ids, ``extra_key``) with parent 0 for
  a first block, the same in every process; there is no ``NONE_HASH`` seed and no choice of hash
  function, and ``extra_key`` is mixed into every block (vLLM mixes a cache salt into the first
  block only and a multimodal key into the blocks an item overlaps);
- ``num_kvcache_blocks`` is not checked against ``max_model_len`` at start-up: each request is
  checked instead (vLLM refuses to start).

Left out (no such thing in minipaged): multimodal / prompt-embeds extra keys and their per-item
offsets, LoRA requests (only an opaque ``extra_key``), ``__slots__`` on blocks, NONE_HASH seeding
from PYTHONHASHSEED and the xxhash choice, KV cache groups, specs, tensors and layouts
(``get_kv_cache_configs``, hybrid / sliding-window / Mamba / MLA / HiSparse / DCP), KV transfer
groups, and the windowed ``CachingMetrics`` (minipaged's ``kv_stats`` counters are cumulative).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conformance_kit import engine, greedy, make_llm

import minipaged
from minipaged.kv.block_pool import BlockPool, FreeBlockQueue
from minipaged.kv.kv_cache_block import KVCacheBlock
from minipaged.kv.prefix_cache import ROOT_HASH, chain_hashes, hash_block

# ---- KVCacheBlock and FreeBlockQueue ---------------------------------------------------------


def test_block_starts_free_and_unhashed():
    """test_kv_cache_utils.py::test_kv_cache_block: a new block has no users and no hash; its
    count and hash are plain fields (vLLM's set_block_hash / reset_hash are assignments here)."""
    block = KVCacheBlock(block_id=0)
    assert (block.block_id, block.ref_cnt, block.block_hash) == (0, 0, None)
    block.ref_cnt += 1
    assert block.ref_cnt == 1
    block.ref_cnt -= 1
    assert block.ref_cnt == 0
    block.block_hash = hash_block(ROOT_HASH, [1, 2, 3])
    assert block.block_hash == hash_block(ROOT_HASH, (1, 2, 3))
    block.block_hash = None
    assert block.block_hash is None
    # Through the pool: allocation gives one reference, freeing takes it back.
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    assert b.ref_cnt == 1 and b.block_hash is None
    pool.free([b])
    assert b.ref_cnt == 0


def test_queue_of_one_block_links_both_sentinels_to_it():
    """test_kv_cache_utils.py::test_free_kv_cache_block_queue_initialization."""
    block = KVCacheBlock(block_id=0)
    queue = FreeBlockQueue([block])
    assert len(queue) == 1
    assert queue.head.next_free_block is block and queue.tail.prev_free_block is block


def test_queue_popleft_remove_append_and_empty_pop():
    """test_kv_cache_utils.py::test_free_kv_cache_block_queue_operations. Differs: an empty queue
    raises IndexError (vLLM: ValueError "No free blocks available")."""
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert len(queue) == 5
    assert queue.head.next_free_block is blocks[0] and queue.tail.prev_free_block is blocks[4]

    assert queue.popleft() is blocks[0]
    assert len(queue) == 4
    assert queue.head.next_free_block is blocks[1] and queue.tail.prev_free_block is blocks[4]

    queue.remove(blocks[2])  # from the middle
    assert len(queue) == 3
    assert blocks[1].next_free_block is blocks[3] and blocks[3].prev_free_block is blocks[1]

    queue.append(blocks[2])
    assert len(queue) == 4
    assert queue.tail.prev_free_block is blocks[2]
    assert blocks[2].prev_free_block is blocks[4] and blocks[2].next_free_block is queue.tail

    for _ in range(4):
        queue.popleft()
    assert len(queue) == 0
    assert queue.head.next_free_block is queue.tail and queue.tail.prev_free_block is queue.head
    with pytest.raises(IndexError, match="empty"):
        queue.popleft()


def test_appends_link_blocks_in_order():
    """test_kv_cache_utils.py::test_free_kv_cache_block_queue_append_n, with one append per block
    (minipaged has no append_n). Its corrupted-sentinel case is left out: nothing public corrupts
    the links."""
    queue = FreeBlockQueue([])
    blocks = [KVCacheBlock(block_id=i) for i in range(6)]
    assert len(queue) == 0 and queue.head.next_free_block is queue.tail

    def chain() -> list[KVCacheBlock]:
        """The queue walked forwards and checked backwards."""
        forward, node = [], queue.head.next_free_block
        while node is not queue.tail:
            assert node is not None and node.next_free_block is not None
            assert node.next_free_block.prev_free_block is node
            forward.append(node)
            node = node.next_free_block
        assert queue.head.next_free_block.prev_free_block is queue.head
        return forward

    for group, expected in (([0], [0]), ([4, 5], [0, 4, 5]), ([1, 2, 3], [0, 4, 5, 1, 2, 3])):
        for i in group:
            queue.append(blocks[i])
        assert [b.block_id for b in chain()] == expected and len(queue) == len(expected)


def test_allocate_n_pops_the_front_and_unlinks():
    """test_kv_cache_utils.py::test_free_kv_cache_block_queue_popleft_n, through
    BlockPool.allocate(n) (the pool's popleft_n). The queue is put in vLLM's order 1, 3, 5, 4, 0, 2
    by freeing: a list is appended in reverse, its tail first."""
    pool = BlockPool(6)
    blocks = pool.allocate(6)
    pool.free([blocks[i] for i in (2, 0, 4, 5, 3, 1)])
    assert [b.block_id for b in pool.free_queue] == [1, 3, 5, 4, 0, 2]

    assert pool.allocate(0) == [] and pool.num_free_blocks == 6
    for n, expected in ((1, [1]), (2, [3, 5]), (3, [4, 0, 2])):
        got = pool.allocate(n)
        assert [b.block_id for b in got] == expected
        assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
    assert pool.num_free_blocks == 0
    assert pool.free_queue.head.next_free_block is pool.free_queue.tail


def test_iterating_the_queue_lists_free_blocks_in_order():
    """test_kv_cache_utils.py::test_free_kv_cache_block_queue_get_all_free_blocks (iteration is
    minipaged's get_all_free_blocks)."""
    blocks = [KVCacheBlock(block_id=i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert list(queue) == blocks
    queue.popleft()
    assert list(queue) == blocks[1:]
    queue.remove(blocks[2])
    assert list(queue) == blocks[1:2] + blocks[3:]
    queue.append(blocks[2])
    assert list(queue) == blocks[1:2] + blocks[3:] + [blocks[2]]


# ---- block hashes ----------------------------------------------------------------------------


def test_block_hash_covers_parent_tokens_and_extra_key():
    """test_kv_cache_utils.py::test_hash_block_tokens: the hash is a function of (parent hash,
    token ids, extra keys). Differs: a 64-bit int, not a sha256 digest of the tuple."""
    parent, tokens, extra = hash_block(ROOT_HASH, [7, 7, 7]), (1, 2, 3), ("key1", "key2")
    h = hash_block(parent, tokens, extra)
    assert h == hash_block(parent, list(tokens), ("key1", "key2"))  # a tuple or a list of ids
    assert isinstance(h, int) and 0 <= h < 2**64
    assert len({h, hash_block(parent + 1, tokens, extra), hash_block(parent, (1, 2, 4), extra),
                hash_block(parent, tokens, ("key1",)), hash_block(parent, tokens)}) == 5  # fmt: skip


def test_request_hashes_chain_full_blocks_only():
    """test_kv_cache_utils.py::test_request_block_hasher and ::test_hash_request_tokens_no_mm_inputs:
    block i's hash takes block i-1's as parent (the first takes the root, minipaged's 0 for vLLM's
    NONE_HASH); a partial block has none, and known hashes are extended, not recomputed."""
    h = chain_hashes(list(range(6)), 3)
    assert h == [hash_block(ROOT_HASH, (0, 1, 2)), hash_block(hash_block(ROOT_HASH, (0, 1, 2)), (3, 4, 5))]
    assert chain_hashes(list(range(8)), 3) == h  # tokens 6 and 7 fill no block
    assert chain_hashes(list(range(9)), 3, known=h)[:2] == h
    assert len(chain_hashes(list(range(9)), 3, known=h)) == 3


def test_different_extra_keys_give_different_hashes():
    """test_kv_cache_utils.py::test_hash_tokens_different_mm_input: two requests with the same
    tokens and different extra keys (vLLM: image hashes) share no block hash."""
    a = chain_hashes(list(range(6)), 3, extra_key=("hash1", "hash2"))
    b = chain_hashes(list(range(6)), 3, extra_key=("hash3", "hash2"))
    assert a[0] != b[0] and a[1] != b[1]


def test_no_extra_key_is_the_plain_hash_and_a_named_key_changes_it():
    """test_kv_cache_utils.py::test_generate_block_hash_extra_keys_lora and
    ::test_generate_block_hash_extra_keys_no_mm_inputs: no adapter, no extra key; an adapter's
    name is part of the hash."""
    tokens = [0, 1, 2]
    assert hash_block(ROOT_HASH, tokens, None) == hash_block(ROOT_HASH, tokens)
    assert hash_block(ROOT_HASH, tokens, "test_lora_adapter") != hash_block(ROOT_HASH, tokens)


def test_extra_key_is_mixed_into_every_block():
    """test_kv_cache_utils.py::test_generate_block_hash_extra_keys_cache_salt. Differs on purpose:
    vLLM adds a cache salt to the first block's extra keys only (the chain carries it on);
    minipaged's chain_hashes mixes ``extra_key`` into every block. Either way no hash of a salted
    request equals an unsalted one."""
    tokens = list(range(6))
    salted = chain_hashes(tokens, 3, extra_key="salt")
    first = hash_block(ROOT_HASH, tokens[:3], "salt")
    assert salted == [first, hash_block(first, tokens[3:], "salt")]
    assert salted[1] != hash_block(first, tokens[3:])
    assert not set(salted) & set(chain_hashes(tokens, 3))


def test_hashes_are_the_same_in_another_process():
    """test_kv_cache_utils.py::test_none_hash: without a configured seed, independent processes
    compute identical block hashes (vLLM: a fixed default seed for sha256). minipaged has no seed
    at all; a child process with another PYTHONHASHSEED gets the same values. (The child imports
    the hashing module without the package's __init__, which would import torch.)"""
    code = (
        "import sys, types; pkg = types.ModuleType('minipaged'); pkg.__path__ = [sys.argv[1]]; "
        "sys.modules['minipaged'] = pkg; from minipaged.kv.prefix_cache import chain_hashes; "
        "print(chain_hashes(list(range(8)), 4, extra_key='s'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    package_dir = str(Path(minipaged.__file__).parent)
    child = subprocess.run(
        [sys.executable, "-c", code, package_dir], capture_output=True, text=True, check=True, env=env
    )
    assert child.stdout.strip() == str(chain_hashes(list(range(8)), 4, extra_key="s"))


# ---- the pool's size against max_model_len ---------------------------------------------------

# The embedded model (minipaged/tiny/assets/tiny-copy/config.json): 2 layers x 2 KV heads x
# head_dim 32 x 4 bytes (float32) x (K, V) = 1024 bytes per token, 16384 per block of 16.
BLOCK_BYTES = 2 * 2 * 32 * 4 * 2 * 16


def test_budget_must_hold_one_sequence_of_max_model_len():
    """test_kv_cache_utils.py::test_check_enough_kv_cache_memory: a memory budget too small for one
    max_model_len sequence is refused at start-up, saying how much is needed; exactly enough is
    accepted."""
    need = 256 // 16 * BLOCK_BYTES
    llm = make_llm(max_model_len=256, kv_cache_memory=need, max_num_seqs=1)
    assert llm.num_blocks == 16
    with pytest.raises(ValueError, match=f"raise kv_cache_memory to at least {need} bytes"):
        make_llm(max_model_len=256, kv_cache_memory=need - 1)


def test_fixed_pool_size_is_checked_per_request():
    """test_kv_cache_utils.py::test_check_enough_kv_cache_memory_respects_num_gpu_blocks_override
    and test_prefix_caching.py::test_can_fit_full_sequence_full_attention_still_gates_oversized.
    Differs on purpose: vLLM refuses to start when the overridden block count cannot hold one
    max_model_len sequence; minipaged builds the pool (teaching pools are tiny) and refuses, before
    queuing anything, each request whose stored tokens could never fit (the last sampled token is
    never stored)."""
    llm = engine(3, max_model_len=512)  # 48 slots
    with pytest.raises(ValueError, match="needs 4 blocks of 16 tokens but the whole pool has 3"):
        llm.add_request([5] * 48, greedy(2))
    assert not llm.has_unfinished_requests()
    with pytest.raises(ValueError, match="needs 16 blocks"):
        llm.add_request(list(range(16 * 16)), greedy(1))  # vLLM's oversized 16-block prompt
    out = llm.generate([[5] * 48], greedy(1), use_tqdm=False)[0]  # 48 stored tokens: exactly 3 blocks
    assert len(out.outputs[0].token_ids) == 1
