"""An instance's stub from spawn to exit: start and ``initialize``, death, restart with back-off,
the crash loop that stops restarting, and the stop (``finalize``, then the exit, else a kill)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shoal.core.cycles import collect_soon
from shoal.ipc import messages as msg
from shoal.ipc.queue import PeerGone
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.dispatch import UpMessages
from shoal.supervisor.instances.handshake import Handshake
from shoal.supervisor.instances.process import StubLaunch, describe_exit
from shoal.supervisor.instances.spec import InstanceScope, InstanceSpec, LoadError

log = logging.getLogger("shoal")

_arena_ids = itertools.count(1)

#: Seconds a stub gets to exit after its finalize returned, even at the stop's deadline.
_EXIT_GRACE = 0.5

#: Makes the stub of an instance from its launch and output arena id (a kind of StubChannel).
MakeStub = Callable[[StubLaunch, int], StubChannel]


class StubEvents(Protocol):
    """What the instance does when one of its stubs exits (``StubInstance``)."""

    def stub_died(self, proc: StubChannel, how: str) -> None:
        """The stub died serving: fail or requeue what was in it; give back what it held."""
        ...

    def stub_gone(self, proc: StubChannel) -> None:
        """An unloaded or replaced stub, or one that died starting, exited: give back what it
        held."""
        ...

    def after_answers(self, proc: StubChannel, then: Callable[[], None]) -> None:
        """Call ``then`` once the answers an exited stub left in its ring, delivered at its
        exit, have given back the blocks of its arena they read from: now if none is out."""
        ...

    def gave_up(self) -> None:
        """The instance is in a crash loop and no longer restarts."""
        ...

    def health_changed(self) -> None:
        """A restart failed, or one succeeded after failures (``down`` says which)."""
        ...


@dataclass
class Health:
    """What an instance's restarts have come to."""

    restarts: int = 0
    #: How the last stub died ("" before any death).
    last_exit: str = ""
    #: Why the instance gave up restarting (a crash loop), or None.
    failed: str | None = None
    #: Why the instance has no live stub after a failed restart (None while it has one, or
    #: while its first restart after a death is under way); it keeps retrying.
    down: str | None = None


