"""What every scheduler offers, what it needs, and the clock it runs on.

A scheduler takes :class:`~shoal.supervisor.work.Work` from the service (``submit``) and hands
batches to instances, which pull them when they are free (``source(i).next_batch()``). Most
schedulers hand the same queue to every instance; the sequence batcher pins sequences to one
instance, so each instance gets its own :class:`BatchSource`.

Time comes from an injected :class:`Clock`, so unit tests drive delays and timeouts by advancing
a manual clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from shoal.core.errors import ShoalError
from shoal.ipc.arena import Block
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.work import Completion, Work

_Stream = asyncio.Queue[Completion | BaseException | None]

#: Returns a dropped or failed work's input blocks to the input arena.
FreeWork = Callable[[Work], None]

#: Copies one tensor the scheduler adds to a request (a sequence control, implicit state) into
#: the input arena: ``(name, datatype, shape, data) -> (descriptor, block)``. ``data`` is an array
#: or bytes already in the V2 layout. Raises a ShoalError (RESOURCE_EXHAUSTED) when it cannot.
StageTensor = Callable[[str, str, tuple[int, ...], "np.ndarray | bytes"], tuple[TensorDesc, Block]]


class BatchSource(Protocol):
    """What one instance pulls work from."""

    async def next_batch(self) -> list[Work]:
        """The next batch for this instance; raises CancelledError once the scheduler closed."""
        ...

    def requeue(self, batch: list[Work]) -> None:
        """A batch the instance pulled but could not send: hand it out again first."""
        ...


class Scheduler(Protocol):
    """One model version's scheduler."""

    def submit(self, work: Work) -> None:
        """Queue ``work``. Never raises: a rejected request's future fails and its blocks are
        freed (queue full, missing correlation id, ...)."""
        ...

    def source(self, instance: int) -> BatchSource:
        """Where instance number ``instance`` (0-based, config order) pulls its batches."""
        ...

    @property
    def pending(self) -> int:
        """Requests queued and not yet handed to an instance."""
        ...

    async def wait_empty(self) -> None:
        """Return once every queued request has been handed to an instance."""
        ...

    def close(self) -> list[Work]:
        """Stop handing out work; returns the requests still queued (the caller fails them)."""
        ...

    def take_queued(self) -> list[Work]:
        """The requests queued now, taken out of the queue (the caller fails them: no instance
        can run them); later requests queue as before."""
        ...


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic nanoseconds and one-shot timers."""

    def now_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle: ...


class LoopClock:
    """The real clock: ``time.monotonic_ns`` and the running event loop's timers."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        delay = max(0, when_ns - self.now_ns()) / 1e9
        return asyncio.get_running_loop().call_later(delay, callback)


class Alarm:
    """One re-armable timer: ``arm(when)`` replaces the previous deadline, ``None`` disarms."""

    def __init__(self, clock: Clock, callback: Callable[[], None]) -> None:
        self._clock = clock
        self._callback = callback
        self._handle: TimerHandle | None = None
        self.when_ns: int | None = None

    def arm(self, when_ns: int | None) -> None:
        if when_ns == self.when_ns:
            return
        self.cancel()
        if when_ns is not None:
            self.when_ns = when_ns
            self._handle = self._clock.call_at(when_ns, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self.when_ns = None

    def _fire(self) -> None:
        self._handle = None
        self.when_ns = None
        self._callback()


class Waker:
    """Lets any number of waiters sleep until the next ``notify``."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    async def wait(self) -> None:
        if self._future is None or self._future.done():
            self._future = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._future)

    def notify(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)
        self._future = None


def fail_work(work: Work, error: ShoalError, free_work: FreeWork) -> None:
    """Free a request that will not run and tell its requester why (through its response
    stream for a decoupled model)."""
    free_work(work)
    if work.future.done():
        return
    if work.stream is None:
        work.future.set_exception(error)
    else:
        _end_stream(work, work.stream, error)


def _end_stream(work: Work, stream: _Stream, error: ShoalError) -> None:
    work.future.cancel()  # a streaming requester reads the stream, not the future
    if not work.closed:
        stream.put_nowait(error)
        stream.put_nowait(None)


def log_prefix(work: Work) -> str:
    """Triton's ``LogRequest()`` prefix: ``[request id: <id>] `` when the request has an id."""
    request_id = work.record.request_id
    return f"[request id: {request_id}] " if request_id else ""


__all__ = [
    "Alarm",
    "BatchSource",
    "Clock",
    "FreeWork",
    "LoopClock",
    "Scheduler",
    "StageTensor",
    "TimerHandle",
    "Waker",
    "fail_work",
    "log_prefix",
]
