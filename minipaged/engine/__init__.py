"""Stage 5: the engine — sequence, scheduler, block manager, model runner, LLM."""
