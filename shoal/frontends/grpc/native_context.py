"""A call on shoal's own gRPC server as its method sees it (the part of
``grpc.aio.ServicerContext`` shoal's RPCs use), the method as the call reads it, the error
that ends a call with a status, a compressed request message inflated (an error status past
the size limit), and the marker a unary call's work ends on (:data:`LAST_STEP`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import zlib
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from shoal.frontends._last_step import LAST_STEP
from shoal.frontends.grpc.methods import Method
from shoal.frontends.grpc.native_headers import metadata
from shoal.frontends.grpc.native_messages import inflate
from shoal.frontends.grpc.status import Status
from shoal.frontends.h2.header_blocks import Headers
from shoal.frontends.h2.streams import StreamHandler

if TYPE_CHECKING:
    from shoal.frontends.grpc.infer_call import LentReply
    from shoal.frontends.grpc.native_messages import BufferPool
    from shoal.frontends.grpc.native_split import ReceiveArena

log = logging.getLogger(__name__)

#: A compressed message smaller than this is inflated on the event loop (at most ~1 MiB out).
_INFLATE_INLINE: Final = 1024
#: Every task-run call's task's name (see CallWork._launch).
_TASK_NAME: Final = "grpc-call"
#: ``asyncio.Task`` and ``asyncio.get_running_loop``, read once: compiled, ``asyncio.X`` is an
#: attribute look-up on the module (~270 instructions) at every call; a Final is a C static.
_Task: Final = asyncio.Task
_running_loop: Final = asyncio.get_running_loop


class CallMethod:
    """A :class:`~shoal.frontends.grpc.methods.Method` as the calls of shoal's own server read
    it, its fields native attributes: compiled, each read of a frozen dataclass's field is a
    look-up in its instance dictionary (six per call)."""

    __slots__ = ("handle", "parse", "serialize", "split", "stepped", "streaming")

    def __init__(self, method: Method, stepped: bool = False) -> None:
        self.streaming: bool = method.streaming
        #: Its calls' work is stepped by hand, not run in a task (see CallWork): ModelInfer's,
        #: whose path is known to need no task (the HTTP fast path steps it too).
        self.stepped = stepped
        self.parse: Callable[[bytes | bytearray], Any] | None = method.parse
        self.serialize: Callable[[Any], bytes] | None = method.serialize
        self.handle: Callable[[Any, Any], Any] = method.handle
        self.split: bool = method.split


class Abort(Exception):
    """Ends a call with ``code`` and ``details`` (its status), raised by its work."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The part of ``grpc.aio.ServicerContext`` that shoal's RPCs use."""

    __slots__ = ("_headers", "_metadata", "read_at", "send_start", "traced")

    def __init__(self, headers: Headers, read_at: float = 0.0) -> None:
        self._headers = headers
        self._metadata: tuple[tuple[str, str], ...] | None = None
        #: When the read that brought its headers came (the connection's ``loop.time()``,
        #: read anyway for its limits; a small call's whole request): GRPC_WAITREAD_*.
        self.read_at = read_at
        #: Where a traced ModelInfer hands its frontend's timestamps (None: not traced, as
        #: nearly every call: no clock read then), and when its reply began (GRPC_SEND_START).
        self.traced: Callable[[list[tuple[str, int]]], None] | None = None
        self.send_start = 0

    def sending(self) -> None:
        """A traced call's reply is about to be written."""
        if self.traced is not None:
            self.send_start = time.monotonic_ns()

    def sent(self) -> None:
        """A traced call is over: its frontend's timestamps go to its trace, as Triton's
        ``infer_handler.cc`` takes them (no GRPC_SEND_* where it failed before its reply)."""
        traced, self.traced = self.traced, None
        if traced is None:
            return
        read = int(self.read_at * 1e9)
        stamps = [("GRPC_WAITREAD_START", read), ("GRPC_WAITREAD_END", read)]
        if self.send_start:
            stamps += [("GRPC_SEND_START", self.send_start), ("GRPC_SEND_END", time.monotonic_ns())]
        traced(stamps)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        if self._metadata is None:
            self._metadata = metadata(self._headers)
        return self._metadata

    async def abort(self, code: Status, details: str) -> None:
        raise Abort(code, details)