class CrashLoop:
    """A stub's deaths within a window: too many, and the instance stops restarting."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._deaths: list[float] = []

    def died(self) -> int:
        """Count a death; returns the deaths within the window."""
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self.window] + [now]
        return len(self._deaths)


class StubLifecycle:
    """Starts the instance's stub, restarts it when it dies, and stops it."""

    def __init__(
        self,
        scope: InstanceScope,
        spec: InstanceSpec,
        make_stub: MakeStub,
        parts: tuple[Handshake, UpMessages, StubEvents],
    ) -> None:
        self._name = scope.name
        self._directory = scope.directory
        self._current = scope.current
        self._loop = scope.loop
        self._spec = spec
        #: Starts a stub: a process (StubProcess), or in-process for tests (LoopbackStub).
        self._make_stub = make_stub
        self._handshake, self._up, self._events = parts
        self._crashes = CrashLoop(spec.crash_limit, spec.crash_window)
        #: A stub is starting: its exit is the launcher's to handle, not a crash to restart.
        self._launching = False
        self._restart_task: asyncio.Task[None] | None = None
        self.health = Health()

    async def launch(self) -> None:
        """Start a stub and wait for its ``initialize``. Whatever fails (no file descriptor or
        memory left, the interpreter missing, ``initialize`` raising) leaves nothing behind."""
        self._launching = True
        failure: BaseException | None = None
        try:
            proc = self._make_stub(self._spec.launch, next(_arena_ids))
            self._current.proc = proc
            try:
                await self._initialize(proc)
            except BaseException as error:  # no await in here: compiled, it loses the error
                failure = error
            if failure is not None:
                await self.discard(proc)
                raise failure
        finally:
            self._launching = False
        self._current.ready.set()

    async def stop(self, timeout: float) -> None:
        """finalize() and the stub's exit within ``timeout``, else SIGKILL; releases everything.

        ``timeout`` bounds the whole stop (the server's exit timeout is one deadline, as in
        Triton): a stub whose finalize does not return in time (its execute hangs, say) is
        killed at once, not given further graces."""
        self._current.stopping = True
        self._current.ready.clear()
        if self._restart_task is not None:
            self._restart_task.cancel()
        proc = self._current.proc
        if proc is None:
            return
        if proc.returncode is None:
            await self._finalize(proc, timeout)
        await self.discard(proc)

    async def discard(self, proc: StubChannel) -> None:
        """Wait for (or force) the exit of a stub we are done with, then close its resources
        (its arena once the last answers it left are written)."""
        await self._wait_exit(proc)
        if self._current.proc is proc:
            self._current.proc = None
        self._events.after_answers(proc, lambda: self._close(proc))

    def _close(self, proc: StubChannel) -> None:
        self._directory.unregister(proc)
        proc.close(self._loop)
        collect_soon(self._loop)  # views of its arena caught in cycles would keep it mapped

    async def _initialize(self, proc: StubChannel) -> None:
        for segment in self._directory.input_arena.segments:
            proc.announce(segment)
        self._directory.register(proc)
        self._handshake.expect_ready()
        proc.spawn(self._loop, lambda code: self._on_exit(proc, code))
        proc.watch_up(self._loop, lambda: self._up.drain(proc))
        spec = self._spec
        init = msg.Initialize(
            dict(spec.init_args),
            spec.model_file,
            proc.output_arena_id,
            spec.output_arena,
            spec.runtime_file,
        )
        try:
            await proc.send_async(init)
        except PeerGone:
            pass  # it died at once: _on_exit says how, through the handshake
        await self._handshake.initialized()

    def _on_exit(self, proc: StubChannel, returncode: int) -> None:
        how = describe_exit(returncode)
        self._current.ready.clear()
        # What it wrote whole before it exited is handled first: the answers reach their
        # requests (only those it left unanswered fail), and the Ready of a stub that died
        # starting says the model's error.
        self._up.last_words(proc)
        self._handshake.stub_exited(proc is self._current.proc, how)
        if self._current.stopping or self._launching or proc is not self._current.proc:
            # An unloaded or replaced stub, or one that died starting (its launcher reports
            # that): what it held comes back too.
            self._events.stub_gone(proc)
        else:
            self._died(proc, how)
        # After the workers heard of the death (``_died``): they read its last answers on
        # their own channels before they drop its arena.
        self._events.after_answers(proc, lambda: self._directory.unregister(proc))

    def _died(self, proc: StubChannel, how: str) -> None:
        self.health.last_exit = how
        # Triton's words first: log scrapers and its QA look for them.
        log.error(
            "Stub process '%s' is not healthy. Process %d died with %s", self._name, proc.pid, how
        )
        self._events.stub_died(proc, how)
        deaths = self._crashes.died()
        if deaths >= self._crashes.limit:
            self._give_up(proc, how, deaths)
        else:
            self._restart_task = asyncio.create_task(self._restart(proc))

    def _give_up(self, proc: StubChannel, how: str, deaths: int) -> None:
        self.health.failed = (
            f"instance '{self._name}' died {deaths} times within "
            f"{self._crashes.window:g}s (last: {how}); it is not restarted"
        )
        log.error("%s", self.health.failed)
        self._events.gave_up()
        self._restart_task = asyncio.create_task(self.discard(proc))

    async def _restart(self, dead: StubChannel) -> None:
        """Start a new stub until one comes up, waiting longer after each failure. Every kind
        of failure is retried: one that passes (file descriptors or memory exhausted for a
        moment) must not leave the model without an instance for good."""
        await self.discard(dead)
        delay, cap = self._spec.restart_backoff
        attempt = 0
        while not self._current.stopping:
            await asyncio.sleep(delay)
            self.health.restarts += 1
            attempt += 1
            reason = await self._relaunch()
            if reason is None:
                self._back_up()
                return
            delay = min(delay * 2, cap)
            self._still_down(attempt, reason, delay)

    async def _relaunch(self) -> str | None:
        """Start a stub; returns why that failed, or None."""
        try:
            await self.launch()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # one clause: compiled, a second would expect a LoadError
            return str(error) if isinstance(error, LoadError) else repr(error)
        return None

    def _still_down(self, attempt: int, reason: str, delay: float) -> None:
        self.health.down = (
            f"instance '{self._name}' has no live stub: restart {attempt} failed: "
            f"{reason}; retrying in {delay:g}s"
        )
        log.error("%s", self.health.down)
        self._events.health_changed()

    def _back_up(self) -> None:
        if self.health.down is not None:
            self.health.down = None
            self._events.health_changed()
        log.info("instance '%s' restarted (restart %d)", self._name, self.health.restarts)

    async def _finalize(self, proc: StubChannel, timeout: float) -> None:
        """Ask the model's ``finalize()``, then wait for the exit, within ``timeout``."""
        deadline = self._loop.time() + timeout
        self._handshake.expect_finalized()
        try:
            await asyncio.wait_for(self._handshake.finalize(proc), timeout)
        except (asyncio.TimeoutError, PeerGone):
            log.warning("instance '%s' did not finalize in %.1fs: killing it", self._name, timeout)
            proc.kill()
            return
        # It exits by itself, in what is left of the timeout (a moment at least).
        exit_within = max(_EXIT_GRACE, deadline - self._loop.time())
        try:
            await asyncio.wait_for(asyncio.shield(proc.exited), exit_within)
        except asyncio.TimeoutError:
            log.warning("instance '%s' did not exit after finalize: killing it", self._name)
            proc.kill()

    async def _wait_exit(self, proc: StubChannel) -> None:
        if not proc.spawned:
            return
        for action, grace in ((None, 2.0), (proc.terminate, 2.0), (proc.kill, 5.0)):
            if proc.exited.done():
                return
            if action is not None:
                action()
            try:
                await asyncio.wait_for(asyncio.shield(proc.exited), grace)
            except asyncio.TimeoutError:
                continue
