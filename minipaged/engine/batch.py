"""The records' former names, kept for code written against them: a step's
:class:`~minipaged.engine.scheduler_output.SchedulerOutput` was ``ScheduledBatch``, and its
:class:`~minipaged.engine.runner_output.ModelRunnerOutput` was ``SamplerOutput``."""

from __future__ import annotations

from minipaged.engine.runner_output import ModelRunnerOutput
from minipaged.engine.scheduler_output import SchedulerOutput

ScheduledBatch = SchedulerOutput
SamplerOutput = ModelRunnerOutput

__all__ = ["SamplerOutput", "ScheduledBatch"]
