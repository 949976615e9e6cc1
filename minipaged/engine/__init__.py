"""Stage 5: the engine. One noun per file; one step is three calls:
``batch = scheduler.schedule()``, ``sampled = runner.run(batch)``,
``scheduler.postprocess(batch, sampled)``.

- :mod:`.llm` (the facade: requests in, outputs out, the step and its rollback);
- :mod:`.scheduler` (the queues, each step's work, and the bookkeeping after it) and
  :mod:`.batch` (what a step decides, what the runner returns);
- :mod:`.kv_layout` (the one place the cache layout is chosen), :mod:`.kv_manager` (paged
  blocks: allocation, prefix hits, copy-on-write, swapping), :mod:`.contiguous_manager`
  (stage 0's reservations, Orca's three policies);
- :mod:`.model_runner` (block moves, packing, attention metadata, the forward, one batched
  draw of the step's tokens; a beam's top tokens);
- :mod:`.request_group` (a request's sequences, the scheduler's unit, and the stop rules),
  :mod:`.step_transaction` (what a step changed, until it commits or rolls back),
  :mod:`.sequence` (a sequence's tokens), :mod:`.sampling_params`, :mod:`.beam_search`,
  :mod:`.inputs` (prompts checked), :mod:`.outputs` (what is handed back), :mod:`.config`,
  :mod:`.plugins` (the learner's seams).
"""
