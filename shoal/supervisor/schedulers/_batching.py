"""Batch formation: which queued requests go into the next batch, or how long to wait for more.

:func:`cut_batch` is Triton's ``DynamicBatchScheduler::GetDynamicBatch`` for one free instance,
written as a pure function of the queue, the settings and the time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shoal.config import ModelConfig, QueuePolicy, SequenceBatchingConfig
from shoal.ipc.records import RequestRecord
from shoal.supervisor.schedulers._queues import Entry


@dataclass(frozen=True)
class BatchSettings:
    """What a dynamic batch may hold and how long it may wait to fill."""

    max_batch_size: int = 1
    preferred_batch_sizes: frozenset[int] = frozenset()
    max_queue_delay_ns: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_policy: QueuePolicy = field(default_factory=QueuePolicy)
    level_policies: Mapping[int, QueuePolicy] = field(default_factory=lambda: MappingProxyType({}))
    #: Inputs with variable dims that do not allow ragged batches: their shapes must agree.
    equal_shape_inputs: frozenset[str] = frozenset()
    #: With optional inputs, requests share a batch only if they give the same inputs.
    has_optional_input: bool = False

    @property
    def max_preferred(self) -> int:
        return max(self.preferred_batch_sizes, default=self.max_batch_size)


def shape_rules(config: ModelConfig) -> dict[str, Any]:
    """The shape-agreement settings of a model (Triton's ``enforce_equal_shape_tensors``)."""
    equal = frozenset(
        t.name
        for t in config.inputs
        if t.is_shape_tensor or (not t.allow_ragged_batch and -1 in t.dims)
    )
    return {
        "equal_shape_inputs": equal,
        "has_optional_input": any(t.optional for t in config.inputs),
    }


def sequence_settings(config: ModelConfig) -> SequenceBatchingConfig:
    """A model's ``sequence_batching`` (a sequence batcher is made only for a model with one)."""
    batching = config.sequence_batching
    if batching is None:
        raise ValueError(f"model '{config.name}' has no sequence_batching")
    return batching


def dynamic_settings(config: ModelConfig) -> BatchSettings:
    """Settings of a model's ``dynamic_batching``."""
    batching = config.dynamic_batching
    if batching is None:
        raise ValueError(f"model '{config.name}' has no dynamic_batching")
    return BatchSettings(
        max_batch_size=max(1, config.max_batch_size),
        preferred_batch_sizes=frozenset(batching.preferred_batch_sizes),
        max_queue_delay_ns=batching.max_queue_delay_microseconds * 1000,
        preserve_ordering=batching.preserve_ordering,
        priority_levels=batching.priority_levels,
        default_priority_level=batching.default_priority_level,
        default_policy=batching.default_queue_policy,
        level_policies=batching.priority_queue_policies,
        **shape_rules(config),
    )


def shape_key(record: RequestRecord, settings: BatchSettings) -> object:
    """Requests may share a batch only when these keys are equal."""
    if not settings.equal_shape_inputs and not settings.has_optional_input:
        return None
    return tuple(
        sorted(
            (t.name, tuple(t.shape[1:]) if t.name in settings.equal_shape_inputs else ())
            for t in record.inputs
            if settings.has_optional_input or t.name in settings.equal_shape_inputs
        )
    )


@dataclass(frozen=True)
class Cut:
    """The batch to send now, or (when empty) when to look again if nothing else happens."""

    entries: list[Entry]
    wake_ns: int | None = None


def cut_batch(queue: Iterable[Entry], settings: BatchSettings, now_ns: int) -> Cut:
    """Triton's rules, in order:

    * take requests in queue order while they fit ``max_batch_size`` and agree in shape;
    * remember the longest prefix whose size is a preferred batch size (or that reaches the
      largest preferred size);
    * send that prefix at once unless the oldest request has waited ``max_queue_delay``;
    * else send everything taken if the batch cannot grow, the delay is over or there is none;
    * else wait until the oldest request has waited ``max_queue_delay``.
    """
    pending, size, best, send_now = _take(queue, settings)
    if not pending:
        return Cut([])
    oldest = min(e.arrival_ns for e in pending)
    delay = settings.max_queue_delay_ns
    exceeded = delay != 0 and now_ns - oldest >= delay
    if best and not exceeded:
        return Cut(pending[:best])
    if send_now or size >= settings.max_preferred or exceeded or delay == 0:
        return Cut(pending)
    return Cut([], oldest + delay)


def _take(queue: Iterable[Entry], settings: BatchSettings) -> tuple[list[Entry], int, int, bool]:
    pending: list[Entry] = []
    size = best = 0
    key: object = None
    for entry in queue:
        if pending:
            if size + entry.size > settings.max_preferred and not best:
                best = len(pending)
            if size + entry.size > settings.max_batch_size or entry.shape_key != key:
                return pending, size, best, True
        else:
            key = entry.shape_key
        pending.append(entry)
        size += entry.size
        if size in settings.preferred_batch_sizes:
            best = len(pending)
    return pending, size, best, False
