"""The default scheduler: one FIFO queue per model version; free instances pull from it.

A request that carries Triton's ``timeout`` parameter (microseconds) and is still queued when it
elapses is failed with the dynamic batcher's ``Request timeout expired`` (UNAVAILABLE) and never
runs; once an instance has it, the timeout no longer applies (a running request is not
interrupted, as in the dynamic batcher).

An instance with a free slot can **park** with the scheduler instead of waiting in
``next_batch``: a request submitted while one is parked goes straight to it (``Taker.take``),
which sends it to its stub at once, with no future resolved and no task woken per request.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

from shoal.core.errors import Unavailable
from shoal.supervisor.schedulers.base import Clock, LoopClock, TimerHandle, fail_work
from shoal.supervisor.schedulers.dynamic import TIMEOUT_EXPIRED
from shoal.supervisor.work import Work


class Taker(Protocol):
    """An instance parked with a free slot, waiting for work (``DefaultScheduler.park``)."""

    def take(self, work: Work) -> None:
        """Send ``work`` now (or have the instance's task send it); it holds the slot."""
        ...

    def closed(self) -> None:
        """The scheduler closed: stop waiting (as ``next_batch`` raises CancelledError)."""
        ...


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
        #: Instances parked with a free slot, first parked first served; while one is, the
        #: queue is empty (a request either goes to one of them or waits in the queue).
        self._takers: collections.deque[Taker] = collections.deque()

    def submit(self, work: Work) -> None:
        if self._closed:
            fail_work(work, Unavailable("the model is unloading"), self._free_blocks)
            return
        timeout_us = work.record.timeout_us
        if timeout_us > 0:
            # Kept on the work, for a request sent ahead that waits in the stub's ring.
            work.queue_deadline_ns = self._clock.now_ns() + timeout_us * 1000
        if self._takers:  # an instance is free: no queue, no timer, no wake-up
            self._takers.popleft().take(work)
            return
        if timeout_us > 0:
            # A request expires once the clock is past its deadline.
            deadline = work.queue_deadline_ns
            self._timers[work] = self._clock.call_at(deadline + 1, lambda: self._expire(work))
        self._queue.append(work)
        self._wake_one()

    def park(self, taker: Taker) -> Work | None:
        """The next live request for an instance with a free slot; None: it is parked, and
        the next request submitted goes to it (``taker.take``), unless the scheduler closes
        first (``taker.closed``)."""
        work = self._pop_live()
        if work is None:
            if self._closed:
                taker.closed()
            else:
                self._takers.append(taker)
        return work

    def unpark(self, taker: Taker) -> None:
        """``taker`` waits no longer (its instance stops)."""
        if taker in self._takers:
            self._takers.remove(taker)

    def _serve_takers(self) -> None:
        """Requests queued again while instances are parked: each goes to one."""
        while self._takers:
            work = self._pop_live()
            if work is None:
                return
            self._takers.popleft().take(work)

    def source(self, instance: int) -> DefaultScheduler:
        """Every instance pulls from the one queue."""
        return self

    def requeue(self, batch: list[Work]) -> None:
        """Put work an instance could not send back at the head of the queue (its timeout no
        longer applies: it was handed out in time)."""
        self._queue.extendleft(reversed(batch))
        self._serve_takers()
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
            work = self._pop_live()
            if work is not None:
                return [work]
            if self._closed:
                raise asyncio.CancelledError
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _pop_live(self) -> Work | None:
        """The head of the queue, past the requests that expired or were abandoned there."""
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
            return work
        return None

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
        takers, self._takers = list(self._takers), collections.deque()
        for taker in takers:
            taker.closed()
        return left
