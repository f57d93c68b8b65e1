"""The direct hand-off: requests sent to an idle instance's stub by whoever brings them.

An instance's work loop used to take a slot, then wait in its scheduler's ``next_batch`` on a
future: every request resolved that future and ran a step of the loop's task to be sent, and
every answer did the same to free the slot. With the default scheduler the loop instead
*parks* (``DefaultScheduler.park``) holding a slot, and a :class:`Handoff` does the loop's work
synchronously: the scheduler gives a request submitted to the parked instance (``take``), which
sends it to the stub at once; when its slots run out, the slot an answer frees is taken again
in a loop callback, which sends what is queued or parks again. The task sleeps through all of
it and wakes only when something needs it: the stub's ring is full (it waits for room), the
stub is not ready (it puts the request back and waits for the next stub), the instance stops
or the scheduler closes. Batches are sent exactly as the loop sends them (``Feeder``'s
``open_batch`` and ``send_now``), so the ledger, timeouts and statistics see no difference.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from shoal.ipc import messages as msg
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.ledger import InFlightLedger, Slots
from shoal.supervisor.instances.spec import CurrentStub
from shoal.supervisor.schedulers.default import DefaultScheduler
from shoal.supervisor.work import Work


class Sender(Protocol):
    """How a batch goes to the stub (the instance's ``Feeder``, which imports this module)."""

    def open_batch(
        self, proc: StubChannel, batch: list[Work], slots: Slots
    ) -> tuple[int, msg.Execute] | None: ...

    def send_now(self, proc: StubChannel, batch_id: int, message: msg.Execute) -> bool: ...


#: A batch opened in the ledger whose Execute found the stub's ring full: the task sends it.
Unsent = tuple[StubChannel, int, msg.Execute]


class Handoff:
    """One instance's work loop while it is parked with its scheduler (see the module)."""

    def __init__(
        self,
        source: DefaultScheduler,
        sender: Sender,
        ledger: InFlightLedger,
        current: CurrentStub,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._source = source
        self._sender = sender
        self._ledger = ledger
        self._current = current
        self._loop = loop
        #: What the task waits on while the hand-off runs; None while the task runs.
        self._wake: asyncio.Future[None] | None = None
        self._slots = ledger.slots
        #: A slot of ``_slots`` is held for the next request (parked, or about to send).
        self._held = False
        #: In the scheduler's list of parked instances.
        self._parked = False
        #: The loop callback that takes a freed slot, while one is due.
        self._refill: asyncio.Handle | None = None
        #: What the task finds when woken: a request to send (its slot held), or an Execute
        #: that found the ring full.
        self._batch: list[Work] | None = None
        self._unsent: Unsent | None = None
        #: Held out of the scheduler (``hold_out``): its stub waits on a call of its own.
        self._out = False

    async def wait(self, slots: Slots) -> list[Work] | Unsent | None:
        """Run the hand-off on a slot taken of ``slots`` until the task is needed: returns a
        batch to send (on that slot), an Execute to send once the ring has room, or None (no
        slot held: the stub is not ready or was replaced)."""
        wake = self._loop.create_future()
        self._wake, self._slots, self._held = wake, slots, True
        try:
            self._offer()
            await wake
        except BaseException:
            self._leave()
            raise
        self._wake = None
        unsent, self._unsent = self._unsent, None
        if unsent is not None:
            return unsent
        batch, self._batch = self._batch, None
        return batch

    def take(self, work: Work) -> None:
        """The scheduler's request for this parked instance, on its held slot."""
        self._parked = False
        if self._send([work]) and self._take_slot():
            self._offer()

    def hold_out(self) -> None:
        """The stub waits on a BLS call of a request the core did not send it (a frontend
        worker did): no request is handed to it until ``let_in``, or that call could be given
        to the instance that waits for it."""
        self._out = True
        if self._parked:
            self._parked = False
            self._source.unpark(self)

    def let_in(self) -> None:
        """The stub's calls are answered: it takes requests again."""
        self._out = False
        wake = self._wake
        if self._held and not self._parked and wake is not None and not wake.done():
            self._offer()

    def closed(self) -> None:
        """The scheduler closed: the task ends as ``next_batch`` would end it."""
        self._parked = False
        wake = self._wake
        if wake is not None and not wake.done():
            wake.cancel()

    def _offer(self) -> None:
        """On a held slot: send what is queued while slots last, else park (unless held out:
        then the slot waits for ``let_in``)."""
        while not self._out:
            self._parked = True
            work = self._source.park(self)
            if work is None:
                return
            self._parked = False
            if not (self._send([work]) and self._take_slot()):
                return

    def _send(self, batch: list[Work]) -> bool:
        """Send ``batch`` on the held slot; False when the task has to go on with it."""
        current = self._current
        proc = current.proc
        if current.stopping or proc is None or not current.ready.is_set():
            self._resume(batch=batch)
            return False
        self._held = False  # the batch's from here: the ledger gives it back
        opened = self._sender.open_batch(proc, batch, self._slots)
        if opened is None:
            return True  # failed (or the stub is gone, whose exit fails it)
        batch_id, message = opened
        if not self._sender.send_now(proc, batch_id, message):
            self._resume(unsent=(proc, batch_id, message))
            return False
        return True

    def _take_slot(self) -> bool:
        """Hold a slot for the next request; False when none is free (one freed is taken in a
        loop callback) or the stub's slots were replaced (the task takes the new ones)."""
        slots = self._slots
        if slots is not self._ledger.slots:
            self._resume()
            return False
        if slots.take():
            self._held = True
            return True
        slots.on_free = self._slot_freed
        return False

    def _slot_freed(self) -> None:
        # Called inside the ledger's bookkeeping of an answer or a death: the next send waits
        # for a loop callback, outside it.
        self._refill = self._loop.call_soon(self._refilled)

    def _refilled(self) -> None:
        self._refill = None
        wake = self._wake
        if wake is None or wake.done():
            return
        current = self._current
        if current.stopping or not current.ready.is_set():
            self._resume()
        elif self._take_slot():
            self._offer()

    def _resume(self, batch: list[Work] | None = None, unsent: Unsent | None = None) -> None:
        """Wake the task with what it must do."""
        self._batch, self._unsent = batch, unsent
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def _leave(self) -> None:
        """The task stops waiting (cancelled): undo every hold of the hand-off."""
        self._wake = None
        if self._parked:
            self._parked = False
            self._source.unpark(self)
        if self._slots.on_free is not None:
            self._slots.on_free = None
        if self._refill is not None:
            self._refill.cancel()
            self._refill = None
        batch, self._batch = self._batch, None
        if batch is not None:
            self._source.requeue(batch)
        if self._held:
            self._held = False
            self._slots.release()
