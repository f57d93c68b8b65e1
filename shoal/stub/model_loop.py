"""The event loop an ``async def execute`` (and the BLS calls it awaits) runs on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from typing import Any

from shoal.stub.bls import calling_requests, current_callers


class ModelLoop:
    """A loop on its own thread, started when a model first needs it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="model-asyncio", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(self, awaitable: Any) -> concurrent.futures.Future[Any]:
        """Run a coroutine of the model on the loop; its future.

        Its task runs in a copy of this context (as ``run_coroutine_threadsafe`` makes it)
        holding the requests of the execute running here (``bls.current_callers``): the BLS
        calls the coroutine makes serve them, and concurrent executes keep their own.
        """
        context = contextvars.copy_context()
        callers = current_callers()
        if callers:
            context.run(calling_requests.set, callers)
        future: concurrent.futures.Future[Any] = context.run(
            asyncio.run_coroutine_threadsafe, awaitable, self._event_loop()
        )
        return future

    def await_result(self, awaitable: Any) -> Any:
        """Run a coroutine of the model to completion on the loop."""
        return self.submit(awaitable).result()
