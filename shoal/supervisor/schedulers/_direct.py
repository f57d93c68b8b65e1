"""The sequence batcher's ``direct`` strategy: each slot is a fixed position in its instance's
batch.

A batch holds, for slots ``0..n`` (``n`` the highest slot with a waiting request), the next
request of each slot, and a *null request* for each slot that has none: a request with the
representative's input shapes filled with zeros, every control false (READY false, CORRID 0) and a
dummy state, whose response is thrown away. Batch position ``i`` is always slot ``i``, as in
Triton, so a model may keep per-slot state. With ``max_queue_delay_microseconds`` and
``minimum_slot_utilization`` set, a batch waits until enough slots are ready or the oldest
request has waited the delay.
"""

from __future__ import annotations

import asyncio
import collections
import functools

from shoal.core.errors import ShoalError
from shoal.ipc.arena import Block
from shoal.ipc.dtypes import byte_size, element_count
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.instances.decoupled import new_stream
from shoal.supervisor.schedulers._batching import BatchSettings, shape_key
from shoal.supervisor.schedulers._controls import FLAG_END
from shoal.supervisor.schedulers._slots import ForceEnd, SequenceCore, Slot, when_done
from shoal.supervisor.schedulers.base import Alarm, BatchSource, fail_work
from shoal.supervisor.work import Completion, Work


