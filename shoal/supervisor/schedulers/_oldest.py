"""The sequence batcher's ``oldest`` strategy: each instance dynamically batches the next request
of each of its candidate sequences.

A sequence keeps one slot (a candidate) of one instance. Only one request per sequence is handed
to that instance's :class:`DynamicBatcher` at a time; the next one follows when it completes, so a
batch never holds two requests of one sequence and a sequence's requests run in order. The
batcher uses ``oldest``'s ``preferred_batch_size``, ``max_queue_delay_microseconds`` and
``preserve_ordering`` (Triton's ``OldestSequenceBatch``).
"""

from __future__ import annotations

import asyncio
import functools

from shoal.supervisor.schedulers._batching import BatchSettings
from shoal.supervisor.schedulers._controls import FLAG_END
from shoal.supervisor.schedulers._slots import ForceEnd, SequenceCore, Slot, when_done
from shoal.supervisor.schedulers.base import BatchSource
from shoal.supervisor.schedulers.dynamic import DynamicBatcher
from shoal.supervisor.work import Work


class OldestStrategy:
    """Feeds each instance's dynamic batcher from its slots."""

    def __init__(self, core: SequenceCore, instances: int, settings: BatchSettings) -> None:
        self._core = core
        self._settings = settings
        self._batchers = [
            DynamicBatcher(settings, core.free_work, core.clock) for _ in range(instances)
        ]

    def add_instance(self) -> None:
        core = self._core
        self._batchers.append(DynamicBatcher(self._settings, core.free_work, core.clock))

    def holds(self, instance: int) -> bool:
        """A request waits in ``instance``'s batcher."""
        return self._batchers[instance].pending > 0

    def source(self, instance: int) -> BatchSource:
        return self._batchers[instance]

    def enqueued(self, slot: Slot) -> None:
        """A request (or a force-end) was queued in ``slot``: issue it unless one is running."""
        if not slot.in_flight:
            self._issue_next(slot)

    @property
    def pending(self) -> int:
        return sum(batcher.pending for batcher in self._batchers)

    async def wait_empty(self) -> None:
        await asyncio.gather(*(batcher.wait_empty() for batcher in self._batchers))

    def close(self) -> list[Work]:
        left: list[Work] = []
        for batcher in self._batchers:
            left += batcher.close()
        return left

    def _issue_next(self, slot: Slot) -> None:
        """Hand the slot's next request to its instance's batcher (Triton's CompleteAndNext)."""
        slot.in_flight = False
        while slot.queue and not slot.in_flight and not self._core.closed:
            item = slot.queue.popleft()
            if isinstance(item, ForceEnd):
                self._core.release(slot)
                continue
            if item.abandoned:
                self._core.cancel_sequence(slot, item)
                continue
            if self._core.prepare(item, slot):
                slot.in_flight = True
                if not item.watched:  # a rescheduled request comes through here again
                    item.watched = True
                    when_done(item, functools.partial(self._issue_next, slot))
                self._batchers[slot.instance].submit(item)
            if item.record.flags & FLAG_END:
                self._core.release(slot)
        self._core.changed()
