"""The default scheduler: one FIFO queue per model version; free instances pull from it."""

from __future__ import annotations

import asyncio
import collections

from shoal.supervisor.errors import Unavailable
from shoal.supervisor.schedulers.base import fail_work
from shoal.supervisor.work import Work


class DefaultScheduler:
    """FIFO of single requests. ``next_batch`` hands each to exactly one instance."""

    def __init__(self, free_blocks: collections.abc.Callable[[Work], None]) -> None:
        self._queue: collections.deque[Work] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._free_blocks = free_blocks
        self._closed = False
        self._empty = asyncio.Event()
        self._empty.set()

    def submit(self, work: Work) -> None:
        if self._closed:
            fail_work(work, Unavailable("the model is unloading"), self._free_blocks)
            return
        self._queue.append(work)
        self._empty.clear()
        self._wake_one()

    def source(self, instance: int) -> DefaultScheduler:
        """Every instance pulls from the one queue."""
        return self

    def requeue(self, batch: list[Work]) -> None:
        """Put work an instance could not send back at the head of the queue."""
        self._queue.extendleft(reversed(batch))
        if self._queue:
            self._empty.clear()
        self._wake_one()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def wait_empty(self) -> None:
        """Return once every queued request has been handed to an instance."""
        await self._empty.wait()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def next_batch(self) -> list[Work]:
        """Wait for the next live request."""
        while True:
            while self._queue:
                work = self._queue.popleft()
                if not self._queue:
                    self._empty.set()
                if work.abandoned:
                    self._free_blocks(work)
                    continue
                return [work]
            if self._closed:
                raise asyncio.CancelledError
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def close(self) -> list[Work]:
        """Stop handing out work; returns what was still queued."""
        self._closed = True
        left, self._queue = list(self._queue), collections.deque()
        self._empty.set()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        return left
