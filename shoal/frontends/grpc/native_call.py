"""One RPC on one HTTP/2 stream of shoal's own gRPC server: its request messages, the work that
runs its method (a unary call's stepped by hand, a streaming call's in a task), its deadline,
and the status it ends with."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any, Final

from shoal.frontends._last_step import LAST_STEP
from shoal.frontends.grpc._wire import coalesced
from shoal.frontends.grpc.infer_call import LentReply
from shoal.frontends.grpc.native_compression import Squeeze
from shoal.frontends.grpc.native_context import (
    Abort,
    CallContext,
    CallMethod,
    CallServer,
    CallWork,
    give_back,
    inflated,
)
from shoal.frontends.grpc.native_headers import OK_TRAILERS, encoding_error, status_block
from shoal.frontends.grpc.native_messages import (
    Compressed,
    ConnectionBudget,
    Inbox,
    Message,
    MessageReader,
    whole_size,
)
from shoal.frontends.grpc.native_split import InferSplitter, SplitRequest
from shoal.frontends.grpc.status import Status
from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import Headers, Http2Connection

log = logging.getLogger(__name__)

# gRPC status codes (the numbers of grpc.StatusCode). Final, as the other constants read per
# call: compiled, each is then a C static, not a look-up in the module's dict at every use.
OK: Final = Status.OK
CANCELLED: Final = Status.CANCELLED
UNKNOWN: Final = Status.UNKNOWN
DEADLINE_EXCEEDED: Final = Status.DEADLINE_EXCEEDED
RESOURCE_EXHAUSTED: Final = Status.RESOURCE_EXHAUSTED
INTERNAL: Final = Status.INTERNAL
UNIMPLEMENTED: Final = Status.UNIMPLEMENTED

#: A streaming call stops producing while this much of its output waits for the client's window.
STREAM_BACKLOG: Final = 1 << 20
#: A gRPC message's prefix: a compressed flag and a 4-byte length.
_PREFIX_SIZE: Final = 5
#: A reply smaller than this goes whole with its headers and trailers (copied: one piece).
_ANSWER_BELOW: Final = 64 * 1024
#: Reply bytes a server may hold in lent memory (the stubs' arenas) until written: past it,
#: replies are copied and their memory released at once, so that clients that do not read
#: cannot hold the arenas other clients need.
LENT_LIMIT = 256 << 20
#: ``asyncio.get_running_loop``, read once: compiled, ``asyncio.X`` is an attribute look-up on
#: the module (~270 instructions) at every call; a Final is a C static.
_running_loop: Final = asyncio.get_running_loop


class NativeCall(CallWork):
    """One RPC on one HTTP/2 stream; its work runs in a task or stepped (see CallWork)."""

    _inbox: Inbox | None = None  # a streaming call's requests
    _timer: asyncio.TimerHandle | None = None  # the deadline's
    _due = 0.0  # the deadline, in the loop's time
    _expired = False
    _headers_sent = False
    _done = False
    _closed = False  # its last header block (END_STREAM) has gone to the connection
    _held = 0  # what this call holds of the connection's budget
    squeeze: Squeeze | None = None  # how its answers are compressed (.native_compression)

    def __init__(
        self,
        server: CallServer,
        connection: Http2Connection,
        stream_id: int,
        method: CallMethod,
        headers: Headers,
        encoding: bytes | None,
        budget: ConnectionBudget,
    ) -> None:
        self._server, self._connection, self._stream_id = server, connection, stream_id
        self._method, self._encoding, self._budget = method, encoding, budget
        self._context = CallContext(headers, connection.last_read)
        self._request: Message | Compressed | None = None  # a unary call's (see MessageReader)
        #: Made by the first DATA that is not one whole small message (see _whole): most
        #: unary calls never need one (its object and four bound methods, ~2,000 instructions).
        self._reader: MessageReader | None = None

    def _message_reader(self) -> MessageReader:
        server = self._server
        arena = server.receive_into if self._method.split else None  # large tensors go there
        split = None if arena is None else functools.partial(InferSplitter, arena)
        reader = self._reader = MessageReader(
            server.buffers,
            server.max_message_bytes,
            not self._method.streaming,
            self._message_done,
            self._too_large,
            self._hold,
            split,
        )
        reader.closed = self._done
        return reader

    def _whole(self, view: memoryview) -> bool:
        """One whole small message read as a fresh reader would, without one (or False)."""
        size = whole_size(view, self._server.max_message_bytes)
        if size < 0 or self._done:
            return False
        if self._hold(size):
            self._message_done(view[_PREFIX_SIZE:].tobytes(), view[0] != 0)  # (bytes(): dearer)
        return True

    # --- from the connection ------------------------------------------------------------------

    def start(self, timeout: float | None) -> None:
        loop = _running_loop()
        if timeout is not None:
            self._due = loop.time() + timeout
            self._timer = loop.call_later(timeout, self._deadline)
        if self._method.streaming:
            self._inbox = Inbox(self._inflate, self._release)
            self._server.running.add(self)
            self._launch(self._run_stream())

    def data_received(self, pieces: list[memoryview], end_stream: bool) -> None:
        reader = self._reader
        if reader is not None:
            reader.feed_pieces(pieces)
        elif len(pieces) != 1 or not self._whole(pieces[0]):
            self._message_reader().feed_pieces(pieces)
        if end_stream:
            self._requests_end()

    def receive_buffer(self, nbytes: int) -> memoryview | None:
        reader = self._reader
        return None if self._done or reader is None else reader.receive_buffer(nbytes)

    def data_placed(self, nbytes: int, end_stream: bool) -> None:
        if self._reader is not None:  # it gave the place (receive_buffer)
            self._reader.placed(nbytes)
        if end_stream:
            self._requests_end()

    def trailers_received(self) -> None:
        self._requests_end()

    def mid_message(self) -> bool:
        reader = self._reader
        return not self._done and reader is not None and reader.mid_message()

    def reset(self) -> None:
        """The client cancelled the call, or its connection is gone: stop the work."""
        self._end()
        self._cancel_task()

    # --- messages in --------------------------------------------------------------------------

    def _too_large(self, size: int) -> None:
        limit = self._server.max_message_bytes
        self._fail(RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")

    def _hold(self, size: int) -> bool:
        """Count ``size`` more request bytes against the connection's budget; past it, the
        call fails and the client is told to stop sending on the stream."""
        if self._budget.take(size):
            self._held += size
            return True
        self._fail(
            RESOURCE_EXHAUSTED,
            f"the connection holds more request bytes than its limit ({self._budget.limit} "
            "bytes across its calls; --grpc-max-connection-buffer-size)",
        )
        return False

    def _release(self, size: int) -> None:
        size = min(size, self._held)
        self._held -= size
        self._budget.give(size)

    def _message_done(self, received: Message, compressed: bool) -> None:
        message: Message | Compressed = received
        if compressed:
            if self._encoding not in (b"gzip", b"deflate"):
                self._fail(*encoding_error(self._encoding))
                return
            # Inflated by the call's task, not here: a large one goes to a thread.
            assert not isinstance(received, SplitRequest)  # compressed ones are never split
            message = Compressed(bytes(received) if isinstance(received, memoryview) else received)
        if self._inbox is not None:
            # streams' messages are never pooled nor split
            assert not isinstance(message, memoryview | SplitRequest)
            self._inbox.put(message)
        elif self._request is None:
            self._request = message
        else:
            if isinstance(message, SplitRequest):
                message.release()
            self._fail(UNIMPLEMENTED, "more than one request message for a unary method")

    def _inflate(self, message: bytes | bytearray) -> Coroutine[Any, Any, bytes | bytearray]:
        return inflated(message, self._encoding, self._server.max_message_bytes)

    def _requests_end(self) -> None:
        if self._done:
            return
        if self._reader is not None and self._reader.mid_message():
            self._fail(INTERNAL, "the request stream ended inside a message")
        elif self._inbox is not None:
            self._inbox.put(None)
        elif not self._started and self._task is None:  # a task-run call starts later
            if self._request is None:
                self._fail(UNIMPLEMENTED, "no request message for a unary method")
            elif self._timer is not None and _running_loop().time() >= self._due:
                # Due already (the loop was busy as the request came in): its timer may run
                # after this, and a task's first step was the next turn's, after the timer.
                self._timer.cancel()
                self._deadline()
            else:
                self._server.running.add(self)
                work = self._run_unary()
                if self._method.stepped:
                    self._begin_work(work)
                else:
                    self._launch(work)

    # --- running ------------------------------------------------------------------------------

    async def _run_unary(self) -> None:
        """A unary call's work: request to method, reply, status, request let go. One coroutine,
        not three levels: each level is entered and resumed on every step of every call."""
        try:
            if self._began():
                request = self._request
                if isinstance(request, Compressed):
                    request = await self._inflate(request.message)
                parsed = self._parsed(request)
                del request  # no view of a pooled buffer may outlive the call
                reply = await self._method.handle(parsed, self._context)
                del parsed
                if self.squeeze is not None:  # deflated (a large one in a thread)
                    reply = await self.squeeze.reply(reply, self._method.serialize)
                self._context.sending()  # (GRPC_SEND_START, if traced: trace_files.py)
                self._reply(reply)
                self._finish(OK, "")
        except asyncio.CancelledError:
            self._cancelled()
        except Exception as exc:
            self._failed(exc)
        finally:
            self._context.sent()
            self._left()
            self._release_request()
            self._release(self._held)
            self._let_reader_go()
        if self._work is not None:  # stepped: the end, without a StopIteration to catch
            await LAST_STEP  # (see LAST_STEP); never inside a try/with

    def _release_request(self) -> None:
        """Forget the request; the arena blocks it came into and were not handed on go back."""
        request, self._request = self._request, None
        if isinstance(request, SplitRequest):
            request.release()

    async def _run_stream(self) -> None:
        """A streaming call's task: as a unary one's (the inbox holds no pooled buffer)."""
        try:
            if self._began():
                await self._stream()
                self._finish(OK, "")
        except asyncio.CancelledError:
            self._cancelled()
        except Exception as exc:
            self._failed(exc)
        finally:
            self._left()

    def _broke(self, error: BaseException) -> None:
        """See CallWork._work_raised: answered as ``error`` ends it (a bug: INTERNAL) if not yet."""
        try:
            if not self._closed and isinstance(error, asyncio.CancelledError):
                self._cancelled()
            elif not self._closed:  # (answered: a forced status could queue a second END_STREAM)
                self._finish(INTERNAL, f"unexpected {type(error).__name__} ending the call")
        finally:
            self._end()
            if not self._closed:  # unanswered (a no-op where the client reset it)
                self._connection.reset_stream(self._stream_id, h2.INTERNAL_ERROR)

    def _failed(self, exc: Exception) -> None:
        """End the call with the status of the error its work raised (called in its handler)."""
        if isinstance(exc, Abort):
            self._finish(exc.code, exc.details)
            return
        log.exception("unexpected error in a gRPC call")
        self._finish(UNKNOWN, f"Unexpected error in RPC handling: {exc!r}")

    def _parsed(self, request: Message | Compressed | None) -> Any:
        """The request as the method takes it."""
        assert request is not None and not isinstance(request, Compressed)
        parse = self._method.parse
        if parse is None:
            return request
        assert not isinstance(request, SplitRequest)  # only ModelInfer's are split
        return parse(bytes(request))

    def _reply(self, reply: Any) -> None:
        """The method's reply sent (small ones whole, with the OK trailers)."""
        if isinstance(reply, LentReply):
            self._send_lent(reply)
            return
        serialize = self._method.serialize
        body = reply if serialize is None else serialize(reply)
        if not self._done and not self._answer(body) and not self._held_back(len(body)):
            self._send_headers()
            self._send_message(body)

    async def _stream(self) -> None:
        assert self._inbox is not None
        async for reply in self._method.handle(self._inbox, self._context):
            if self._done:
                break
            reply = reply if self.squeeze is None else await self.squeeze.compressed(reply)
            self._send_headers()
            self._send_message(reply)
            await self._connection.writable(self._stream_id, STREAM_BACKLOG)

    # --- answering ----------------------------------------------------------------------------

    def _answer(self, body: bytes | bytearray) -> bool:
        """A small reply sent whole, with its headers and OK trailers: the call is over. False
        when it goes frame by frame (large, or held back by the client's windows)."""
        if self._headers_sent or len(body) >= _ANSWER_BELOW or self.squeeze is not None:
            return False
        connection = self._connection
        if not connection.send_answer(self._stream_id, h2.GRPC_RESPONSE_HEADERS, body, OK_TRAILERS):
            return False
        self._headers_sent = self._closed = True
        self._end()
        return True

    def _send_headers(self) -> None:
        if not self._headers_sent:
            block = h2.GRPC_RESPONSE_HEADERS if self.squeeze is None else self.squeeze.headers
            self._connection.send_headers(self._stream_id, block)
            self._headers_sent = True

    def _send_message(self, body: bytes | bytearray) -> None:
        prefix = (b"\x00" if self.squeeze is None else b"\x01") + len(body).to_bytes(4, "big")
        if len(body) < 65536:
            self._connection.send_data(self._stream_id, prefix + body)
        else:  # no copy of a large message to put five bytes in front of it
            self._connection.send_data(self._stream_id, prefix)
            self._connection.send_data(self._stream_id, body)

    def _send_lent(self, reply: LentReply) -> None:
        """A reply that views lent memory: its small chunks joined, its large ones (tensors)
        written as they are, and the memory given back once the stream's bytes have left."""
        size = sum(memoryview(chunk).nbytes for chunk in reply.chunks)
        server = self._server
        if self._done or self._held_back(size) or server.lent + size > LENT_LIMIT:
            self._send_copied(reply)
            return
        server.lent += size
        try:
            self._send_headers()
            for piece in coalesced([b"\x00" + size.to_bytes(4, "big"), *reply.chunks]):
                self._connection.send_data(self._stream_id, piece)
        finally:
            done = functools.partial(give_back, server, size, reply)
            self._connection.after_stream(self._stream_id, done)

    def _held_back(self, size: int) -> bool:
        """Whether the answer would pass what its connection may hold: then the call fails."""
        refusal = self._connection.send_refusal(size)
        if refusal:
            self._finish(RESOURCE_EXHAUSTED, refusal)
        return bool(refusal)

    def _send_copied(self, reply: LentReply) -> None:
        """A lent reply copied, its memory released at once (nothing to send: the call is over;
        or too much lent memory waits for clients already)."""
        try:
            body = b"" if self._done else b"".join(reply.chunks)
        finally:
            reply.release()
        if not self._done:
            self._send_headers()
            self._send_message(body)

    def _cancelled(self) -> None:
        if self._expired:
            self._finish(DEADLINE_EXCEEDED, "Deadline Exceeded", force=True)
        elif not self._done:  # the server is stopping
            self._finish(CANCELLED, "the server is shutting down")

    def _deadline(self) -> None:
        self._timer = None
        if self._done:
            return
        self._expired = True
        if self._working():
            self._cancel_task()
        else:
            self._finish(DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _fail(self, code: int, details: str) -> None:
        """End the call with an error from the transport side: the work, if any, is cancelled."""
        self._finish(code, details)
        self._cancel_task()

    def _finish(self, code: int, details: str, force: bool = False) -> None:
        if self._done and not force:
            return
        self._end()
        block = OK_TRAILERS if code == OK else status_block(code, details)
        if not self._headers_sent:
            block = h2.GRPC_RESPONSE_HEADERS + block  # trailers-only
        self._connection.send_headers(self._stream_id, block, end_stream=True)
        self._closed = True

    def _end(self) -> None:
        """The call is over: read nothing more, and its deadline no longer matters. Without
        work (that lets go of the request when it ends), the request goes now."""
        self._done = True
        if self._reader is not None:
            self._reader.closed = True
        if self._task is None and self._work is None:
            self._release_request()
            self._let_reader_go()
        self._release(self._held)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _let_reader_go(self) -> None:
        """The call is over: its reader's buffers go back, and it lets go of the call."""
        reader = self._reader
        if reader is not None:
            reader.release()
            reader.detach()
