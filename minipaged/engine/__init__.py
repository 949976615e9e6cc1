"""Stage 5: the engine. One noun per file; one step hands three plain records one way
(:meth:`LLM.engine_step <minipaged.engine.llm.LLM.engine_step>`, vLLM V1's ``EngineCore.step``)::

    scheduled = scheduler.schedule()                   # SchedulerOutput
    ran = runner.execute_model(scheduled)              # ModelRunnerOutput
    scheduler.commit(scheduled, ran)                   # the step's K/V are written: publish
    decisions = scheduler.update_from_output(scheduled, ran)  # the groups decide, the scheduler applies
    -> StepOutput, handed to every observer that subscribed

- :mod:`.llm` (the facade: requests in, outputs out, the step and its rollback, the observers);
- the records: :mod:`.scheduler_output`, :mod:`.runner_output`, :mod:`.step_output`,
  :mod:`.decisions` (what a request group decides), :mod:`.pool_summary` (the pool, on request);
  :mod:`.batch` keeps their former names;
- :mod:`.scheduler` (the queues, each step's work, and applying the groups' decisions);
- :mod:`.kv_cache_manager` (the one door to KV memory), behind it :mod:`.kv_manager` (paged
  blocks: allocation, prefix hits, copy-on-write, swapping) and :mod:`.contiguous_manager`
  (stage 0's reservations, Orca's three policies); :mod:`.kv_layout` (the one place the layout is
  chosen); :mod:`.prefix_hit`;
- :mod:`.model_runner` (block moves, packing, attention metadata, the forward, one batched
  draw of the step's tokens; a beam's top tokens);
- :mod:`.request_group` (a request's sequences, the scheduler's unit), :mod:`.beam_search`,
  :mod:`.stop_checker` (the stop rules), :mod:`.step_transaction` (what a step changed, until it
  commits or rolls back), :mod:`.sequence` (a sequence's tokens), :mod:`.sampling_params`,
  :mod:`.inputs` (prompts checked) and :mod:`.limits`, :mod:`.outputs` (what is handed back),
  :mod:`.logprobs`, :mod:`.messages`, :mod:`.config`, :mod:`.plugins` (the learner's seams);
- :mod:`.static_generate`, the static-batch runner of stages 0-3 (no scheduler, no requests):
  it uses none of the modules above, and none of them uses it.
"""
