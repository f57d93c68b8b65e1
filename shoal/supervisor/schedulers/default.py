"""The default scheduler: one FIFO queue per model version; free instances pull from it.

A request that carries Triton's ``timeout`` parameter (microseconds) and is still queued when it
elapses is failed with the dynamic batcher's ``Request timeout expired`` (UNAVAILABLE) and never
runs; once an instance has it, the timeout no longer applies (a running request is not
interrupted, as in the dynamic batcher).
"""

from __future__ import annotations

import asyncio
import collections

from shoal.core.errors import Unavailable
from shoal.supervisor.schedulers.base import Clock, LoopClock, TimerHandle, fail_work
from shoal.supervisor.schedulers.dynamic import TIMEOUT_EXPIRED
from shoal.supervisor.work import Work


class DefaultScheduler:
    """FIFO of single requests. ``next_batch`` hands each to exactly one instance."""

    def __init__(
        self, free_blocks: collections.abc.Callable[[Work], None], clock: Clock | None = None
    ) -> None:
        self._queue: collections.deque[Work] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._free_blocks = free_blocks
        self._clock = clock or LoopClock()
        #: One timer per queued request with a timeout; its deadline (``work.queue_deadline_ns``)
        #: is checked again when the request is handed out, so a late timer cannot let an
        #: expired request run.
        self._timers: dict[Work, TimerHandle] = {}
        self._closed = False
        #: Callers of ``wait_empty``, told when the queue runs dry (an asyncio.Event cleared and
        #: set on every request cost more than these rare waits).
        self._drain_waiters: list[asyncio.Future[None]] = []

    def submit(self, work: Work) -> None:
        if self._closed:
            fail_work(work, Unavailable("the model is unloading"), self._free_blocks)
            return
        timeout_us = work.record.timeout_us
        if timeout_us > 0:
            deadline = self._clock.now_ns() + timeout_us * 1000
            work.queue_deadline_ns = deadline
            # A request expires once the clock is past its deadline.
            timer = self._clock.call_at(deadline + 1, lambda: self._expire(work))
            self._timers[work] = timer
        self._queue.append(work)
        self._wake_one()

    def source(self, instance: int) -> DefaultScheduler:
        """Every instance pulls from the one queue."""
        return self

    def requeue(self, batch: list[Work]) -> None:
        """Put work an instance could not send back at the head of the queue (its timeout no
        longer applies: it was handed out in time)."""
        self._queue.extendleft(reversed(batch))
        self._wake_one()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def wait_empty(self) -> None:
        """Return once every queued request has been handed to an instance."""
        if self._queue:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def _emptied(self) -> None:
        """The queue ran dry: wake the callers of ``wait_empty``."""
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _expire(self, work: Work) -> None:
        """The timer of a queued request fired: fail it and take it out of the queue."""
        if self._timers.pop(work, None) is None:
            return  # already handed out
        try:
            self._queue.remove(work)
        except ValueError:
            return
        if not self._queue:
            self._emptied()
        fail_work(work, Unavailable(TIMEOUT_EXPIRED), self._free_blocks)

    def _expired(self, work: Work) -> bool:
        """Forget ``work``'s timer; True when its deadline passed before it was handed out."""
        timer = self._timers.pop(work, None)
        if timer is None:
            return False
        timer.cancel()
        return self._clock.now_ns() > work.queue_deadline_ns

    async def next_batch(self) -> list[Work]:
        """Wait for the next live request."""
        while True:
            while self._queue:
                work = self._queue.popleft()
                if not self._queue and self._drain_waiters:
                    self._emptied()
                if self._expired(work):
                    fail_work(work, Unavailable(TIMEOUT_EXPIRED), self._free_blocks)
                    continue
                if work.abandoned:
                    self._free_blocks(work)
                    continue
                return [work]
            if self._closed:
                raise asyncio.CancelledError
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def take_queued(self) -> list[Work]:
        for work in self._queue:
            timer = self._timers.pop(work, None)
            if timer is not None:
                timer.cancel()
        left, self._queue = list(self._queue), collections.deque()
        self._emptied()
        return left

    def close(self) -> list[Work]:
        """Stop handing out work; returns what was still queued."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        left, self._queue = list(self._queue), collections.deque()
        self._emptied()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        return left
