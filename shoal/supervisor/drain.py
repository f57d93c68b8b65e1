"""The gate that shutdown closes: it counts inference requests in flight and, once closed, refuses
new ones, so that a load balancer sees a clean, retryable UNAVAILABLE while the rest finish."""

from __future__ import annotations

import asyncio

from shoal.core.errors import Unavailable

#: Triton's words for health checks while it exits (``InferenceServer::IsLive``/``IsReady``).
EXITING = "Server exiting"


class DrainGate:
    """Open while serving; :meth:`close` starts the drain and :meth:`drained` waits for its end."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.closed = False

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
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    def close(self) -> None:
        self.closed = True

    async def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the requests in flight; False if some are left."""
        if self._in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
