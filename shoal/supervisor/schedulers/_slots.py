"""The sequence batcher's bookkeeping: sequence slots, the backlog and idle sequences.

Each instance has a fixed number of slots (``max_batch_size`` for ``direct``,
``max_candidate_sequences`` for ``oldest``). A starting sequence takes a free slot (lowest slot
number first, so sequences spread over instances) or waits in the backlog; every later request of
the sequence goes to the same slot. When a sequence ends, or is released for being idle, its slot
passes to the oldest backlogged sequence. This is Triton's ``SequenceBatchScheduler::Enqueue``,
``ReleaseSequenceSlot`` and reaper thread.
"""

from __future__ import annotations

import collections
import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from shoal.supervisor.schedulers._controls import SequenceState, SequenceTensors
from shoal.supervisor.schedulers.base import Clock, FreeWork, Waker
from shoal.supervisor.work import Work

log = logging.getLogger("shoal")

CorrId = int | str

#: How often a backlogged sequence that went idle is looked at again (Triton's 50 ms).
BACKLOG_IDLE_RECHECK_NS = 50_000_000


class ForceEnd:
    """Queued after the last request of a sequence released for being idle."""


FORCE_END = ForceEnd()


@dataclass(eq=False)
class Slot:
    """One sequence slot of one instance; ``queue`` holds its sequence's waiting requests."""

    instance: int
    index: int
    queue: collections.deque[Work | ForceEnd] = field(default_factory=collections.deque)
    #: The implicit state of the sequence in this slot (reset by each START).
    state: SequenceState = field(default_factory=SequenceState)
    #: Oldest strategy: a request of this slot is in the instance's batcher or running.
    #: Direct strategy, decoupled model with implicit state: a request still streams.
    in_flight: bool = False

    @property
    def waiting(self) -> int:
        return sum(1 for item in self.queue if not isinstance(item, ForceEnd))


@dataclass(eq=False)
class Backlog:
    """The requests of a sequence that has no slot yet, in arrival order."""

    corr: CorrId
    works: collections.deque[Work] = field(default_factory=collections.deque)
    #: When its requests fail for waiting too long (from their ``timeout``); 0: never.
    expires_ns: int = 0


def when_done(work: Work, callback: Callable[[], None]) -> None:
    """Call ``callback`` once ``work`` is over: its result came (or it failed, or its client
    went away), or, for a decoupled model, its final response came."""
    called = False

    def once(*_: object) -> None:
        nonlocal called
        if not called:
            called = True
            callback()

    work.future.add_done_callback(once)
    if work.stream is not None:  # a streamed request's future is only resolved by a failure
        work.on_final = once


class SequenceCore(Protocol):
    """What a strategy (direct, oldest) uses of the sequence batcher that owns it."""

    table: SlotTable
    tensors: SequenceTensors
    clock: Clock
    free_work: FreeWork
    waker: Waker

    @property
    def closed(self) -> bool: ...

    def prepare(self, work: Work, slot: Slot) -> bool:
        """Add controls and state to a request leaving its slot; False if it failed instead."""
        ...

    def release(self, slot: Slot) -> None:
        """The sequence in ``slot`` ended or was released: pass the slot on."""
        ...

    def cancel_sequence(self, slot: Slot, cancelled: Work) -> None:
        """``cancelled``, just taken from the front of ``slot``, was abandoned by its client:
        the whole sequence is cancelled."""
        ...

    def changed(self) -> None:
        """Queues changed: wake waiting instances and recheck emptiness."""
        ...


