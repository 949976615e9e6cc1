"""The third of a step's records: what a step did, handed back by :meth:`LLM.engine_step
<minipaged.engine.llm.LLM.engine_step>` and to every observer that subscribed
(:meth:`LLM.subscribe <minipaged.engine.llm.LLM.subscribe>`).

One step, one way (vLLM V1's ``EngineCore.step``)::

    SchedulerOutput = scheduler.schedule()                  # who runs, how many tokens, where
    ModelRunnerOutput = runner.execute_model(sched_out)     # sampled tokens, logprobs
    scheduler.commit(...); scheduler.update_from_output(...)  # decisions applied
    -> StepOutput(sched_out, runner_out, decisions, outputs, figures)

Observers (the drawings, the server's projector, the step timer, the paper's recorders) read
this record and the public figures (``kv_stats()``, ``pool_summary()``): none of them steps the
engine on its own behalf, patches it, or reads the scheduler's queues. The pool as the step left
it rides in the record itself (``pool``) when a caller or an observer asks for it: it copies
every block's ``ref_cnt``, so a step that nobody draws does not pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.engine.decisions import Decision
from minipaged.engine.outputs import RequestOutput
from minipaged.engine.pool_summary import PoolSummary
from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.scheduler_output import SchedulerOutput


@dataclass
class StepOutput:
    """Step number ``step`` (counting this one) ran ``scheduler_output`` and the runner returned
    ``runner_output``; ``decisions``: what each request group decided, as applied.

    ``request_ids``: the requests that got a token (beam searches included); ``outputs``: the
    :class:`RequestOutput` of those that stream (what :meth:`LLM.step` returns; empty when not
    asked for); ``finished``: the requests this step completed. ``num_running`` /
    ``num_waiting`` / ``num_swapped``: sequences in each queue after the step, and
    ``num_running_requests`` the requests running. ``kv_stats_at_peak``: ``kv_stats()`` once the
    step's K/V were written and before anything was freed (the memory a step holds at its
    fullest; filled while an observer is subscribed). ``seconds``: ``schedule``, ``execute``
    (the runner's ``prepare``, ``forward``, ``attention`` inside it, ``sample``), ``update``, ``total``.
    ``pool``: :meth:`LLM.pool_summary <minipaged.engine.llm.LLM.pool_summary>` once the step is
    over (filled when ``engine_step(pool=True)`` or an observer subscribed with ``pool=True``).
    """

    step: int
    scheduler_output: SchedulerOutput
    runner_output: ModelRunnerOutput
    decisions: list[Decision] = field(default_factory=list)
    request_ids: list[int] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    num_running_requests: int = 0
    kv_stats_at_peak: dict | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    pool: PoolSummary | None = None

    @property
    def num_sampled(self) -> int:
        """Tokens sampled this step (one per sampling row; a beam's row counts once)."""
        return len(self.scheduler_output.samples)
