"""What an instance sends its stub: batches pulled from its scheduler while the stub is ready
(or handed to it directly: ``handoff``), and warmup batches run at once."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from shoal.core.errors import InternalError, ShoalError, Unavailable
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.queue import PeerGone
from shoal.ipc.tensor import CudaLocation, Location
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.decoupled import OpenStreams
from shoal.supervisor.instances.handoff import Handoff
from shoal.supervisor.instances.ledger import InFlightLedger, Slots
from shoal.supervisor.instances.outbox import CancelHook
from shoal.supervisor.instances.spec import (
    BatchSource,
    ExecutionGrant,
    InstanceScope,
    RateLimitGate,
)
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.work import Completion, Work

log = logging.getLogger("shoal")

#: Request keys, unique across instances: a rescheduled request keeps its key (and its open
#: response stream) wherever it runs next.
_request_keys = itertools.count(1)

Grant = ExecutionGrant | None


class Feeder:
    """Sends batches to the current stub, as many at once as the ledger has slots for: one at a
    time (Triton's contract for a sync execute; SEND_AHEAD more sent ahead where allowed), or
    several for an async execute. A slot is given back when its batch is answered or failed."""

    def __init__(
        self,
        scope: InstanceScope,
        ledger: InFlightLedger,
        streams: OpenStreams,
        rate_limit: RateLimitGate | None,
        decoupled: bool,
    ) -> None:
        self._name = scope.name
        self._current = scope.current
        self._outbox = scope.outbox
        self._directory = scope.directory
        self._free_inputs = scope.free_inputs
        self._loop = scope.loop
        self._ledger = ledger
        self._streams = streams
        #: Under ``--rate-limit execution_count`` each batch waits for a grant before it is sent.
        self._rate_limit = rate_limit
        self._decoupled = decoupled
        #: The scheduler the work loop pulls from, once it runs.
        self.source: BatchSource | None = None
        #: The loop's direct hand-off, once it runs (where the scheduler parks instances).
        self.handoff: Handoff | None = None

    async def work_loop(self, source: BatchSource) -> None:
        self.source = source
        current = self._current
        handoff = self.handoff = self._handoff(source)
        while not current.stopping:
            if not current.ready.is_set():
                await current.ready.wait()
            slots = self._ledger.slots
            if not slots.take():
                await slots.take_when_free()
            if handoff is not None:
                handed = await handoff.wait(slots)
                if not isinstance(handed, list):
                    if handed is not None:  # an Execute that found the stub's ring full
                        await self.finish_send(handed[0], handed[1], handed[2])
                    continue
                batch = handed
            else:
                batch = await _next_batch(source, slots)
            grant = None if self._rate_limit is None else await self._grant(slots, source, batch)
            proc = current.proc
            if current.stopping or proc is None or not current.ready.is_set():
                _put_back(slots, grant, source, batch)
                continue
            await self.send_batch(proc, batch, slots, grant)

    async def run_now(self, batch: list[Work]) -> list[Completion]:
        """Run ``batch`` at once, outside any scheduler (warmup), and return its completions
        (every response, for a decoupled model). The instance owns the inputs from here, as for
        any batch; the caller releases the completions. Raises the batch's error (the stub
        died, a decoupled model's error response)."""
        proc = self._current.proc
        if proc is None or not self._current.ready.is_set():
            raise Unavailable(f"instance '{self._name}' is not ready")
        if self._decoupled:
            for work in batch:
                work.stream = asyncio.Queue()
        slots = self._ledger.slots
        await slots.take_when_free()
        await self.send_batch(proc, batch, slots)
        return await _collect(batch)

    def _handoff(self, source: BatchSource) -> Handoff | None:
        """The direct hand-off where the scheduler parks instances (not under the rate limiter:
        its grant is for an execution that starts now)."""
        if self._rate_limit is not None or not isinstance(source, DefaultScheduler):
            return None
        return Handoff(source, self, self._ledger, self._current, self._loop)

    async def send_batch(
        self, proc: StubChannel, batch: list[Work], slots: Slots, grant: Grant = None
    ) -> None:
        opened = self.open_batch(proc, batch, slots, grant)
        if opened is not None:
            await self.finish_send(proc, opened[0], opened[1])

    def open_batch(
        self, proc: StubChannel, batch: list[Work], slots: Slots, grant: Grant = None
    ) -> tuple[int, msg.Execute] | None:
        """Record ``batch`` in the ledger on one of ``slots`` and give the stub the memory its
        inputs lie in; its Execute, or None when it failed (or the stub is gone)."""
        batch_id = self._ledger.open(batch, slots, grant)
        self._stamp(proc, batch)
        try:
            locations = _locations(batch)
            if locations:  # (small inputs travel inline: nothing to forward, no call for it)
                proc.forward(locations, self._directory)
            return batch_id, msg.Execute(batch_id, [w.record for w in batch])
        except PeerGone:
            return None  # its exit fails the batch
        except Exception as error:  # one clause: compiled, a second would expect a ShoalError
            self._unsent(proc, batch_id, error)
            return None

    async def finish_send(self, proc: StubChannel, batch_id: int, message: msg.Execute) -> None:
        """Send an opened batch's Execute, waiting for room in the stub's ring."""
        try:
            await proc.send_async(message)
        except PeerGone:
            return  # its exit fails the batch
        except Exception as error:  # one clause: compiled, a second would expect a ShoalError
            self._unsent(proc, batch_id, error)
            return
        self._ledger.sent(proc, batch_id)

    def send_now(self, proc: StubChannel, batch_id: int, message: msg.Execute) -> bool:
        """Send an opened batch's Execute if the stub's ring has room; False: it has none
        (``finish_send`` then)."""
        try:
            if not proc.send(message):
                return False
        except PeerGone:
            return True  # its exit fails the batch
        except Exception as error:  # one clause: compiled, a second would expect a ShoalError
            self._unsent(proc, batch_id, error)
            return True
        self._ledger.sent(proc, batch_id)
        return True

    def _unsent(self, proc: StubChannel, batch_id: int, error: Exception) -> None:
        """Fail a batch that could not be sent: a tensor's arena is gone (its stub died), or a
        bug, which must fail the batch, not stop the work loop."""
        failure = error if isinstance(error, ShoalError) else None
        if failure is None:
            log.error("[%s] could not send a batch", self._name, exc_info=error)
            failure = InternalError(f"instance '{self._name}': {error!r}")
        self._ledger.fail_unsent(proc, batch_id, failure, self._free_inputs)

    def _stamp(self, proc: StubChannel, batch: list[Work]) -> None:
        """Mark a batch's requests dispatched to ``proc``, with their keys and cancel hooks."""
        now = time.monotonic_ns()
        for work in batch:
            work.dispatched_ns = now
            work.inside = True
            if not work.record.key:
                work.record.key = next(_request_keys)
            work.on_cancel = CancelHook(self._outbox, proc, work.record.key)
            if work.stream is not None:
                self._streams.open(work)

    async def _grant(self, slots: Slots, source: BatchSource, batch: list[Work]) -> ExecutionGrant:
        """The rate limiter's grant for ``batch``; cancelled, the batch goes back."""
        assert self._rate_limit is not None
        try:
            return await self._rate_limit.acquire()
        except BaseException:
            slots.release()
            source.requeue(batch)
            raise


def _locations(batch: list[Work]) -> list[Location]:
    """Where the inputs of ``batch`` lie that the stub may have to be given (blocks and CUDA
    pool chunks: not the bytes an Execute carries, nor a client's region, mapped by name); a
    relayed request's are the blocks its work owns (its record's inputs are packed:
    ``RequestRecord.packed``)."""
    locations: list[Location] = []
    for work in batch:
        if work.record.packed is None:
            for tensor in work.record.inputs:
                location = tensor.location
                if type(location) is Block or type(location) is CudaLocation:
                    locations.append(location)
        else:
            locations.extend(work.input_blocks)
    return locations


async def _next_batch(source: BatchSource, slots: Slots) -> list[Work]:
    """The source's next batch, for which a slot of ``slots`` is held (given back if none)."""
    try:
        return await source.next_batch()
    except BaseException:
        slots.release()
        raise


def _put_back(slots: Slots, grant: Grant, source: BatchSource, batch: list[Work]) -> None:
    """The stub went away while a batch was being pulled: it waits for the next one."""
    slots.release()
    if grant is not None:
        grant.release()
    source.requeue(batch)


async def _collect(batch: list[Work]) -> list[Completion]:
    """Every completion of a batch run at once; raises the first error once all are in."""
    completions: list[Completion] = []
    failures: list[BaseException] = []
    for work in batch:
        if work.stream is not None:
            await _collect_stream(work.stream, completions, failures)
            continue
        try:
            completions.append(await work.awaited())
        except ShoalError as error:
            failures.append(error)
    if failures:
        for completion in completions:
            completion.release()
        raise failures[0]
    return completions


async def _collect_stream(
    stream: asyncio.Queue[Completion | BaseException | None],
    completions: list[Completion],
    failures: list[BaseException],
) -> None:
    """A decoupled request's responses, to its final one."""
    while (item := await stream.get()) is not None:
        if isinstance(item, BaseException):
            failures.append(item)
        else:
            completions.append(item)
