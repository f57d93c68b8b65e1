"""Messages up from an instance's stub, each handed to the part of the instance (or of the
supervisor: the BLS and control routers, the segment directory) whose job it is."""

from __future__ import annotations

import logging
import os
from typing import Final

from shoal.ipc import messages as msg
from shoal.supervisor.instances.answers import Answers
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.handshake import Handshake
from shoal.supervisor.instances.ledger import InFlightLedger
from shoal.supervisor.instances.spec import BlsHandler, Caller, ControlHandler, InstanceScope

log = logging.getLogger("shoal")

#: Up messages handled in one go. A stub can send faster than the core handles what it sends
#: (a decoupled model's thread sending small responses in a loop): read until the ring is
#: empty, the core's loop would never get back to its other work (accepting connections, the
#: other stubs, the streams' consumers, a cancellation), and the responses would pile up in
#: memory unread.
UP_SHARE: Final = 256

_LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


class UpMessages:
    """Reads what a stub sent and dispatches it."""

    def __init__(
        self,
        scope: InstanceScope,
        caller: Caller,
        calls: tuple[BlsHandler | None, ControlHandler | None],
        answers: Answers,
        handshake: Handshake,
        ledger: InFlightLedger,
        async_concurrency: int,
    ) -> None:
        self._name = scope.name
        self._directory = scope.directory
        self._caller = caller
        self._bls, self._control = calls
        self._answers = answers
        self._handshake = handshake
        self._ledger = ledger
        self._async_concurrency = max(1, async_concurrency)

    def drain(self, proc: StubChannel, limit: int = UP_SHARE) -> bool:
        """Handle the messages waiting in ``proc``'s ring, at most ``limit``; False when it
        stopped there (more may wait: the channel calls again on the loop's next turn)."""
        while limit > 0:
            payload = proc.recv_up_nowait()
            if payload is None:
                return True
            self.dispatch(proc, msg.decode(payload))
            limit -= 1
        return False

    def last_words(self, proc: StubChannel) -> None:
        """Handle everything an exited stub wrote whole: its answers reach their requests
        before what it left unanswered fails (its arena stays mapped while they are written:
        ``StubOutputs.after_answers``). A record cut short by the death never became visible
        (the ring's tail moves after a record is written whole); a ring that does not read
        ends the reading, a message that does not is logged and skipped: the requests they
        answered fail with the rest."""
        while True:
            try:
                payload = proc.recv_up_nowait()
            except Exception as error:  # a dead stub's ring: logged
                log.error("[%s] the exited stub's ring does not read: %r", self._name, error)
                return
            if payload is None:
                return
            try:
                message = msg.decode(payload)
                self.dispatch(proc, message)
            except Exception as error:  # one message: logged, the others read
                log.error("[%s] a message of the exited stub failed: %r", self._name, error)

    def dispatch(self, proc: StubChannel, message: msg.Message) -> None:
        match message:
            case msg.Result():
                self._answers.complete(proc, message)
            case msg.Response():
                self._answers.on_response(proc, message)
            case msg.BlsCall() | msg.BlsDone() | msg.BlsCancel():
                self._bls_message(proc, message)
            case msg.ControlCall():
                if self._control is not None:
                    self._control.handle(self._caller, proc, message)
            case msg.SegmentRetired(segment=index):
                self._directory.output_retired(proc, index)
            case _:
                self._lifecycle_message(message)

    def _bls_message(self, proc: StubChannel, message: msg.Message) -> None:
        bls = self._bls
        if bls is None:
            return
        match message:
            case msg.BlsCall():
                bls.handle(self._caller, proc, message)
            case msg.BlsDone(call_id=call_id):
                bls.done(proc, call_id)
            case msg.BlsCancel(call_id=call_id):
                bls.cancel(proc, call_id)

    def _lifecycle_message(self, message: msg.Message) -> None:
        match message:
            case msg.Log(level=level, message=text, filename=filename, line=line):
                # The model's file and line are the line's source, as in Triton's python backend.
                where = {"source": f"{os.path.basename(filename)}:{line}"} if filename else None
                log.log(
                    _LOG_LEVELS.get(level, logging.INFO), "[%s] %s", self._name, text, extra=where
                )
            case msg.Readiness(ready=ready, error=error):
                self._handshake.readiness(ready, error)
            case msg.Ready(error=error, concurrent=concurrent, user_ready=user, traceback=trace):
                self._ledger.configure(self._async_concurrency if concurrent else 1)
                self._handshake.ready(error, trace, user)
            case msg.Finalized(error=error):
                self._handshake.finalized(error)
            case _:
                log.error("[%s] unexpected message %s", self._name, type(message).__name__)