async def inflated(
    message: bytes | bytearray, encoding: bytes | None, limit: int
) -> bytes | bytearray:
    """Inflate a compressed message, refusing past the message size limit while inflating
    (a small "zip bomb" costs at most the limit); off the event loop unless small."""
    wbits = 16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS
    work = functools.partial(inflate, message, wbits, limit)
    try:
        out = work() if len(message) < _INFLATE_INLINE else await asyncio.to_thread(work)
    except zlib.error as exc:
        raise Abort(Status.INTERNAL, f"failed to decompress the request message: {exc}") from None
    if out is None:
        raise Abort(
            Status.RESOURCE_EXHAUSTED,
            f"Received message larger than max (more than {limit} bytes uncompressed)",
        )
    return out


class CallServer:
    """What a call needs of its server: the message size limit, the pool of large request
    buffers, the arena large inputs are received into (a frontend worker's) and the set of
    running calls (stopped when the server stops; each leaves it when its task ends)."""

    def __init__(
        self, max_message_bytes: int, buffers: BufferPool, receive_into: ReceiveArena | None = None
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.buffers = buffers
        self.receive_into = receive_into
        self.running: set[CallWork] = set()
        #: Bytes of replies written from lent memory and not yet released (see LENT_LIMIT).
        self.lent = 0


class CallWork(StreamHandler):
    """How a call's work runs: in a task of its own (:meth:`_launch`), or stepped by hand
    (:meth:`_begin_work`: ModelInfer's, see :attr:`CallMethod.stepped`).

    Stepped, the work is no :class:`asyncio.Task`: the call steps the coroutine itself, the
    first step at once (where the request ends), each later one from the done callback of the
    future it awaits, as a task's would. A task cost every call ~6,000 instructions (made,
    registered in asyncio's ``WeakSet``, its first step a handle run on the loop's next turn,
    freed). Cancellation is a task's (:meth:`_cancel_task`): the future awaited is cancelled,
    so the work sees CancelledError there, or, between steps, the next step throws it; a bare
    ``yield`` steps again on the loop's next turn. The work ends by awaiting
    :data:`LAST_STEP`. What it does not do: it is not ``asyncio.current_task()`` (nothing on
    ModelInfer's path asks; ``asyncio.timeout`` would), and its steps run in the loop's
    context, not a copy. The HTTP fast path steps its requests the same way
    (``http/_fast_request.Stepped``).
    """

    _task: asyncio.Task[None] | None = None  # the work, in a task
    _started = False  # the work has begun its first step (see _cancel_task)
    _cancel_first = False  # cancelled before that step: the step ends the call, as cancelled
    _work: Coroutine[Any, Any, None] | None = None  # the work, stepped, while it runs
    _waiter: asyncio.Future[Any] | None = None  # what it awaits
    _must_cancel = False  # its next step throws CancelledError
    _ended: asyncio.Future[None] | None = None  # set once it ends (see stop)
    _server: CallServer

    def _cancelled(self) -> None:
        """End the call as its cancelled work does (the call's own)."""
        raise NotImplementedError

    def _broke(self, error: BaseException) -> None:
        """End the call as ``error`` out of its stepped work would have (the call's own)."""
        raise NotImplementedError

    def _launch(self, work: Coroutine[Any, Any, None]) -> None:
        """Run the call's work in a task of its own. Made as ``asyncio.Task`` with a name, not
        by the loop's ``create_task``: a task made without one formats "Task-N" (~1,800
        instructions), and uvloop's wrapper costs ~1,300 more. No done callback (each is a
        loop handle): the work's own ``finally`` says it ended (:meth:`_work_ended`)."""
        self._task = _Task(work, loop=_running_loop(), name=_TASK_NAME)

    def _begin_work(self, work: Coroutine[Any, Any, None]) -> None:
        """Step ``work`` by hand (see the class), its first step now."""
        self._started = True
        self._work = work
        self._step(None)

    def _began(self) -> bool:
        """The work's first step: False when the call was cancelled before it (ended now)."""
        self._started = True
        if self._cancel_first:
            self._cancelled()
            return False
        return True

    def _working(self) -> bool:
        """Whether the work has begun and not ended."""
        return self._work is not None or (self._task is not None and not self._task.done())

    def _cancel_task(self) -> None:
        """Cancel the call's work, if any. Stepped: the future it awaits, or its next step. A
        task that has not begun is not cancelled: its coroutine would be closed before its
        body, ``finally`` and all, ever ran; its first step sees ``_cancel_first`` and ends
        the call as a cancelled task's would."""
        if self._work is not None:
            waiter = self._waiter
            if waiter is None or not waiter.cancel():
                self._must_cancel = True
        elif self._task is not None and self._started:
            self._task.cancel()
        elif self._task is not None:
            self._cancel_first = True

    def stop(self) -> asyncio.Future[None] | None:
        """The server stops: the call's work is cancelled; what to wait for (its end). For
        stepped work, a future made only now, done once the work ends."""
        self._cancel_task()
        if self._work is None:
            return self._task
        if self._ended is None:
            self._ended = _running_loop().create_future()
        return self._ended

    def _work_ended(self) -> None:
        """The work ends (in its ``finally``): the call lets go of its task, whose coroutine
        refers to the call (else each call is a cycle only the collector frees, ~6k
        instructions a call; stepped work is let go by its last step); a stop waiting for its
        end is told."""
        self._task = None
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(None)

    def _step(self, error: BaseException | None) -> None:
        """One step of the work, up to its next await (see the class)."""
        work = self._work
        if work is None:
            return
        try:
            if error is not None:
                awaited = work.throw(error)
            elif self._must_cancel:
                self._must_cancel = False
                awaited = work.throw(asyncio.CancelledError())
            else:
                awaited = work.send(None)
        except StopIteration:  # it ends on LAST_STEP instead, without this to catch
            self._work = None
            return
        except BaseException as exc:  # past the work's own handlers: a CancelledError, or a bug
            self._work = None
            self._work_raised(exc)
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise  # KeyboardInterrupt, SystemExit: as a task, to the loop
            return
        if awaited is LAST_STEP:  # done: the coroutine is dropped, never resumed
            self._work = None
        elif awaited is None:  # a bare yield: again on the loop's next turn
            _running_loop().call_soon(self._step, None)
        elif getattr(awaited, "_asyncio_future_blocking", False):
            awaited._asyncio_future_blocking = False
            self._waiter = awaited
            # A bound method made per await, not kept: kept, the call would be a reference
            # cycle (the call, its method, the call), garbage only the collector frees.
            awaited.add_done_callback(self._woken)
            if self._must_cancel and awaited.cancel():
                self._must_cancel = False
        else:  # as a task would, it hears that it yielded what it may not
            error = RuntimeError(f"a gRPC call yielded {awaited!r}, not a future")
            _running_loop().call_soon(self._step, error)

    def _woken(self, future: asyncio.Future[Any]) -> None:
        """The future the work awaits is done: its next step (the await reads it)."""
        self._waiter = None
        self._step(None)

    def _left(self) -> None:
        """The work ends: the call leaves the server's running calls (see _work_ended)."""
        self._server.running.discard(self)
        self._work_ended()

    def _work_raised(self, error: BaseException) -> None:
        """``error`` came out of the stepped work, past its own handlers (a CancelledError, or
        a bug, logged): the call ends all the same, as those would have ended it: it leaves
        the running calls (a waiting stop is told), and :meth:`_broke`."""
        if not isinstance(error, asyncio.CancelledError):
            log.error("unexpected error ending a gRPC call", exc_info=error)
        try:
            self._left()
        finally:
            self._broke(error)


def give_back(server: CallServer, size: int, reply: LentReply) -> None:
    """A lent reply has been written (or will never be): its memory goes back."""
    server.lent -= size
    reply.release()
