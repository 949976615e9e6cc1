"""KV memory, one module per stage: contiguous (0), allocator (1), block_table (2),
slot_mapping (3), prefix_cache (6)."""
