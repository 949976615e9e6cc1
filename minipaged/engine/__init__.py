"""Stage 5: the engine. One noun per file:

- :mod:`.sequence` (a request's tokens), :mod:`.sampling_params`, :mod:`.inputs` (prompts checked);
- :mod:`.scheduler` (the queues, each step's work, and the bookkeeping after it);
- :mod:`.kv_manager` (blocks: allocation, prefix hits, copy-on-write);
- :mod:`.model_runner` (packing the batch, attention metadata, the forward);
- :mod:`.sampler` (one batched draw); :mod:`.outputs` (what is handed back); :mod:`.config`;
- :mod:`.llm` (the facade).
"""
