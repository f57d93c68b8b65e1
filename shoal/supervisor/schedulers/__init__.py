"""Schedulers: how queued requests of one model version become batches for its instances.

:func:`make_scheduler` picks one from the model's configuration: the
:class:`~.sequence.SequenceBatcher` for ``sequence_batching``, the
:class:`~.dynamic.DynamicBatcher` for ``dynamic_batching``, else the
:class:`~.default.DefaultScheduler` (one request per execute). See docs/scheduling.md.
"""

from __future__ import annotations

from shoal.config import ModelConfig
from shoal.supervisor.schedulers._batching import dynamic_settings
from shoal.supervisor.schedulers._controls import SchedulerConfigError
from shoal.supervisor.schedulers._staging import arena_stager
from shoal.supervisor.schedulers.base import (
    BatchSource,
    Clock,
    FreeWork,
    LoopClock,
    Scheduler,
    StageTensor,
)
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.schedulers.dynamic import DynamicBatcher
from shoal.supervisor.schedulers.sequence import SequenceBatcher


def make_scheduler(
    config: ModelConfig,
    instances: int,
    free_work: FreeWork,
    stage_tensor: StageTensor,
    clock: Clock | None = None,
) -> Scheduler:
    """The scheduler ``config`` asks for, for ``instances`` instances.

    ``free_work`` returns a dropped request's input blocks; ``stage_tensor`` copies a tensor the
    scheduler adds (sequence controls, implicit state) into the input arena. Raises
    :class:`SchedulerConfigError` when the configuration cannot be served (the model then fails
    to load with that message).
    """
    if config.sequence_batching is not None:
        return SequenceBatcher(config, instances, free_work, stage_tensor, clock)
    if config.dynamic_batching is not None:
        return DynamicBatcher(dynamic_settings(config), free_work, clock)
    return DefaultScheduler(free_work, clock)


__all__ = [
    "BatchSource",
    "Clock",
    "DefaultScheduler",
    "DynamicBatcher",
    "FreeWork",
    "LoopClock",
    "Scheduler",
    "SchedulerConfigError",
    "SequenceBatcher",
    "StageTensor",
    "arena_stager",
    "make_scheduler",
]
