"""Attention over a KV cache.

- :mod:`.reference`: the per-sequence oracle every other path is tested against;
- :mod:`.batched`: the same operations for a whole batch in a few tensor ops (CPU default);
- :mod:`.native_decode`: decode attention reading the blocks in place, a C kernel the batched
  path calls where a compiler builds it;
- :mod:`.metadata`: what one step tells every layer (slot mapping, block tables, lengths);
- :mod:`.backends`: choosing among reference, batched torch and Triton;
- :mod:`.cache_attention`: the objects the decoder calls, ``attn.attend(layer, q, k, v)``.
"""
