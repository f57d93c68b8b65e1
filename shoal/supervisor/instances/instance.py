"""A model instance: one stub process at a time, restarted with back-off when it dies.

The instance pulls work from its scheduler only while its stub is ready, so queued requests wait
for the other instances or for the restart; requests already inside a dead stub fail with
UNAVAILABLE naming the instance and how it died.

``StubInstance`` composes the parts, each in its own module: the stub's lifecycle
(``lifecycle``), what is sent to it (``feeder``) and the batches in it (``ledger``), its
messages up (``dispatch``), its replies to lifecycle calls (``handshake``), the completions made
of its answers (``answers``, decoupled streams in ``decoupled``) and where their blocks go back
(``outputs``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shoal.core.errors import DeadlineExceeded, ShoalError, Unavailable
from shoal.ipc.arena import Block, Segment
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.answers import Answers
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.decoupled import OpenStreams
from shoal.supervisor.instances.dispatch import UpMessages
from shoal.supervisor.instances.feeder import Feeder
from shoal.supervisor.instances.handshake import USER_READY_TIMEOUT_S, Handshake
from shoal.supervisor.instances.ledger import SEND_AHEAD, InFlightLedger, fail_batch
from shoal.supervisor.instances.lifecycle import MakeStub, StubLifecycle
from shoal.supervisor.instances.outputs import StubOutputs
from shoal.supervisor.instances.process import StubProcess
from shoal.supervisor.instances.spec import (
    BatchSource,
    BlsHandler,
    ControlHandler,
    FreeInputs,
    InstanceScope,
    InstanceSpec,
    LoadError,
    RateLimitGate,
)
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.work import Completion, Work

__all__ = [
    "SEND_AHEAD",
    "BlsHandler",
    "ControlHandler",
    "InstanceLinks",
    "InstanceSpec",
    "LoadError",
    "MakeStub",
    "StubInstance",
]


@dataclass(frozen=True)
class InstanceLinks:
    """What the model loader connects an instance to, and how the instance runs its model."""

    #: The segments stubs map (the input arena among them), and how input blocks go back.
    directory: SegmentDirectory
    free_inputs: FreeInputs
    #: The model version's statistics.
    stats: StatsRecorder
    #: Starts a stub: a process, or the loopback kind in unit tests.
    make_stub: MakeStub = StubProcess
    #: Route the BLS, model-control and custom-metric calls the model makes.
    bls: BlsHandler | None = None
    control: ControlHandler | None = None
    #: A decoupled model answers as it goes: the execute timeout does not apply to it.
    decoupled: bool = False
    #: Send the next batches while the current one executes (a lone instance behind the default
    #: scheduler, not under the rate limiter: its grant is for an execution that starts now).
    send_ahead: bool = False
    #: The instance's place in the rate limiter (``--rate-limit execution_count``).
    rate_limit: RateLimitGate | None = None
    #: Told when the instance gives up restarting (the loader marks the model unavailable).
    on_failed: Callable[[StubInstance], None] | None = None
    #: Told when a restart fails and when one succeeds (the loader updates the model's readiness
    #: and fails its queued requests while no instance is live).
    on_health: Callable[[StubInstance], None] | None = None


class StubInstance:
    """Runs batches on its current stub process and restarts it when it dies."""

    def __init__(self, spec: InstanceSpec, links: InstanceLinks) -> None:
        self.spec, self.stats, self.name = spec, links.stats, spec.instance_name
        self._links = links
        scope = InstanceScope(self.name, links.directory, links.free_inputs)
        self._current = scope.current
        timeout = None if links.decoupled else spec.execute_timeout
        self._ledger = InFlightLedger(scope, timeout, links.send_ahead)
        self._streams = OpenStreams(links.free_inputs)
        self._outputs = StubOutputs(scope, None if links.decoupled else self._ledger)
        self._ledger.on_idle = self._outputs.settle
        self._answers = Answers(scope, self._ledger, self._streams, self._outputs, links.stats)
        self._handshake = Handshake(scope)
        self._feeder = Feeder(scope, self._ledger, self._streams, links.rate_limit, links.decoupled)
        calls = (links.bls, links.control)
        up = UpMessages(
            scope, self, calls, self._answers, self._handshake, self._ledger, spec.async_concurrency
        )
        self._lifecycle = StubLifecycle(scope, spec, links.make_stub, (self._handshake, up, self))
        self._worker: asyncio.Task[None] | None = None
        self._on_died: Callable[[int, ShoalError], None] | None = None
        #: Its number in its version's scheduler (``Scheduler.source``).
        self.source_index = 0
        #: The BLS calls its stub (of pid ``_calling_pid``) waits on.
        self._calls_open = 0
        self._calling_pid = 0

    # -- state ------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._current.ready.is_set()

    @property
    def busy(self) -> bool:
        """A batch is inside the stub, or it waits on a BLS call."""
        return not self._ledger.idle.is_set() or self._calls_open > 0

    def call_began(self, proc: StubChannel) -> None:
        """Its stub ``proc`` waits on a BLS call. While it waits on any, an instance whose stub
        frontend workers also send to is held out of its scheduler: the core cannot tell
        whether a request of a worker runs there, and handing it a call made from that request
        (a model calling itself) would leave it waiting for itself."""
        if proc.pid != self._calling_pid:  # a new stub: its predecessor's calls are over
            self._calling_pid, self._calls_open = proc.pid, 0
        self._calls_open += 1
        handoff = self._feeder.handoff
        if self._calls_open == 1 and self._ledger.shared and handoff is not None:
            handoff.hold_out()

    def call_ended(self, proc: StubChannel) -> None:
        """A BLS call of ``proc`` is answered (or the stub is gone)."""
        if proc.pid != self._calling_pid or self._calls_open == 0:
            return
        self._calls_open -= 1
        if self._calls_open == 0:
            self._calls_over()

    def _calls_over(self) -> None:
        """No call of its stub is open: the instance takes requests again (if held out)."""
        handoff = self._feeder.handoff
        if handoff is not None:
            handoff.let_in()

    async def wait_idle(self) -> None:
        """Return once no batch is inside the stub."""
        await self._ledger.idle.wait()

    def share_with_workers(self, on_died: Callable[[int, ShoalError], None]) -> None:
        """Frontend workers send to its stub directly from now on (``direct_routes``): the
        batches the core sends may wait behind theirs in the stub, and ``on_died(pid,
        error)`` tells them why a stub of it died."""
        self._ledger.shared = True
        self._on_died = on_died

    @property
    def process(self) -> StubChannel | None:
        """Its current stub (None before the first spawn)."""
        return self._current.proc

    @property
    def pid(self) -> int:
        proc = self._current.proc
        return proc.pid if proc is not None else -1

    @property
    def restarts(self) -> int:
        return self._lifecycle.health.restarts

    @property
    def last_exit(self) -> str:
        """How the last stub died ("" before any death)."""
        return self._lifecycle.health.last_exit

    @property
    def failed(self) -> str | None:
        """Why the instance gave up restarting (a crash loop), or None."""
        return self._lifecycle.health.failed

    @property
    def down(self) -> str | None:
        """Why the instance has no live stub after a failed restart, or None."""
        return self._lifecycle.health.down

    @property
    def user_ready(self) -> bool:
        """The model defines ``is_ready()``."""
        return self._handshake.user_ready

    # -- start and run ----------------------------------------------------------------------

    async def start(
        self,
        source: BatchSource,
        warm_up: Callable[[StubInstance], Awaitable[None]] | None = None,
    ) -> None:
        """Spawn the stub and wait for ``initialize``, run ``warm_up`` on it (model_warmup), then
        pull work from ``source``; raises LoadError with the reason."""
        await self._lifecycle.launch()
        if warm_up is not None:
            self._answers.warming = True
            try:
                await warm_up(self)
            except ShoalError as error:
                raise LoadError(str(error)) from None
            finally:
                self._answers.warming = False
        self._worker = asyncio.create_task(
            self._feeder.work_loop(source), name=f"worker {self.name}"
        )

    async def ask_is_ready(self, timeout: float = USER_READY_TIMEOUT_S) -> bool:
        """What the model's ``is_ready()`` says (False when it raised, answered no bool, or
        did not answer within ``timeout``)."""
        return await self._handshake.is_ready(timeout)

    async def run_now(self, batch: list[Work]) -> list[Completion]:
        """Run ``batch`` on this instance at once, outside any scheduler (warmup): see
        ``Feeder.run_now``."""
        return await self._feeder.run_now(batch)

    def announce_segment(self, segment: Segment) -> None:
        """A new input-arena segment exists: the live stub must be able to map it."""
        proc = self._current.proc
        if proc is not None and proc.returncode is None:
            try:
                proc.announce(segment)
            except OSError:
                pass  # the stub is dying; its exit is handled on its pidfd

    async def stop(self, timeout: float) -> None:
        """finalize() and the stub's exit within ``timeout``, else SIGKILL; releases everything."""
        if self._worker is not None:
            self._worker.cancel()
        await self._lifecycle.stop(timeout)
        self._ledger.release_grants()

    async def retire(self, timeout: float) -> None:
        """Leave the scheduler, let the batches in the stub finish (within ``timeout``), then
        :meth:`stop`: an instance an in-place update removes fails none of its requests. A
        batch its work loop held but had not sent goes back to the scheduler (``Handoff``)."""
        worker = self._worker
        if worker is not None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        try:
            await asyncio.wait_for(self._ledger.idle.wait(), timeout)
        except asyncio.TimeoutError:
            pass  # what is still running fails with the stub's exit, as in an unload
        await self.stop(timeout)

    # -- the completions' blocks (a work.OutputOwner) ----------------------------------------

    def output_view(self, proc: StubChannel, block: Block | CudaLocation) -> memoryview:
        return self._outputs.output_view(proc, block)

    def release_outputs(self, proc: StubChannel, blocks: list[Block]) -> None:
        self._outputs.release_outputs(proc, blocks)

    def release_cuda(self, locations: list[CudaLocation]) -> None:
        self._outputs.release_cuda(locations)

    # -- its stub's exits (lifecycle.StubEvents) ---------------------------------------------

    def stub_died(self, proc: StubChannel, how: str) -> None:
        error = self._death_error(how)
        if self._on_died is not None:
            self._on_died(proc.pid, error)
        started, ahead = self._ledger.abort()
        source = self._feeder.source
        if source is None:  # no work loop yet (warmup): nothing to go back to
            started, ahead = started + ahead, []
        for entry in reversed(ahead):  # sent ahead, never started: back to the queue
            for work in entry.batch:
                self._streams.pop(work.record.key)
                work.on_cancel = None
            assert source is not None
            source.requeue(entry.batch)
        for entry in started:  # (its last answers were delivered: these had none)
            fail_batch(entry.batch, error, self._links.free_inputs, streamed=True)
        self._streams.fail_all(error)
        self.stub_gone(proc)
        self._outputs.forget()

    def stub_gone(self, proc: StubChannel) -> None:
        """Give back what a stub that exited held: the BLS responses it kept, its open calls,
        its custom metrics, the CUDA pool blocks lent to it."""
        if self._links.bls is not None:
            self._links.bls.forget_process(proc)
        if self._links.control is not None:
            self._links.control.forget_process(proc)
        self._links.directory.cuda.forget_process(proc.pid)
        if proc.pid == self._calling_pid and self._calls_open > 0:
            self._calls_open = 0  # its calls are over with it
            self._calls_over()

    def after_answers(self, proc: StubChannel, then: Callable[[], None]) -> None:
        self._outputs.after_answers(proc, then)

    def gave_up(self) -> None:
        if self._links.on_failed is not None:
            self._links.on_failed(self)

    def health_changed(self) -> None:
        if self._links.on_health is not None:
            self._links.on_health(self)

    def _death_error(self, how: str) -> ShoalError:
        hung = self._ledger.take_hung()
        if hung is not None:
            return DeadlineExceeded(
                f"instance '{self.name}': {hung}; its stub was killed and restarts"
            )
        return Unavailable(f"Stub process '{self.name}' is not healthy. It died with {how}")
