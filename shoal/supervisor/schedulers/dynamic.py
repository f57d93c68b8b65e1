"""Triton's dynamic batcher: one queue per model version, cut into batches for free instances.

An instance asks for work (``next_batch``); the batcher cuts the best batch it can
(:func:`~shoal.supervisor.schedulers._batching.cut_batch`) or, when waiting could still reach a
preferred size, waits until the oldest request has waited ``max_queue_delay_microseconds`` or
something changes. A request queued behind such a wait, which cannot end it, wakes no one
(:class:`~shoal.supervisor.schedulers._batching.Tail`). Queue policies reject or delay requests
whose queue timeout expires, on a timer, whether or not an instance is waiting.
"""

from __future__ import annotations

import asyncio
import collections

from shoal.core.errors import Rejected, Unavailable
from shoal.supervisor.schedulers._batching import BatchSettings, Tail, cut_batch, work_key
from shoal.supervisor.schedulers._ordering import OrderedDelivery
from shoal.supervisor.schedulers._queues import Entry, PolicyQueue, PriorityQueue
from shoal.supervisor.schedulers.base import (
    Alarm,
    BatchSource,
    Clock,
    FreeWork,
    LoopClock,
    Waker,
    fail_work,
    log_prefix,
)
from shoal.supervisor.work import Work

TIMEOUT_EXPIRED = "Request timeout expired"
QUEUE_FULL = "Exceeds maximum queue size"


