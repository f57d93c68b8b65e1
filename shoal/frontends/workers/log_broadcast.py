"""A change of the log settings, answered once every frontend worker has applied it.

Triton's logging extension answers an update when the server logs with the new settings. With
workers, the one that took the update applies the core's answer itself; every other worker
hears of it in a ``LOG_SETTINGS`` frame and acknowledges it (``LOG_APPLIED``), and only then
does the core answer the update. So a request sent after the answer, through any worker, is
logged with the new settings.

Two updates through two workers at once must not wait for each other: a worker waiting for its
own update's answer cannot acknowledge (its loop is blocked on the control socket), so it is
not waited for; the frame it was sent comes after its answer and sets it to the latest
settings before it reads another request. A worker that exits is not waited for, and one that
is stuck is waited for ``ACK_TIMEOUT_S`` at most (the update is answered, with a warning).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable

__all__ = ["ACK_TIMEOUT_S", "LogBroadcasts"]

log = logging.getLogger("shoal")

#: How long an update waits for the workers' acknowledgements before it is answered anyway.
ACK_TIMEOUT_S = 2.0


class _Broadcast:
    """One update: the worker that took it, those still to acknowledge, its answer."""

    def __init__(self, origin: int, waiting: set[int], answer: Callable[[], None]) -> None:
        self.origin = origin
        self.waiting = waiting
        self.answer = answer
        self.timer: asyncio.TimerHandle | None = None


class LogBroadcasts:
    """The updates of the log settings waiting for the workers' acknowledgements."""

    def __init__(self, timeout: float = ACK_TIMEOUT_S) -> None:
        self._timeout = timeout
        #: Numbers from 1: a worker acknowledges the frame it is sent at its start with 0.
        self._tokens = itertools.count(1)
        self._open: dict[int, _Broadcast] = {}

    def start(self, origin: int, workers: Iterable[int], answer: Callable[[], None]) -> int:
        """Open an update taken through worker ``origin``, to be acknowledged by ``workers``
        (the live ones, ``origin`` among them or not): the token its frames carry. ``answer``
        is called once all have (maybe before this returns)."""
        token = next(self._tokens)
        answering = {b.origin for b in self._open.values()}  # blocked until answered
        waiting = {index for index in workers if index != origin and index not in answering}
        broadcast = _Broadcast(origin, waiting, answer)
        self._open[token] = broadcast
        if waiting:
            loop = asyncio.get_running_loop()
            broadcast.timer = loop.call_later(self._timeout, self._overdue, token)
        else:
            self._close(token)
        return token

    def applied(self, worker: int, token: int) -> None:
        """Worker ``worker`` applied the settings of update ``token``."""
        broadcast = self._open.get(token)
        if broadcast is not None:
            broadcast.waiting.discard(worker)
            if not broadcast.waiting:
                self._close(token)

    def gone(self, worker: int) -> None:
        """Worker ``worker`` exited: no update waits for it (nor answers through it)."""
        for token, broadcast in list(self._open.items()):
            broadcast.waiting.discard(worker)
            if not broadcast.waiting or broadcast.origin == worker:
                self._close(token)

    def _overdue(self, token: int) -> None:
        broadcast = self._open.get(token)
        if broadcast is not None:
            log.warning(
                "frontend worker(s) %s did not apply the new log settings within %g s",
                ", ".join(str(index) for index in sorted(broadcast.waiting)),
                self._timeout,
            )
            self._close(token)

    def _close(self, token: int) -> None:
        broadcast = self._open.pop(token)
        if broadcast.timer is not None:
            broadcast.timer.cancel()
        broadcast.answer()
