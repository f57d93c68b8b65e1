"""What an instance is started from and what it is connected to: its spec, its load error, the
stub it runs now, and the Protocols of the parts the model loader hands it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.outbox import Outbox
from shoal.supervisor.instances.process import StubLaunch
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.work import Work

#: Gives input-arena blocks back.
FreeInputs = Callable[[list[Block]], None]


class LoadError(Exception):
    """The stub could not start or the model's ``initialize`` raised; the text says why in one
    line, fit for clients; ``traceback`` is the model's traceback, for the log ("" if none)."""

    def __init__(self, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


@dataclass(frozen=True)
class InstanceSpec:
    """Everything needed to (re)start one instance."""

    model_name: str
    instance_name: str
    init_args: dict[str, str]
    model_file: str
    launch: StubLaunch
    output_arena: tuple[int, int, int]
    #: A Python-based backend's ``model.py``, run instead of ``model_file``; "" for none.
    runtime_file: str = ""
    restart_backoff: tuple[float, float] = (0.1, 5.0)
    #: Batches in one stub at once when the model's execute is ``async def``.
    async_concurrency: int = 1
    #: Seconds one execute may take before the stub is killed and restarted (None: no limit).
    execute_timeout: float | None = None
    #: This many deaths within ``crash_window`` seconds: stop restarting (a crash loop).
    crash_limit: int = 5
    crash_window: float = 60.0


class Flag:
    """A flag and a wait for it to be set: ``asyncio.Event``'s methods, compiled.

    An Event here is interpreted Python, asked on every request (``is_set``) and cleared and
    set on every batch; this keeps a future only while someone waits.
    """

    def __init__(self, value: bool = False) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        self._value = True
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> None:
        if self._value:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:  # cancelled before the flag was set
                self._waiters.remove(waiter)


class CurrentStub:
    """The stub an instance runs now: its lifecycle sets it, every other part reads it."""

    def __init__(self) -> None:
        #: None between a death and the next start, and after the stop.
        self.proc: StubChannel | None = None
        #: Set while ``proc`` is up and past ``initialize``.
        self.ready = Flag()
        #: The instance is being unloaded: nothing restarts, nothing more is sent.
        self.stopping = False


@dataclass(frozen=True)
class InstanceScope:
    """What every part of one instance is built with."""

    name: str
    directory: SegmentDirectory
    free_inputs: FreeInputs
    current: CurrentStub = field(default_factory=CurrentStub)
    #: Messages to the stub that nobody waits for.
    outbox: Outbox = field(default_factory=Outbox)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)


class Caller(Protocol):
    """The instance whose stub makes a BLS or control call."""

    @property
    def name(self) -> str: ...

    def call_began(self, proc: StubChannel) -> None:
        """``proc`` waits on a BLS call from here until ``call_ended``."""
        ...

    def call_ended(self, proc: StubChannel) -> None: ...


class BlsHandler(Protocol):
    """Serves the BLS calls a stub makes (the supervisor's BLS router)."""

    def handle(self, caller: Caller, proc: StubChannel, call: msg.BlsCall) -> None: ...

    def done(self, proc: StubChannel, call_id: int) -> None: ...

    def cancel(self, proc: StubChannel, call_id: int) -> None: ...

    def forget_process(self, proc: StubChannel) -> None: ...


class ControlHandler(Protocol):
    """Answers a stub's model-control and custom-metric calls."""

    def handle(self, caller: Caller, proc: StubChannel, call: msg.ControlCall) -> None: ...

    def forget_process(self, proc: StubChannel) -> None: ...


class ExecutionGrant(Protocol):
    """The rate limiter's grant of one execution; ``release`` (idempotent) frees it."""

    def release(self) -> None: ...


class RateLimitGate(Protocol):
    """This instance's place in the rate limiter (``--rate-limit execution_count``)."""

    async def acquire(self) -> ExecutionGrant: ...


class BatchSource(Protocol):
    """What an instance pulls work from (a scheduler)."""

    async def next_batch(self) -> list[Work]: ...

    def requeue(self, batch: list[Work]) -> None: ...
