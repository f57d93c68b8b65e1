"""The down rings, many waiting threads: the main loop, BLS callers, decoupled BLS readers.

Whoever finds no reader reads the next message for everyone and routes it: BLS replies to the
thread that waits for that call, ``Release`` straight to the output arena, ``SegmentRetired`` to
the input map, everything else to the main loop. The rings are the core's and, with direct
dispatch, one per frontend worker (``ipc/down_set.py``): an Execute that came on a worker's ring
is answered on that ring (:attr:`DownPump.origins`). With a single thread this costs a few
uncontended lock operations per message.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable
from typing import TypeVar, cast

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.down_set import CORE, DownSet
from shoal.ipc.memory_messages import Release
from shoal.ipc.model_messages import Execute

_T = TypeVar("_T")


class DownPump:
    """Reads the down rings on behalf of every thread of the stub."""

    def __init__(
        self,
        downs: DownSet,
        release: Callable[[list[Block]], None],
        cancel: Callable[[list[int]], None] = lambda keys: None,
        retire: Callable[[int, int], None] = lambda arena_id, segment: None,
        retire_chunk: Callable[[int, int], None] = lambda device, chunk: None,
        attach: Callable[[int, int], None] = lambda origin, pid: None,
        detach: Callable[[int], None] = lambda origin: None,
        release_direct: Callable[[int, list[Block]], None] = lambda origin, blocks: None,
    ) -> None:
        self._downs = downs
        self._attach = attach
        self._detach = detach
        self._release_direct = release_direct
        #: The worker each Execute that came on a worker's direct ring came from, by batch id:
        #: its Result goes back on that ring.
        self.origins: dict[int, int] = {}
        self._release = release
        self._cancel = cancel
        self._retire = retire
        self._retire_chunk = retire_chunk
        # Entered as the lock itself (C) rather than the Condition (Python), and notified only
        # when a thread waits: this runs for every message.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0
        self._reading = False
        self._error: BaseException | None = None
        self._main: collections.deque[msg.Message] = collections.deque()
        self._replies: dict[int, collections.deque[msg.BlsReply | msg.ControlReply]] = {}
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()

    def new_call_id(self) -> int:
        """A fresh id for a BLS or control call (one numbering for both)."""
        with self._ids_lock:
            return next(self._ids)

    def expect(self, call_id: int) -> None:
        """Register a BLS call before its request is sent, so no reply is dropped."""
        with self._lock:
            self._replies[call_id] = collections.deque()

    def forget(self, call_id: int) -> None:
        with self._lock:
            self._replies.pop(call_id, None)

    def next_main(self) -> msg.Message:
        """The next message for the main loop (Execute, Finalize, ...)."""
        if self._main:  # the main loop is its only reader; a deque's popleft is atomic
            return self._main.popleft()
        return cast(msg.Message, self._wait(self._take_main))

    def _take_main(self) -> msg.Message | None:
        main = self._main
        return main.popleft() if main else None

    def next_reply(self, call_id: int) -> msg.BlsReply | msg.ControlReply:
        """The next reply to call ``call_id``."""
        replies = self._replies[call_id]

        def take() -> msg.BlsReply | msg.ControlReply | None:
            return replies.popleft() if replies else None

        return cast(msg.BlsReply | msg.ControlReply, self._wait(take))

    def poll(self) -> None:
        """Route what is on the ring now, without waiting, unless a thread is reading (then it
        routes it). Lets a model busy in ``execute`` see cancellations as they come, and the
        main loop see a Cancel queued behind an Execute the supervisor sent ahead before that
        batch starts."""
        if self._downs.is_empty():  # every Execute: no lock taken when nothing waits
            return
        with self._lock:
            if self._reading or self._error is not None:
                return
            self._reading = True
        try:
            while (got := self._downs.recv_nowait()) is not None:
                message = msg.decode(got[1])
                with self._lock:
                    self._route(message, got[0])
        except Exception:
            pass  # the supervisor is gone: the main loop finds out on its next read
        finally:
            with self._lock:
                self._reading = False
                self._wake_all()

    def _wait(self, take: Callable[[], _T | None]) -> _T:
        while True:
            with self._lock:
                while True:
                    if self._error is not None:
                        raise self._error
                    item = take()
                    if item is not None:
                        return item
                    if not self._reading:
                        self._reading = True
                        break
                    self._sleepers += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._sleepers -= 1
            self._read_one()

    def _read_one(self) -> None:
        try:
            origin, payload = self._downs.recv()
            message = msg.decode(payload)
        except BaseException as error:
            self._fail_readers(error)
            raise
        with self._lock:
            self._reading = False
            self._route(message, origin)
            self._wake_all()

    def _wake_all(self) -> None:
        """Wake the threads that wait for a message (under the lock)."""
        if self._sleepers:
            self._cond.notify_all()

    def _fail_readers(self, error: BaseException) -> None:
        """Reading failed: every thread waiting on the pump raises ``error``."""
        with self._lock:
            self._reading = False
            self._error = error
            self._wake_all()

    def _route(self, message: msg.Message, origin: int = CORE) -> None:
        if type(message) is Execute:  # the usual message first: the match tries eight classes
            if origin != CORE:
                self.origins[message.batch_id] = origin
            self._main.append(message)
            return
        if type(message) is Release:
            if origin != CORE:
                self._release_direct(origin, message.blocks)
            else:
                self._release(message.blocks)
            return
        match message:
            case msg.BlsReply(call_id=call_id) | msg.ControlReply(call_id=call_id):
                waiting = self._replies.get(call_id)
                if waiting is not None:
                    waiting.append(message)
            case msg.Cancel(keys=keys):
                self._cancel(keys)
            case msg.SegmentRetired(arena_id=arena_id, segment=segment):
                self._retire(arena_id, segment)
            case msg.CudaChunkRetired(device=device, chunk=chunk):
                self._retire_chunk(device, chunk)
            case msg.DirectAttach(origin=attached, pid=pid):
                self._attach(attached, pid)
            case msg.DirectDetach(origin=detached):
                self._detach(detached)
            case _:
                self._main.append(message)
