"""Stage 1: the block pool, in vLLM v1's vocabulary.

KV memory is cut into ``num_blocks`` fixed-size blocks. A :class:`KVCacheBlock` counts its
users in ``ref_cnt`` (several sequences may share one block). Blocks nobody uses wait in a
:class:`FreeBlockQueue`, a doubly linked list: allocation pops the least recently freed block
from the front, freeing appends at the back, and stage 6 (prefix caching) can pull a cached
block out of the middle in O(1) when a new request hits it.

The pool also owns stage 6's map of cached blocks, as vLLM's ``BlockPool`` owns
``cached_block_hash_to_block`` (:class:`~minipaged.kv.cached_blocks.CachedBlocks`): when
allocation reuses a free block that still holds a cached prefix, the pool evicts it from the
map itself. The prefix cache writes the map and reads it; the pool calls nothing above it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from minipaged.kv.cached_blocks import CachedBlocks
from minipaged.kv.kv_cache_block import KVCacheBlock


class NoFreeBlocksError(RuntimeError):
    """An allocation asked for more blocks than are free (the pool is left unchanged)."""


class BlockPoolError(ValueError):
    """A misuse of the pool: freeing a free block, sharing a free block, a foreign block."""


class FreeBlockQueue:
    """Doubly linked list of free blocks, least recently freed first; every operation is O(1).

    Two sentinel nodes (``head`` and ``tail``) mean no operation special-cases an empty list
    or the ends. The links live in the blocks themselves, so no per-node allocation is needed.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        self.head = KVCacheBlock(block_id=-1)
        self.tail = KVCacheBlock(block_id=-1)
        self.head.next_free_block = self.tail
        self.tail.prev_free_block = self.head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.prev_free_block is not None

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self.head.next_free_block
        while node is not None and node is not self.tail:  # never None: the tail sentinel ends the chain
            yield node
            node = node.next_free_block

    def popleft(self) -> KVCacheBlock:
        """Remove and return the least recently freed block."""
        if self._len == 0:
            raise IndexError("popleft from an empty FreeBlockQueue")
        block = self.head.next_free_block
        assert block is not None  # the head sentinel always links to a block or to the tail
        self.remove(block)
        return block

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the back (it will be reused last)."""
        if block in self:
            raise BlockPoolError(f"block {block.block_id} is already in the free queue")
        last = self.tail.prev_free_block
        assert last is not None  # the tail sentinel always links back to a block or to the head
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.tail
        self.tail.prev_free_block = block
        self._len += 1

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it sits (stage 6 revives cached free blocks this way)."""
        if block not in self:
            raise BlockPoolError(f"block {block.block_id} is not in the free queue")
        prev, next_ = block.prev_free_block, block.next_free_block
        assert prev is not None and next_ is not None  # a queued block sits between two nodes
        prev.next_free_block = next_
        next_.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self._len -= 1


class KVBlockPool(Protocol):
    """What the engine asks of a block pool (:class:`BlockPool` is the package's; the engine takes
    another through ``EnginePlugins.block_pool``, see :mod:`minipaged.engine.plugins`).

    ``blocks[i]`` is block ``i`` (its ``ref_cnt`` and ``block_hash`` are read). ``cached_blocks``
    is the pool's map of cached blocks, which the prefix cache writes: when ``allocate`` hands out
    a free block that still carries a ``block_hash``, the pool evicts it there
    (``cached_blocks.evict(block)``, which clears the hash) before handing it out.
    """

    num_blocks: int
    cached_blocks: CachedBlocks

    @property
    def blocks(self) -> Sequence[KVCacheBlock]: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def allocate(self, n: int) -> list[KVCacheBlock]: ...
    def free(self, blocks: Iterable[KVCacheBlock | int]) -> None: ...
    def share(self, block: KVCacheBlock | int) -> None: ...
    def touch(self, block: KVCacheBlock | int) -> None: ...


def fork_blocks(pool: KVBlockPool, block_ids: list[int]) -> list[int]:
    """Parallel sampling: the block list of a child that shares every block of its parent
    (``ref_cnt + 1`` each, nothing allocated). The engine's ``EnginePlugins.fork``."""
    for block_id in block_ids:
        pool.share(block_id)
    return list(block_ids)


