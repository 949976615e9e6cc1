"""my_engine: your own paged-attention engine, one module per notebook.

Each module holds stubs: replace every ``raise NotImplementedError(...)`` with your code. A piece
is marked **core** (the stage's idea: write it to go on) or **stretch** (further, for when the core
passes). The names are vLLM's, so what you write reads like the real engine.

| stage | module | core | stretch |
|---|---|---|---|
| 0 | ``stage0_contiguous.py`` | bytes of K/V per token; a contiguous cache, first fit | waste |
| 1 | ``stage1_block_pool.py`` | ``BlockPool``: free queue, ``ref_cnt``, allocate, free, share | ``touch`` |
| 2 | ``stage2_block_table.py`` | ``BlockTable``: ``append_tokens``, ``physical`` | ``free`` |
| 3 | ``stage3_attention.py`` | ``slot_mapping``, ``store_kv``, paged decode attention in torch | prefill |
| 4 | ``stage4_kernels.py`` | ``store_kv_kernel`` in Triton (the Triton track) | ``paged_decode_kernel`` |
| 5 | ``stage5_scheduler.py`` | ``KVCacheManager``; ``Scheduler``: admission, batching, preemption | chunked prefill |
| 6 | ``stage6_prefix_cache.py`` | ``block_hashes``; ``PrefixCache``: full blocks, hits | LRU eviction, forks, CoW |

Check a stage: the last cell of its notebook, or, from the folder above this one,
``python -m exercises my_engine 3`` (``python -m exercises`` reports every stage). A check
compares your code with the package's on cases it builds; a failure says which case, what was
expected, what came back and, when the answer matches a typical mistake, which one.

Each module stands alone (a pool or a table is passed in where one is needed), so a stage can be
checked while an earlier one is unfinished.
"""