class DirectStrategy:
    """Forms each instance's batches from its slots."""

    def __init__(
        self,
        core: SequenceCore,
        instances: int,
        settings: BatchSettings,
        delay_ns: int,
        min_utilization: float,
        *,
        decoupled: bool = False,
    ) -> None:
        self._core = core
        self._decoupled = decoupled
        self._settings = settings
        self._delay_ns = delay_ns
        self._min_utilization = min_utilization
        self._held: list[collections.deque[list[Work]]] = [
            collections.deque() for _ in range(instances)
        ]
        self._alarms = [Alarm(core.clock, core.waker.notify) for _ in range(instances)]
        self._sources = [_DirectSource(self, i) for i in range(instances)]

    def source(self, instance: int) -> BatchSource:
        return self._sources[instance]

    def add_instance(self) -> None:
        instance = len(self._sources)
        self._held.append(collections.deque())
        self._alarms.append(Alarm(self._core.clock, self._core.waker.notify))
        self._sources.append(_DirectSource(self, instance))

    def holds(self, instance: int) -> bool:
        """A batch cut for ``instance`` waits to be taken again."""
        return bool(self._held[instance])

    def enqueued(self, slot: Slot) -> None:
        """A request (or a force-end) was queued in ``slot``; the core wakes the instances."""

    @property
    def pending(self) -> int:
        return sum(_real(w) for held in self._held for batch in held for w in batch)

    async def wait_empty(self) -> None:
        """Held batches count in ``pending``; the core waits for them."""

    def close(self) -> list[Work]:
        left: list[Work] = []
        for alarm in self._alarms:
            alarm.cancel()
        for held in self._held:
            while held:
                for work in held.popleft():
                    if _real(work):
                        left.append(work)
                    else:
                        self._core.free_work(work)
                        work.future.cancel()
        return left

    # -- one instance -----------------------------------------------------------------------

    async def next_batch(self, instance: int) -> list[Work]:
        while True:
            if self._core.closed:
                raise asyncio.CancelledError
            batch = self._take(instance)
            if batch:
                self._core.changed()
                return batch
            await self._core.waker.wait()

    def requeue(self, instance: int, batch: list[Work]) -> None:
        self._held[instance].append(batch)
        self._core.changed()

    def _take(self, instance: int) -> list[Work] | None:
        if self._held[instance]:
            return self._held[instance].popleft()
        slots = self._core.table.slots[instance]
        for slot in slots:
            self._settle(slot)
        ready = [slot for slot in slots if slot.queue and not slot.in_flight]
        if not ready or not self._due(instance, ready):
            return None
        batch = self._cut(slots[: ready[-1].index + 1], ready[0])
        if batch is None:
            self._core.changed()
        return batch

    def _settle(self, slot: Slot) -> None:
        """Release the slot at a force-end; cancel the sequence of a request whose client went
        away."""
        while slot.queue:
            front = slot.queue[0]
            if isinstance(front, ForceEnd):
                slot.queue.popleft()
                self._core.release(slot)
            elif front.abandoned:
                slot.queue.popleft()
                self._core.cancel_sequence(slot, front)
            else:
                return

    def _due(self, instance: int, ready: list[Slot]) -> bool:
        if self._delay_ns == 0 or self._min_utilization == 0.0:
            return True
        now = self._core.clock.now_ns()
        oldest = min(_arrival(slot.queue[0]) for slot in ready)
        utilization = len(ready) / self._settings.max_batch_size
        if now - oldest > self._delay_ns or utilization >= self._min_utilization:
            return True
        self._alarms[instance].arm(oldest + self._delay_ns + 1)
        return False

    def _cut(self, slots: list[Slot], first: Slot) -> list[Work] | None:
        representative = first.queue[0]
        assert isinstance(representative, Work)
        inputs = list(representative.record.inputs)
        outputs = list(representative.record.requested_outputs)
        key = shape_key(representative.record, self._settings)
        batch: list[Work] = []
        try:
            for slot in slots:
                batch.append(self._next_of(slot, key, inputs, outputs))
        except ShoalError as error:  # no room for a null request's tensors: fail the batch
            for work in batch:
                fail_work(work, error, self._core.free_work)
            return None
        return batch

    def _next_of(
        self, slot: Slot, key: object, inputs: list[TensorDesc], outputs: list[str]
    ) -> Work:
        """The slot's next request, or a null request in its place."""
        front = slot.queue[0] if slot.queue else None
        if (
            not isinstance(front, Work)
            or slot.in_flight
            or shape_key(front.record, self._settings) != key
        ):
            return self._null(inputs, outputs)
        slot.queue.popleft()
        if front.record.flags & FLAG_END:
            self._core.release(slot)
        if self._core.prepare(front, slot):
            if front.stream is not None and self._core.tensors.has_state:
                # The next request must see the state this one's responses leave.
                slot.in_flight = True
                when_done(front, functools.partial(self._streamed, slot))
            return front
        return self._null(inputs, outputs)  # it failed; its position still needs a request

    def _streamed(self, slot: Slot) -> None:
        slot.in_flight = False
        self._core.changed()

    def _null(self, inputs: list[TensorDesc], outputs: list[str]) -> Work:
        """A not-ready request shaped like the representative, with zero data."""
        record = RequestRecord("", 0, 0, {}, list(outputs), [])
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        work = Work(record, [], future)
        if self._decoupled:
            # A decoupled model answers on streams: the null request's responses are released
            # as they come, and its blocks freed at its final response.
            work.stream, work.closed = new_stream(), True
        tensors = self._core.tensors
        try:
            sizes = [_zero_size(desc) for desc in inputs]
            zeros = tensors.stage_zeros(max(sizes, default=0))
            work.input_blocks.append(zeros)
            record.inputs = [
                TensorDesc(d.name, d.datatype, d.shape, _sub_block(zeros, n))
                for d, n in zip(inputs, sizes, strict=True)
            ]
            tensors.add_controls(work, ready=False)
            tensors.add_state(work, None)
        except ShoalError:
            self._core.free_work(work)
            work.future.cancel()
            raise
        work.on_complete = _discard
        return work


class _DirectSource:
    """One instance's view of the direct strategy."""

    def __init__(self, strategy: DirectStrategy, instance: int) -> None:
        self._strategy = strategy
        self._instance = instance

    async def next_batch(self) -> list[Work]:
        return await self._strategy.next_batch(self._instance)

    def requeue(self, batch: list[Work]) -> None:
        self._strategy.requeue(self._instance, batch)


def _real(work: Work) -> bool:
    """Not a null request."""
    return work.on_complete is not _discard


def _arrival(item: Work | ForceEnd) -> int:
    return item.tag if isinstance(item, Work) and isinstance(item.tag, int) else 0


def _zero_size(desc: TensorDesc) -> int:
    size = byte_size(desc.datatype, desc.shape)
    return 4 * element_count(desc.shape) if size is None else size


def _sub_block(block: Block, nbytes: int) -> Block:
    """The first ``nbytes`` of ``block`` (never freed on its own)."""
    if nbytes == 0:
        return Block(block.arena_id, 0, 0, 0)
    return Block(block.arena_id, block.segment, block.offset, nbytes)


def _discard(done: Completion) -> None:
    done.release()


def _consume(future: asyncio.Future[Completion]) -> None:
    if not future.cancelled():
        future.exception()
