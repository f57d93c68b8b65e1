"""Triton's sequence batcher: stateful models, one slot per live sequence.

``submit`` checks a request (batch size 1, a correlation id, START on a new sequence) and routes
it to its sequence's slot or the backlog (:class:`~._slots.SlotTable`); the strategy turns slots
into batches: ``direct`` (:class:`~._direct.DirectStrategy`, a fixed batch position per slot) or
``oldest`` (:class:`~._oldest.OldestStrategy`, a dynamic batcher per instance). Before a request
leaves its slot it gets its control tensors and implicit state
(:class:`~._controls.SequenceTensors`). A reaper timer releases sequences idle for
``max_sequence_idle_microseconds`` and fails backlogged sequences whose requests' ``timeout``
expired.

With ``iterative_sequence: true`` a request may come without a correlation id (it becomes a
sequence of its own) and the model may release a request with
``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: the request goes back to its slot (flags cleared, the
controls and state of its last run removed) and runs again; the sequence ends when the request is
done for good.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from shoal.config import ModelConfig
from shoal.core.errors import Cancelled, InvalidArgument, Rejected, ShoalError, Unavailable
from shoal.supervisor.schedulers._batching import BatchSettings, sequence_settings, shape_rules
from shoal.supervisor.schedulers._controls import FLAG_END, FLAG_START, SequenceTensors
from shoal.supervisor.schedulers._direct import DirectStrategy
from shoal.supervisor.schedulers._oldest import OldestStrategy
from shoal.supervisor.schedulers._slots import FORCE_END, Slot, SlotTable
from shoal.supervisor.schedulers.base import (
    Alarm,
    BatchSource,
    Clock,
    FreeWork,
    LoopClock,
    StageTensor,
    Waker,
    fail_work,
)
from shoal.supervisor.work import Work

log = logging.getLogger("shoal")

BACKLOG_EXPIRED = "timeout of the corresponding sequence has been expired"


class SequenceBatcher:
    """Routes the requests of each sequence to one slot of one instance."""

    def __init__(
        self,
        config: ModelConfig,
        instances: int,
        free_work: FreeWork,
        stage_tensor: StageTensor,
        clock: Clock | None = None,
    ) -> None:
        batching = sequence_settings(config)
        self.model = config.name
        self.free_work = free_work
        self.clock = clock or LoopClock()
        self.tensors = SequenceTensors(config, stage_tensor)
        self.waker = Waker()
        self._closed = False
        self._idle_ns = batching.max_sequence_idle_microseconds * 1000
        self._reaper = Alarm(self.clock, self._reap)
        self._empty = asyncio.Event()
        self._empty.set()
        self.table, self._strategy = self._strategy_for(config, instances)
        self._iterative = batching.iterative_sequence
        # Correlation ids for iterative requests that came without one (far from clients' ids).
        self._ids = itertools.count(1 << 62)

    def _strategy_for(
        self, config: ModelConfig, instances: int
    ) -> tuple[SlotTable, DirectStrategy | OldestStrategy]:
        batching = sequence_settings(config)
        max_batch = max(1, config.max_batch_size)
        settings = BatchSettings(
            max_batch_size=max_batch,
            preferred_batch_sizes=frozenset(batching.preferred_batch_sizes),
            max_queue_delay_ns=batching.max_queue_delay_microseconds * 1000,
            preserve_ordering=batching.preserve_ordering,
            **shape_rules(config),
        )
        if batching.strategy == "oldest":
            table = SlotTable(instances, batching.max_candidate_sequences or max_batch)
            return table, OldestStrategy(self, instances, settings)
        direct = DirectStrategy(
            self,
            instances,
            settings,
            settings.max_queue_delay_ns,
            batching.minimum_slot_utilization,
            decoupled=config.decoupled,
        )
        return SlotTable(instances, max_batch), direct

    # -- Scheduler --------------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        if self._iterative and work.reschedule is None:
            self._adopt(work)
        error = self._check(work)
        if error is not None:
            fail_work(work, error, self.free_work)
            return
        corr = work.record.correlation_id
        if work.record.flags & FLAG_START and self.table.known(corr):
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end "
                "before this sequence start. Previous sequence will be terminated early.",
                corr,
                self.model,
            )
        now = self.clock.now_ns()
        work.tag = now  # arrival time, for the direct strategy's queue delay
        slot = self.table.route(work, corr, bool(work.record.flags & FLAG_END), now)
        self._arm_reaper(now + self._idle_ns)
        if work.record.timeout_us and slot is None:
            self._arm_reaper(now + work.record.timeout_us * 1000 + 1)
        if slot is not None:
            self._strategy.enqueued(slot)
        self.changed()

    def source(self, instance: int) -> BatchSource:
        return self._strategy.source(instance)

    @property
    def pending(self) -> int:
        return self.table.pending + self._strategy.pending

    # -- an in-place instance update --------------------------------------------------------

    def add_instance(self) -> int:
        """Slots and a source for one more instance, given no sequence until
        :meth:`open_instance`; its number (``source``)."""
        self._strategy.add_instance()
        return self.table.add_instance()

    def open_instance(self, instance: int) -> None:
        """The added ``instance`` runs: sequences may start on it."""
        for slot in self.table.open(instance, self.clock.now_ns()):  # backlogged sequences
            self._strategy.enqueued(slot)
        self.changed()

    def retire_instance(self, instance: int) -> None:
        """Start no sequence on ``instance`` any more (:meth:`released` tells when it may
        stop). Triton keeps such an instance for as long as its sequences last."""
        self.table.retire(instance)

    async def released(self, instance: int) -> None:
        """Return once the sequences ``instance`` holds have ended and their requests have
        left for it (or the batcher closed)."""
        while not self._closed and (self.table.holds(instance) or self._strategy.holds(instance)):
            await self.waker.wait()

    async def wait_empty(self) -> None:
        while True:
            if self.table.pending == 0:
                await self._strategy.wait_empty()
            if self.pending == 0:
                return
            await self.waker.wait()

    def take_queued(self) -> list[Work]:
        """Nothing: a request of a sequence waits for its slot's instance to come back, since
        failing it would break the sequence's state."""
        return []

    def close(self) -> list[Work]:
        self._closed = True
        self._reaper.cancel()
        left = self.table.drain() + self._strategy.close()
        self.changed()
        return left

    # -- iterative sequences ----------------------------------------------------------------

    def _adopt(self, work: Work) -> None:
        """Make an iterative request reschedulable (and a sequence of its own without an id)."""
        record = work.record
        corr = record.correlation_id
        ends = True
        if isinstance(corr, bool) or corr in (0, ""):
            record.correlation_id = next(self._ids)
            record.flags = FLAG_START
        else:
            ends = bool(record.flags & FLAG_END)
            record.flags &= ~FLAG_END  # the sequence ends when the request is done for good
        # Each iteration must see the inputs as the client sent them: no writes in place.
        record.private_inputs = 0
        work.iteration = (
            list(record.inputs),
            len(work.input_blocks),
            list(record.requested_outputs),
            ends,
        )
        work.reschedule = self._rescheduled

    def _rescheduled(self, work: Work, again: bool) -> None:
        original = work.iteration
        if original is None:
            return
        inputs, blocks, outputs, ends = original
        if again:
            extra, work.input_blocks = work.input_blocks[blocks:], work.input_blocks[:blocks]
            self.free_work(Work(work.record, extra, work.future))  # last run's controls, state
            work.record.inputs = list(inputs)
            work.record.requested_outputs = list(outputs)
            work.record.flags = 0
            work.on_complete = None
            slot = self.table.assigned.get(work.record.correlation_id)
            if slot is not None:
                slot.in_flight = False  # its request is back: the oldest strategy may issue it
            self.submit(work)
            return
        work.iteration = None
        corr = work.record.correlation_id
        slot = self.table.assigned.get(corr)
        if ends and slot is not None:
            del self.table.assigned[corr]
            self.table.last_seen.pop(corr, None)
            slot.queue.append(FORCE_END)
            self._strategy.enqueued(slot)
            self.changed()

    # -- for the strategies -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def prepare(self, work: Work, slot: Slot) -> bool:
        try:
            self.tensors.add_controls(work)
            self.tensors.add_state(work, slot.state)
        except ShoalError as error:
            fail_work(work, error, self.free_work)
            return False
        return True

    def release(self, slot: Slot) -> None:
        now = self.clock.now_ns()
        self.table.release(slot, now)
        self._arm_reaper(now + self._idle_ns)

    def cancel_sequence(self, slot: Slot, cancelled: Work) -> None:
        # As Triton: a cancelled request cancels its sequence; the requests queued behind it
        # answer CANCELLED and the slot goes to the next sequence (a later request of this one
        # needs START again).
        corr = cancelled.record.correlation_id
        self.free_work(cancelled)
        while slot.queue:
            work = slot.queue[0]
            if not isinstance(work, Work):
                break
            slot.queue.popleft()
            if work.abandoned:
                self.free_work(work)
                continue
            error = Cancelled(
                f"inference request for sequence {corr} to model '{self.model}' was cancelled: "
                "an earlier request of its sequence was cancelled"
            )
            fail_work(work, error, self.free_work)
        if self.table.assigned.get(corr) is slot:
            del self.table.assigned[corr]
            self.table.last_seen.pop(corr, None)
        if not slot.queue:  # else the force-end queued next releases it
            self.release(slot)

    def changed(self) -> None:
        if self.pending:
            self._empty.clear()
        else:
            self._empty.set()
        self.waker.notify()

    # -- steps ------------------------------------------------------------------------------

    def _check(self, work: Work) -> ShoalError | None:
        record = work.record
        corr = record.correlation_id
        if self._closed:
            return Unavailable("the model is unloading")
        mismatch = self.tensors.corrid_mismatch(corr, self.model)  # Triton checks it first
        if mismatch is not None:
            return InvalidArgument(mismatch)
        if work.batch_size > 1:
            return InvalidArgument(
                f"inference request to model '{self.model}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        if isinstance(corr, bool) or corr in (0, ""):
            return InvalidArgument(
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID"
            )
        if not record.flags & FLAG_START and not self.table.known(corr):
            return InvalidArgument(
                f"inference request for sequence {corr} to model '{self.model}' must specify "
                "the START flag on the first request of the sequence"
            )
        return None

    def _arm_reaper(self, when_ns: int) -> None:
        current = self._reaper.when_ns
        if current is None or when_ns < current:
            self._reaper.arm(when_ns)

    def _reap(self) -> None:
        ended, expired, wake = self.table.reap(self.clock.now_ns(), self._idle_ns)
        for work in expired:
            fail_work(work, Rejected(BACKLOG_EXPIRED), self.free_work)
        for slot in ended:
            self._strategy.enqueued(slot)
        if not self._closed:
            self._reaper.arm(wake)
        self.changed()