class BlockPool:
    """``num_blocks`` physical blocks, handed out and taken back by reference count.

    ``cached_blocks`` is the stage 6 seam, the map ``block_hash -> block`` that the prefix cache
    (:class:`~minipaged.kv.prefix_cache.PrefixCache`) publishes full blocks into. The pool owns
    eviction: when allocation reuses a free block that still carries a ``block_hash`` (a cached
    prefix nobody uses), it evicts the block from that map before handing it out
    (:meth:`_maybe_evict_cached_block`), so the map never holds a block the pool gave away. This
    stage never sets a hash itself.
    """

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached_blocks = CachedBlocks()  # stage 6: block_hash -> cached block, filled by the prefix cache

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 .. 1.0."""
        return self.num_used_blocks / self.num_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` free blocks (ref_cnt 1 each), all or nothing."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"number of blocks must be a non-negative int, got {n!r}")
        if n > self.num_free_blocks:
            raise NoFreeBlocksError(f"asked for {n} blocks, only {self.num_free_blocks} free of {self.num_blocks}")
        blocks = [self.free_queue.popleft() for _ in range(n)]
        for block in blocks:
            self._maybe_evict_cached_block(block)
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> None:
        """Stage 6: a block handed out for new tokens loses the cached prefix it held, if any
        (vLLM's name): the pool's map forgets it and its hash is cleared."""
        if block.block_hash is not None:
            self.cached_blocks.evict(block)

    def free(self, blocks: Iterable[KVCacheBlock | int]) -> None:
        """Drop one reference to each block (given as blocks or ids); unused ones become free.

        Pass a request's blocks in logical order: they are appended in reverse, so its tail
        blocks (least likely to be shared as a prefix) are reused first. The whole list is
        checked before anything changes.
        """
        resolved = [self._lookup(b) for b in blocks]
        for block_id, times in Counter(b.block_id for b in resolved).items():
            ref_cnt = self.blocks[block_id].ref_cnt
            if ref_cnt == 0:
                raise BlockPoolError(f"block {block_id} is already free")
            if times > ref_cnt:
                raise BlockPoolError(f"block {block_id} freed {times} times but its ref_cnt is {ref_cnt}")
        for block in reversed(resolved):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def share(self, block: KVCacheBlock | int) -> None:
        """One more user of a block already in use (e.g. a forked sequence)."""
        block = self._lookup(block)
        if block.ref_cnt == 0:
            raise BlockPoolError(f"cannot share block {block.block_id}: it is free")
        block.ref_cnt += 1

    def touch(self, block: KVCacheBlock | int) -> None:
        """Stage 6 seam: take one more reference to a prefix-cache hit, reviving it if it was free.

        Unlike :meth:`share`, a free block is fine here: a cached block whose users are all gone
        still waits in the free queue with its content intact, and a hit pulls it out of the middle.
        """
        block = self._lookup(block)
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1

    def _lookup(self, block: KVCacheBlock | int) -> KVCacheBlock:
        block_id = block.block_id if isinstance(block, KVCacheBlock) else block
        if isinstance(block_id, bool) or not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise BlockPoolError(f"unknown block id {block_id!r} (pool has blocks 0..{self.num_blocks - 1})")
        if isinstance(block, KVCacheBlock) and self.blocks[block_id] is not block:
            raise BlockPoolError(f"block {block_id} does not belong to this pool")
        return self.blocks[block_id]

    def check_invariants(self) -> None:
        """Raise AssertionError unless the free queue and the ref counts agree.

        Explicit raises rather than ``assert`` statements, so ``python -O`` still checks.
        """
        seen: set[int] = set()
        for block in self.free_queue:
            # Stopping at the first repeat also ends the walk if the links form a cycle.
            if block.block_id in seen:
                raise AssertionError(f"block {block.block_id} is in the free queue twice")
            if not 0 <= block.block_id < self.num_blocks or self.blocks[block.block_id] is not block:
                raise AssertionError(f"block {block.block_id} in the free queue does not belong to this pool")
            seen.add(block.block_id)
        if len(seen) != self.num_free_blocks:
            raise AssertionError(f"free queue holds {len(seen)} blocks but counts {self.num_free_blocks}")
        for block in self.blocks:
            if block.block_id in seen and block.ref_cnt != 0:
                raise AssertionError(f"block {block.block_id} is in the free queue with ref_cnt {block.ref_cnt}")
            if block.block_id not in seen and block.ref_cnt <= 0:
                raise AssertionError(f"block {block.block_id} is outside the free queue with ref_cnt {block.ref_cnt}")

    def __repr__(self) -> str:
        return f"BlockPool(num_blocks={self.num_blocks}, free={self.num_free_blocks})"
