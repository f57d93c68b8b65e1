"""The stub's replies to the supervisor's calls outside inference: ``Ready`` to ``Initialize``,
``Finalized`` to ``Finalize``, ``Readiness`` to ``ReadinessCheck`` (the model's ``is_ready()``)."""

from __future__ import annotations

import asyncio
import logging

from shoal.ipc import messages as msg
from shoal.ipc.queue import PeerGone
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.spec import InstanceScope, LoadError

log = logging.getLogger("shoal")

#: How long model readiness waits for a model's ``is_ready()`` (Triton's 5 s).
USER_READY_TIMEOUT_S = 5.0


class Handshake:
    """Waits for the stub's replies; a stub that dies answers each of them with its death."""

    def __init__(self, scope: InstanceScope) -> None:
        self._name = scope.name
        self._current = scope.current
        self._loop = scope.loop
        # (error, traceback) when initialize failed, else None.
        self._initialized: asyncio.Future[tuple[str, str] | None] | None = None
        self._finalized: asyncio.Future[None] | None = None
        self._readiness: asyncio.Future[bool] | None = None
        #: The model defines ``is_ready()``.
        self.user_ready = False

    @property
    def initializing(self) -> bool:
        """A stub was sent ``Initialize`` and has not answered."""
        return self._initialized is not None and not self._initialized.done()

    def expect_ready(self) -> None:
        self._initialized = self._loop.create_future()

    async def initialized(self) -> None:
        """Wait for the stub's ``Ready``; raises LoadError when ``initialize`` failed."""
        assert self._initialized is not None
        failure = await self._initialized
        if failure is not None:
            raise LoadError(*failure)

    def ready(self, error: str | None, traceback: str, user_ready: bool) -> None:
        self.user_ready = user_ready
        self._settle_initialized(None if error is None else (error, traceback))

    def expect_finalized(self) -> None:
        self._finalized = self._loop.create_future()

    async def finalize(self, proc: StubChannel) -> None:
        """Call the model's ``finalize()`` and wait until it returned (or the stub died)."""
        await proc.send_async(msg.Finalize())
        assert self._finalized is not None
        await self._finalized

    def finalized(self, error: str | None) -> None:
        if error:
            log.warning("[%s] finalize raised:\n%s", self._name, error)
        if self._finalized is not None and not self._finalized.done():
            self._finalized.set_result(None)

    async def is_ready(self, timeout: float = USER_READY_TIMEOUT_S) -> bool:
        """What the model's ``is_ready()`` says (False when it raised, answered no bool, or
        did not answer within ``timeout``). A check already running is joined, as in Triton:
        one slow ``is_ready()`` is not asked again by every caller."""
        proc = self._current.proc
        if proc is None or not self._current.ready.is_set():
            return False
        answer = self._readiness
        if answer is None:
            answer = self._readiness = self._loop.create_future()
            try:
                await proc.send_async(msg.ReadinessCheck())
            except PeerGone:
                self.readiness(False, "the stub exited")
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except asyncio.TimeoutError:
            return False

    def readiness(self, ready: bool, error: str | None) -> None:
        waiting, self._readiness = self._readiness, None
        if error is not None:
            log.info("[%s] is_ready() says not ready: %s", self._name, error)
        if waiting is not None and not waiting.done():
            waiting.set_result(ready and error is None)

    def stub_exited(self, current: bool, how: str) -> None:
        """A stub exited (``current``: the instance's own, not one it replaced): nothing it was
        asked is answered any more."""
        if current:
            self.readiness(False, None)
        died = f"Stub process '{self._name}' is not healthy. It exited during initialize"
        self._settle_initialized((f"{died} with {how}", ""))
        if self._finalized is not None and not self._finalized.done():
            self._finalized.set_result(None)

    def _settle_initialized(self, failure: tuple[str, str] | None) -> None:
        waiter = self._initialized
        if waiter is not None and not waiter.done():
            waiter.set_result(failure)
