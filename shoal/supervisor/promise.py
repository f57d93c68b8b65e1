"""The outcome of a request whose requester is called back rather than awaiting it.

A work's requester learns its outcome through ``Work.future``: an ``asyncio.Future`` where a
coroutine awaits it (the in-process frontends, BLS, ensembles, warm-up), a :class:`Promise`
where a callback waits (``InferenceService.start_infer``, the frontend workers' path). A
Promise has the part of a Future's interface that schedulers and instances use, and the same
timing: its done-callbacks run on a later turn of the loop, in the order they were scheduled.
What it saves per request is the Future's machinery: no Future, no context copy, and no
``call_soon`` handle each, since every promise settled in one loop turn is called back from
one ``call_soon`` (:class:`Settled`), as the instances give back output blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger("shoal")

_PENDING: Final = 0
_RESULT: Final = 1
_ERROR: Final = 2
_CANCELLED: Final = 3


class Settled:
    """Calls back, from one ``call_soon`` per loop turn, the promises settled in that turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        #: None: the loop running when the first promise settles (made before any runs).
        self._loop = loop
        self._queue: list[Promise] = []

    def add(self, promise: Promise) -> None:
        if not self._queue:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._run)
        self._queue.append(promise)

    def _run(self) -> None:
        queue, self._queue = self._queue, []
        for promise in queue:
            promise.call_back()

    def report(self, error: Exception, callback: object) -> None:
        """A callback raised: logged as the loop logs a failed callback, the others still run."""
        loop = self._loop or asyncio.get_running_loop()
        loop.call_exception_handler(
            {"message": f"Exception in callback {callback!r}", "exception": error}
        )


class Promise:
    """A Future's ``done``, ``cancelled``, ``result``, ``exception``, ``set_result``,
    ``set_exception``, ``cancel`` and ``add_done_callback``, with the same meaning; not
    awaitable (awaiting code makes its work with a Future)."""

    def __init__(self, settled: Settled) -> None:
        self._settled = settled
        self._state = _PENDING
        self._result: Any = None
        self._error: BaseException | None = None
        #: The first callback, then any others (most promises have one: no list for it).
        self._callback: Callable[[Promise], object] | None = None
        self._more: list[Callable[[Promise], object]] | None = None
        self._queued = False

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> Any:
        state = self._state
        if state == _RESULT:
            return self._result
        if state == _ERROR:
            assert self._error is not None
            raise self._error
        if state == _CANCELLED:
            raise asyncio.CancelledError()
        raise asyncio.InvalidStateError("Result is not set.")

    def exception(self) -> BaseException | None:
        if self._state == _CANCELLED:
            raise asyncio.CancelledError()
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("Exception is not set.")
        return self._error

    def set_result(self, result: Any) -> None:
        self._check_pending()
        self._result = result
        self._settle(_RESULT)

    def set_exception(self, error: BaseException) -> None:
        self._check_pending()
        self._error = error
        self._settle(_ERROR)

    def cancel(self, msg: Any = None) -> bool:
        if self._state != _PENDING:
            return False
        self._settle(_CANCELLED)
        return True

    def add_done_callback(self, callback: Callable[[Promise], object]) -> None:
        if self._callback is None and self._more is None:
            self._callback = callback
        elif self._more is None:
            self._more = [callback]
        else:
            self._more.append(callback)
        if self._state != _PENDING:
            self._queue()

    def call_back(self) -> None:
        """Run the callbacks added so far (:class:`Settled` calls it on the loop)."""
        self._queued = False
        first, self._callback = self._callback, None
        more, self._more = self._more, None
        if first is not None:
            self._run(first)
        if more is not None:
            for callback in more:
                self._run(callback)

    def _run(self, callback: Callable[[Promise], object]) -> None:
        try:
            callback(self)
        except Exception as error:
            self._settled.report(error, callback)

    def _check_pending(self) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError("invalid state")

    def _settle(self, state: int) -> None:
        self._state = state
        if self._callback is not None or self._more is not None:
            self._queue()

    def _queue(self) -> None:
        if not self._queued:
            self._queued = True
            self._settled.add(self)
