"""KV memory, one module per stage: contiguous (0), block_pool (1), block_table (2),
slot_mapping (3), prefix_cache (6); kv_cache_block is the block they share, cached_blocks the
pool's map of cached blocks (stage 6), paged_cache holds the pool's K/V tensors."""