class SlotTable:
    """Slots, backlog and last-request times of a sequence batcher."""

    def __init__(self, instances: int, slots_per_instance: int) -> None:
        self._per_instance = slots_per_instance
        self.slots = [[Slot(i, s) for s in range(slots_per_instance)] for i in range(instances)]
        #: Instances an in-place update removes: no sequence starts on them any more.
        self.retiring: set[int] = set()
        self._free = [(s, i) for i in range(instances) for s in range(slots_per_instance)]
        heapq.heapify(self._free)
        self.assigned: dict[CorrId, Slot] = {}
        self.backlog: collections.deque[Backlog] = collections.deque()
        self._backlog_of: dict[CorrId, Backlog] = {}
        self.last_seen: dict[CorrId, int] = {}

    def add_instance(self) -> int:
        """Slots for one more instance (an in-place update adds it), taken by no sequence
        until :meth:`open`; its number."""
        instance = len(self.slots)
        self.slots.append([Slot(instance, s) for s in range(self._per_instance)])
        return instance

    def open(self, instance: int, now_ns: int) -> list[Slot]:
        """The instance is ready: its slots go to backlogged sequences (returned) or wait."""
        for slot in self.slots[instance]:
            self.release(slot, now_ns)
        return [slot for slot in self.slots[instance] if slot.queue]

    def retire(self, instance: int) -> None:
        """Start no sequence on ``instance`` any more; those it holds go on to their end."""
        self.retiring.add(instance)
        self._free = [free for free in self._free if free[1] != instance]
        heapq.heapify(self._free)

    def holds(self, instance: int) -> bool:
        """Whether a sequence still has ``instance``'s slot, or a request waits or runs there."""
        if any(slot.instance == instance for slot in self.assigned.values()):
            return True
        return any(slot.queue or slot.in_flight for slot in self.slots[instance])

    def known(self, corr: CorrId) -> bool:
        return corr in self.assigned or corr in self._backlog_of

    @property
    def pending(self) -> int:
        queued = sum(slot.waiting for slots in self.slots for slot in slots)
        return queued + sum(len(b.works) for b in self.backlog)

    def route(self, work: Work, corr: CorrId, end: bool, now_ns: int) -> Slot | None:
        """Queue ``work`` in its sequence's slot (returned) or the backlog (None)."""
        self.last_seen[corr] = now_ns
        slot = self.assigned.get(corr)
        if slot is None and corr not in self._backlog_of and self._free:
            index, instance = heapq.heappop(self._free)
            slot = self.assigned[corr] = self.slots[instance][index]
        if slot is not None:
            slot.queue.append(work)
            if end:
                del self.assigned[corr]
            return slot
        self._to_backlog(work, corr, end, now_ns)
        return None

    def _to_backlog(self, work: Work, corr: CorrId, end: bool, now_ns: int) -> None:
        backlog = self._backlog_of.get(corr)
        if backlog is None:
            backlog = Backlog(corr)
            self.backlog.append(backlog)
            self._backlog_of[corr] = backlog
        timeout_ns = work.record.timeout_us * 1000
        if timeout_ns:
            expires = now_ns + timeout_ns
            backlog.expires_ns = min(backlog.expires_ns or expires, expires)
        backlog.works.append(work)
        if end:  # a later START with this id collects a new backlog
            del self._backlog_of[corr]

    def release(self, slot: Slot, now_ns: int) -> None:
        """The sequence in ``slot`` is over: give the slot to the oldest backlogged sequence,
        whose idle time starts now."""
        if slot.instance in self.retiring:
            return  # (its instance stops once it holds nothing)
        if not self.backlog:
            heapq.heappush(self._free, (slot.index, slot.instance))
            return
        backlog = self.backlog.popleft()
        slot.queue.extend(backlog.works)
        if self._backlog_of.get(backlog.corr) is backlog:
            del self._backlog_of[backlog.corr]
            self.assigned[backlog.corr] = slot
            self.last_seen[backlog.corr] = now_ns

    def reap(self, now_ns: int, idle_ns: int) -> tuple[list[Slot], list[Work], int | None]:
        """Release idle sequences and expire old backlogs.

        Returns the slots that got a force-end marker, the backlogged requests that expired and
        when to look again.
        """
        ended: list[Slot] = []
        wake: list[int] = []
        for corr, seen in list(self.last_seen.items()):
            if now_ns - seen < idle_ns:
                wake.append(seen + idle_ns)
            elif corr in self.assigned:
                log.debug("sequence %r idle for %d us: releasing its slot", corr, idle_ns // 1000)
                slot = self.assigned.pop(corr)
                slot.queue.append(FORCE_END)
                ended.append(slot)
                del self.last_seen[corr]
            elif corr in self._backlog_of:
                wake.append(now_ns + BACKLOG_IDLE_RECHECK_NS)
            else:
                del self.last_seen[corr]
        expired = self._expire_backlogs(now_ns)
        wake += [b.expires_ns + 1 for b in self.backlog if b.expires_ns]
        return ended, expired, min(wake, default=None)

    def _expire_backlogs(self, now_ns: int) -> list[Work]:
        expired: list[Work] = []
        for backlog in [b for b in self.backlog if b.expires_ns and b.expires_ns <= now_ns]:
            self.backlog.remove(backlog)
            if self._backlog_of.get(backlog.corr) is backlog:
                del self._backlog_of[backlog.corr]
            expired += backlog.works
        return expired

    def drain(self) -> list[Work]:
        """Every queued request (for close)."""
        works: list[Work] = []
        for slots in self.slots:
            for slot in slots:
                works += [w for w in slot.queue if isinstance(w, Work)]
                slot.queue.clear()
        for backlog in self.backlog:
            works += backlog.works
        self.backlog.clear()
        self._backlog_of.clear()
        return works
