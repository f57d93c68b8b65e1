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
from shoal.core.packed import one_key
from shoal.core.packed import shape_key as packed_shape_key
from shoal.ipc.records import RequestRecord
from shoal.supervisor.schedulers._queues import Entry
from shoal.supervisor.work import Work


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


def shape_key(record: RequestRecord, settings: BatchSettings) -> bytes | None:
    """Requests may share a batch only when these keys are equal: None where the model has no
    input whose shape must agree and no optional input; else ``core.packed.shape_key`` of the
    inputs that count, which a frontend worker builds the same for a request it packs
    (:func:`work_key`)."""
    equal = settings.equal_shape_inputs
    optional = settings.has_optional_input
    if not equal and not optional:
        return None
    inputs = record.inputs
    if len(inputs) == 1:  # the usual batched request: no list of pairs to sort
        name = inputs[0].name
        if name in equal:
            return one_key(name, inputs[0].shape[1:])
        return one_key(name, ()) if optional else b""
    given: list[tuple[str, tuple[int, ...]]] = []
    for tensor in inputs:
        if tensor.name in equal:
            given.append((tensor.name, tuple(tensor.shape[1:])))
        elif optional:
            given.append((tensor.name, ()))
    return packed_shape_key(given)


def work_key(work: Work, settings: BatchSettings) -> bytes | None:
    """:func:`shape_key` of a queued request: a packed one's came with it (``Work.tag``, from
    the packed call: its record has no inputs here)."""
    if work.record.packed is None:
        return shape_key(work.record, settings)
    if not settings.equal_shape_inputs and not settings.has_optional_input:
        return None
    tag = work.tag
    return tag if isinstance(tag, bytes) else b""


class Cut:
    """The batch to send now, or (when empty) when to look again if nothing else happens.

    An empty cut of a queue that holds requests also says what it took of them (all): their
    total ``size`` and shape ``key``, which :class:`Tail` goes on from.
    """

    def __init__(
        self, entries: list[Entry], wake_ns: int | None = None, size: int = 0, key: Any = None
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.entries = entries
        self.wake_ns = wake_ns
        self.size = size
        self.key = key


_NOTHING = Cut([])


def cut_batch(queue: Iterable[Entry], settings: BatchSettings, now_ns: int) -> Cut:
    """Triton's rules, in order:

    * take requests in queue order while they fit ``max_batch_size`` and agree in shape;
    * remember the longest prefix whose size is a preferred batch size (or that reaches the
      largest preferred size);
    * send that prefix at once unless the oldest request has waited ``max_queue_delay``;
    * else send everything taken if the batch cannot grow, the delay is over or there is none;
    * else wait until the oldest request has waited ``max_queue_delay``.
    """
    largest = settings.max_preferred  # a max over the set: read once per cut
    pending, size, best, send_now = _take(queue, settings, largest)
    if not pending:
        return _NOTHING
    oldest = min(e.arrival_ns for e in pending)
    delay = settings.max_queue_delay_ns
    exceeded = delay != 0 and now_ns - oldest >= delay
    if best and not exceeded:
        return Cut(pending[:best])
    if send_now or size >= largest or exceeded or delay == 0:
        return Cut(pending)
    return Cut([], oldest + delay, size, pending[0].shape_key)


def _take(
    queue: Iterable[Entry], settings: BatchSettings, largest: int
) -> tuple[list[Entry], int, int, bool]:
    pending: list[Entry] = []
    size = best = 0
    key: object = None
    limit = settings.max_batch_size
    for entry in queue:
        if pending:
            if size + entry.size > largest and not best:
                best = len(pending)
            if size + entry.size > limit or entry.shape_key != key:
                return pending, size, best, True
        else:
            key = entry.shape_key
        pending.append(entry)
        size += entry.size
        if size in settings.preferred_batch_sizes:
            best = len(pending)
    return pending, size, best, False


class Tail:
    """The queue as the last empty cut took it, while requests are only added at its end.

    Such a cut took every queued request (nothing stopped it), reached no preferred size and
    found the oldest request within its delay; a request added at the end can change that only
    by what it adds to the taken size and shape, which :meth:`admits` checks without looking at
    the queue again. A batcher uses it only where no preferred sizes are set: a request of the
    queue that the client abandoned since still counts in ``size`` until the next cut, which can
    only make a batch look closer to full (a wake-up that finds nothing), never further, when
    fullness is ``max_batch_size``; against a set of preferred sizes it could miss one.
    """

    def __init__(self, size: int, key: Any) -> None:
        #: Inferences taken (0: the queue was empty) and their shape key.
        self.size = size
        self.key = key

    def admits(self, entry: Entry, max_batch_size: int) -> bool:
        """Take ``entry`` (queued at the end) if a cut would still find no batch to send."""
        size = self.size + entry.size
        if size >= max_batch_size:
            return False
        if self.size == 0:
            self.key = entry.shape_key
        elif entry.shape_key != self.key:
            return False
        self.size = size
        return True
