"""The batches inside an instance's stub: their slots, execute and queue timeouts, send-ahead.

A model with one instance behind the default scheduler has its next requests **sent ahead**
(``SEND_AHEAD``) while the current one executes: they wait in the stub's ring instead of the
scheduler's queue, so the stub goes from one request to the next without sleeping and neither
side rings a doorbell for it. The stub still runs one batch at a time (Triton's contract for a
sync execute); the execute timeout starts when a batch starts executing; the queue time runs
until the stub starts a batch; a request sent ahead that had not started when the stub died goes
back to the queue instead of failing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from shoal.core.errors import ShoalError, Unavailable
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.spec import ExecutionGrant, Flag, FreeInputs, InstanceScope
from shoal.supervisor.schedulers.dynamic import TIMEOUT_EXPIRED
from shoal.supervisor.work import Work

log = logging.getLogger("shoal")

#: How many batches a lone instance behind the default scheduler gets ahead of the one it runs.
#: Under load its ring then rarely runs dry, so the stub seldom sleeps and seldom needs ringing
#: for the next request: identity 64 B at c=8, 3 against 1 ahead: HTTP 7,243-8,191 -> 8,147-9,479
#: infer/s, gRPC 7,596-7,902 -> 7,939-8,579 (docs/perf.md).
SEND_AHEAD = 3


class Slots:
    """How many more batches the work loop may have at the stub (a counting semaphore).

    ``asyncio.Semaphore`` is interpreted Python, several calls for each acquire and release on
    every request; this one is compiled with the module and takes a free slot without a
    coroutine. One waiter at most: the instance's work loop.
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiter: asyncio.Future[None] | None = None
        #: Called once, at the next release (the direct hand-off waits for a slot so).
        self.on_free: Callable[[], None] | None = None

    def take(self) -> bool:
        """Take a slot if one is free."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def take_when_free(self) -> None:
        while not self.take():
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    def release(self) -> None:
        self._free += 1
        waiter, on_free, self.on_free = self._waiter, self.on_free, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if on_free is not None:
            on_free()


@dataclass(eq=False)
class InFlight:
    """A batch sent to the stub and not yet answered."""

    batch: list[Work]
    #: The slots the work loop took one of for this batch (each stub has its own).
    slots: Slots
    #: The execute timeout's timer, armed once the batch is executing.
    timer: asyncio.TimerHandle | None = None
    #: For a batch sent ahead: the timer of its requests' queue timeout, until it starts.
    queue_timer: asyncio.TimerHandle | None = None
    #: The rate limiter's grant this batch runs under, released when it is done.
    grant: ExecutionGrant | None = None

    def __init__(
        self, batch: list[Work], slots: Slots, grant: ExecutionGrant | None = None
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.batch = batch
        self.slots = slots
        self.timer = None
        self.queue_timer = None
        self.grant = grant

    def close(self) -> None:
        """Stop its timers, give its slot and its grant back; its requests left the stub."""
        for work in self.batch:
            work.left()
        if self.timer is not None:
            self.timer.cancel()
        if self.queue_timer is not None:
            self.queue_timer.cancel()
        self.slots.release()
        if self.grant is not None:
            self.grant.release()


class InFlightLedger:
    """The batches sent to the current stub and not yet answered, in the order they were sent."""

    def __init__(
        self, scope: InstanceScope, execute_timeout: float | None, send_ahead: bool
    ) -> None:
        self._name = scope.name
        self._outbox = scope.outbox
        self._loop = scope.loop
        #: None: no limit (a decoupled model answers as it goes).
        self._execute_timeout = execute_timeout
        self._send_ahead = send_ahead
        self._batches: dict[int, InFlight] = {}
        #: The last batch id given (a native int: no iterator call per batch).
        self._last_id = 0
        #: What the work loop takes one of before it sends a batch; batches the stub runs at
        #: once (more than 1: an async execute that asks for it).
        self.slots = Slots(1)
        self.limit = 1
        #: Set while no batch is inside the stub.
        self.idle = Flag(True)
        #: Called when the last batch inside the stub is answered.
        self.on_idle: Callable[[], None] | None = None
        #: Why the stub was killed for an execute over its timeout, until its exit is handled.
        self._hung: str | None = None
        #: Frontend workers send to the stub directly too (``direct_routes``): a batch sent
        #: may wait behind theirs, so its requests' queue timeouts run until it is answered.
        self.shared = False

    def configure(self, concurrency: int) -> None:
        """The stub is up and runs ``concurrency`` batches at once: size the slots."""
        self.limit = concurrency
        ahead = SEND_AHEAD if self._send_ahead and concurrency == 1 else 0
        self.slots = Slots(concurrency + ahead)

    def open(self, batch: list[Work], slots: Slots, grant: ExecutionGrant | None) -> int:
        """Record a batch about to be sent; returns its id."""
        self._last_id += 1
        batch_id = self._last_id
        self._batches[batch_id] = InFlight(batch, slots, grant=grant)
        self.idle.clear()
        return batch_id

    def sent(self, proc: StubChannel, batch_id: int) -> None:
        """A batch is in the stub's ring: a sync execute starts on it once the ones sent before
        it are answered; until then its requests' queue timeouts run."""
        entry = self._batches.get(batch_id)
        if entry is None:
            return
        if self.limit > 1 or next(iter(self._batches)) == batch_id:
            self._start_clock(proc, batch_id, entry)
            if self.shared:
                self._watch_queue_timeout(proc, entry)
        else:
            self._watch_queue_timeout(proc, entry)

    def done(self, proc: StubChannel, batch_id: int) -> InFlight | None:
        """Forget an answered or failed batch and give its slot back."""
        entry = self._batches.pop(batch_id, None)
        if entry is None:
            return None
        entry.close()
        if not self._batches:
            self.idle.set()
            if self.on_idle is not None:
                self.on_idle()
        elif self.limit == 1:  # the batch sent ahead starts now
            self._started(proc)
        return entry

    def fail_unsent(
        self, proc: StubChannel, batch_id: int, error: ShoalError, free: FreeInputs
    ) -> None:
        entry = self.done(proc, batch_id)
        if entry is not None:
            fail_batch(entry.batch, error, free)

    def abort(self) -> tuple[list[InFlight], list[InFlight]]:
        """The stub died: forget every batch. Returns those that had started and those sent
        ahead (a sync stub runs its batches in order: only the first had started)."""
        entries = list(self._batches.values())
        self._batches.clear()
        self.idle.set()
        for entry in entries:
            entry.close()
        if self.limit == 1:
            return entries[:1], entries[1:]
        return entries, []

    def take_hung(self) -> str | None:
        """Why the stub that died was killed (an execute over its timeout), once."""
        hung, self._hung = self._hung, None
        return hung

    def release_grants(self) -> None:
        """The instance stopped: the executions of batches still recorded are over, and their
        requests are out of the stub."""
        for entry in self._batches.values():
            if entry.grant is not None:
                entry.grant.release()
            for work in entry.batch:
                work.left()

    def _started(self, proc: StubChannel) -> None:
        head_id, head = next(iter(self._batches.items()))
        if head.queue_timer is not None and not self.shared:
            head.queue_timer.cancel()
            head.queue_timer = None
        self._start_clock(proc, head_id, head)

    def _watch_queue_timeout(self, proc: StubChannel, entry: InFlight) -> None:
        """A request sent ahead is still queued: its ``timeout`` expires at its deadline, as
        it would in the scheduler's queue, and the stub is told not to run it."""
        deadlines = [w.queue_deadline_ns for w in entry.batch if w.queue_deadline_ns]
        if not deadlines:
            return
        delay = max(0, min(deadlines) - time.monotonic_ns()) / 1e9
        entry.queue_timer = self._loop.call_later(delay, self._queue_timeout, proc, entry)

    def _queue_timeout(self, proc: StubChannel, entry: InFlight) -> None:
        entry.queue_timer = None
        now = time.monotonic_ns()
        expired = [w for w in entry.batch if w.queue_deadline_ns and w.queue_deadline_ns < now]
        for work in expired:
            if not work.future.done():
                work.future.set_exception(Unavailable(TIMEOUT_EXPIRED))
            work.on_cancel = None
        if expired:
            self._outbox.cancel(proc, [w.record.key for w in expired])
        if len(expired) < len(entry.batch):
            self._watch_queue_timeout(proc, entry)

    def _start_clock(self, proc: StubChannel, batch_id: int, entry: InFlight) -> None:
        """Arm the execute timeout of a batch that is executing now."""
        timeout = self._execute_timeout
        if timeout is None or entry.timer is not None:
            return
        entry.timer = self._loop.call_later(timeout, self._execute_timed_out, proc, batch_id)

    def _execute_timed_out(self, proc: StubChannel, batch_id: int) -> None:
        if batch_id not in self._batches or proc.returncode is not None:
            return
        timeout = self._execute_timeout
        log.error(
            "instance '%s': execute took longer than %.3gs: killing its stub", self._name, timeout
        )
        self._hung = f"execute did not finish within {timeout:g}s (execute_timeout_seconds)"
        proc.kill()  # its exit fails the batch with DeadlineExceeded


def fail_batch(
    batch: list[Work], error: ShoalError, free: FreeInputs, streamed: bool = False
) -> None:
    """Fail every request of a batch that will not be answered, and free its inputs.

    ``streamed`` (its stub died): a decoupled request is its stream's to end (``OpenStreams``):
    its inputs are freed once the responses it delivered (which may hand an input on) are
    released, and the error goes down its stream, not into a future nobody awaits (asyncio
    logged "Future exception was never retrieved" at each such death)."""
    for work in batch:
        if streamed and work.stream is not None:
            continue
        if work.input_blocks:
            blocks, work.input_blocks = work.input_blocks, []
            free(blocks)
        if not work.future.done():
            work.future.set_exception(error)
