"""The gate that shutdown closes: it counts inference requests in flight and, once closed, refuses
new ones, so that a load balancer sees a clean, retryable UNAVAILABLE while the rest finish."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shoal.core.errors import Unavailable

#: Triton's words for health checks while it exits (``InferenceServer::IsLive``/``IsReady``).
EXITING = "Server exiting"


class DrainGate:
    """Open while serving; :meth:`close` starts the drain and :meth:`drained` waits for its end."""

    def __init__(self) -> None:
        self._in_flight = 0
        #: Made by :meth:`drained` and resolved by the last :meth:`leave`: a future only while
        #: someone waits, not an ``asyncio.Event`` cleared and set by every request (its
        #: methods are interpreted Python, called from this compiled hot path).
        self._idle: asyncio.Future[None] | None = None
        self.closed = False
        #: Called once it closes (direct dispatch takes its routes back: ``direct_routes``).
        self.on_close: list[Callable[[], None]] = []

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def enter(self, model: str) -> None:
        """Count one request for ``model``; raises :class:`Unavailable` (503) once closed."""
        if self.closed:
            raise Unavailable(
                f"the server is shutting down and accepts no new inference requests for model "
                f"'{model}': send it to another replica"
            )
        self._in_flight += 1

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            idle = self._idle
            if idle is not None and not idle.done():
                idle.set_result(None)

    def close(self) -> None:
        self.closed = True
        for each in self.on_close:
            each()

    async def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the requests in flight; False if some are left."""
        if self._in_flight == 0:
            return True
        idle = self._idle
        if idle is None or idle.done():
            idle = self._idle = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(idle), timeout)
        except asyncio.TimeoutError:
            return False
        return True