class DynamicBatcher:
    """Batches requests for all instances of one model version (also the per-instance batcher
    of the sequence batcher's ``oldest`` strategy)."""

    def __init__(
        self, settings: BatchSettings, free_work: FreeWork, clock: Clock | None = None
    ) -> None:
        self.settings = settings
        self._free_work = free_work
        self._clock = clock or LoopClock()
        self._queue = PriorityQueue(
            settings.priority_levels,
            settings.default_priority_level,
            settings.default_policy,
            dict(settings.level_policies),
        )
        self._held: collections.deque[list[Work]] = collections.deque()
        self._waker = Waker()
        self._delay_alarm = Alarm(self._clock, self._waker.notify)
        self._timeout_alarm = Alarm(self._clock, self._on_timeout)
        self._ordering = OrderedDelivery() if settings.preserve_ordering else None
        self._closed = False
        self._empty = asyncio.Event()
        self._empty.set()
        #: ``_empty.is_set()``, kept here: the event's methods are interpreted Python calls,
        #: made only when it changes (every request would set or clear it twice).
        self._is_empty = True
        #: Where a request queued at the end can be checked against the last empty cut alone:
        #: one level, a delay to wait out and no preferred size below the largest batch (the
        #: config lists ``max_batch_size`` where none is given; see ``Tail``).
        self._quiet = (
            settings.max_queue_delay_ns != 0
            and settings.preferred_batch_sizes <= {settings.max_batch_size}
            and not settings.priority_levels
        )
        #: The last empty cut, while only requests queued quietly came after it.
        self._tail: Tail | None = None

    # -- Scheduler --------------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        if self._closed:
            fail_work(work, Unavailable("the model is unloading"), self._free_work)
            return
        level = self._queue.level_of(_priority(work))
        queue = self._queue.queue(level)
        limit = queue.max_queue_size
        if limit and len(queue) >= limit:
            fail_work(work, Rejected(log_prefix(work) + QUEUE_FULL), self._free_work)
            return
        now = self._clock.now_ns()
        timeout_us = queue.timeout_us(work.record.timeout_us)
        deadline = now + timeout_us * 1000 if timeout_us else 0
        key = work_key(work, self.settings)
        entry = Entry(work, now, deadline, max(1, work.batch_size), key, level)
        queue.waiting.append(entry)
        if not self._queued_quietly(queue, entry):
            self._changed()

    def source(self, instance: int) -> BatchSource:
        return self

    @property
    def pending(self) -> int:
        held = 0
        for batch in self._held:
            held += len(batch)
        return len(self._queue) + held

    async def wait_empty(self) -> None:
        await self._empty.wait()

    def take_queued(self) -> list[Work]:
        left = [entry.work for entry in self._queue.drain()]
        while self._held:
            left += self._held.popleft()
        self._changed()
        return left

    def close(self) -> list[Work]:
        self._closed = True
        self._delay_alarm.cancel()
        self._timeout_alarm.cancel()
        left = [entry.work for entry in self._queue.drain()]
        while self._held:
            left += self._held.popleft()
        self._mark_empty(True)
        self._waker.notify()
        return left

    # -- BatchSource ------------------------------------------------------------------------

    async def next_batch(self) -> list[Work]:
        while True:
            if self._closed:
                raise asyncio.CancelledError
            batch = self._next_now()
            if batch:
                return batch
            await self._waker.wait()

    def requeue(self, batch: list[Work]) -> None:
        self._held.append(batch)
        self._changed()

    # -- steps ------------------------------------------------------------------------------

    def _next_now(self) -> list[Work] | None:
        """A batch to run now, or None (with the delay alarm armed when waiting helps)."""
        self._tail = None
        if self._held:
            batch = self._held.popleft()
            self._update_empty()
            return batch
        now = self._clock.now_ns()
        self._expire(now)
        self._drop_abandoned()
        cut = cut_batch(self._queue, self.settings, now)
        self._queue.remove_first(len(cut.entries))  # a cut is the queue's first requests
        self._arm_timeouts()
        self._update_empty()
        if not cut.entries:
            self._delay_alarm.arm(cut.wake_ns)
            if self._quiet:
                self._tail = Tail(cut.size, cut.key)
            return None
        batch = [entry.work for entry in cut.entries]
        if self._ordering is not None:
            for work in batch:
                if work.stream is None:  # a decoupled request's responses stream as they come
                    self._ordering.track(work)
        return batch

    def _queued_quietly(self, queue: PolicyQueue, entry: Entry) -> bool:
        """Whether ``entry``, just queued at the end, leaves the last cut's answer (no batch,
        wait for the delay) as it was: then no one wakes to cut again. Keeps the alarms and the
        empty event as a cut would."""
        tail = self._tail
        # Not the first request (the instance's own look arms the delay) nor one queued before
        # a delayed request.
        if tail is None or tail.size == 0 or queue.delayed:
            return False
        if not tail.admits(entry, self.settings.max_batch_size):
            self._tail = None
            return False
        if entry.deadline_ns:  # it may have the closest deadline (``_arm_timeouts``)
            armed = self._timeout_alarm.when_ns
            closest = entry.deadline_ns + 1
            self._timeout_alarm.arm(closest if armed is None else min(armed, closest))
        self._mark_empty(False)
        return True

    def _expire(self, now_ns: int) -> None:
        for entry in self._queue.expire(now_ns):
            fail_work(entry.work, Rejected(TIMEOUT_EXPIRED), self._free_work)

    def _drop_abandoned(self) -> None:
        gone = [entry for entry in self._queue if entry.work.abandoned]
        self._queue.remove(gone)
        for entry in gone:
            self._free_work(entry.work)

    def _on_timeout(self) -> None:
        self._expire(self._clock.now_ns())
        self._changed()

    def _arm_timeouts(self) -> None:
        closest = self._queue.closest_deadline()
        # A request expires once the clock is past its deadline.
        self._timeout_alarm.arm(None if closest is None else closest + 1)

    def _changed(self) -> None:
        self._tail = None
        self._arm_timeouts()
        self._update_empty()
        self._waker.notify()

    def _update_empty(self) -> None:
        self._mark_empty(not self._held and not self._queue.any_queued())

    def _mark_empty(self, empty: bool) -> None:
        if empty != self._is_empty:
            self._is_empty = empty
            if empty:
                self._empty.set()
            else:
                self._empty.clear()


def _priority(work: Work) -> int:
    # A packed request has no parameters here: where priorities count, a request that names
    # one is never packed (``requests/packed.batching``).
    value = work.record.parameters.get("priority", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
