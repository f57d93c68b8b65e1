"""shoal's own gRPC server: ``inference.GRPCInferenceService`` over HTTP/2 on the event loop.

grpcio's asyncio server hands every call between its C++ threads, its poller thread and the
event loop: about thirty system calls and 125-200 µs of CPU per unary call on a small machine,
before shoal runs a line (benchmarks/results/grpc_perf.md). Here the HTTP/2 frames are parsed on
the event loop itself (:mod:`shoal.frontends.h2.connection`), so a call costs one read and one
write, as an HTTP/1.1 request does. The RPCs themselves are the same objects the grpcio server
serves (:func:`shoal.frontends.grpc.methods.method_table`), so both servers behave alike;
``shoal serve --grpc-server grpcio`` still selects grpcio's.

What this module adds on top of HTTP/2 is gRPC's own layer (the gRPC over HTTP/2 protocol):
length-prefixed messages (compressed with ``grpc-encoding`` gzip or deflate, or not), the
``grpc-timeout`` deadline, status and message in trailers, and ``UNIMPLEMENTED`` for unknown
methods. Cleartext only, as the grpcio server shoal starts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import socket
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from shoal.core import CoreAPI
from shoal.frontends._restricted import GRPC_KEY_PREFIX, Restrictions
from shoal.frontends._serving import bind_socket
from shoal.frontends.grpc.methods import MAX_MESSAGE_BYTES, SERVICE_NAME, Method, method_table
from shoal.frontends.grpc.servicer import Servicer
from shoal.frontends.grpc.status import Status
from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import (
    MAX_CONCURRENT_STREAMS,
    FloodLimits,
    Headers,
    Http2Connection,
    StreamHandler,
)

__all__ = ["FloodLimits", "NativeGrpcServer"]

log = logging.getLogger(__name__)

# gRPC status codes (the numbers of grpc.StatusCode).
OK = Status.OK
CANCELLED = Status.CANCELLED
UNKNOWN = Status.UNKNOWN
DEADLINE_EXCEEDED = Status.DEADLINE_EXCEEDED
RESOURCE_EXHAUSTED = Status.RESOURCE_EXHAUSTED
INTERNAL = Status.INTERNAL
UNIMPLEMENTED = Status.UNIMPLEMENTED

#: A streaming call stops producing while this much of its output waits for the client's window.
STREAM_BACKLOG = 1 << 20
#: A compressed message smaller than this is inflated on the event loop (at most ~1 MiB out).
_INFLATE_INLINE = 1024
#: What one zlib call inflates, at most.
_INFLATE_PIECE = 1 << 20
#: A message announcing at most this many bytes gets its buffer at once; a larger one's grows as
#: its bytes arrive.
_PREALLOCATE = 64 * 1024

_OK_TRAILERS = h2.literal(b"grpc-status", b"0")
_TIMEOUT = re.compile(rb"^(\d{1,8})([HMSmun])$")
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Headers that are gRPC's or HTTP/2's own, not the call's metadata (as grpcio hides them).
_RESERVED = frozenset(
    {b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
)


class _Abort(Exception):
    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """The part of ``grpc.aio.ServicerContext`` that shoal's RPCs use."""

    __slots__ = ("_headers", "_metadata")

    def __init__(self, headers: Headers) -> None:
        self._headers = headers
        self._metadata: tuple[tuple[str, str], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        if self._metadata is None:
            self._metadata = tuple(
                (bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
                for name, value in self._headers
                if not name.startswith(b":") and name not in _RESERVED
            )
        return self._metadata

    async def abort(self, code: Status, details: str) -> None:
        raise _Abort(code, details)


class _Inbox:
    """The request messages of a streaming call, as an async iterator; compressed ones are
    inflated as they are taken, off the event loop when large (:func:`_inflate`)."""

    def __init__(
        self,
        inflate: Callable[[bytes | bytearray], Awaitable[bytes | bytearray]],
        taken: Callable[[int], None],
    ) -> None:
        self._items: deque[bytes | bytearray | _Compressed | None] = deque()  # None: no more
        self._waiter: asyncio.Future[None] | None = None
        self._inflate = inflate
        self._taken = taken  # told the size of each message the handler takes

    def put(self, item: bytes | bytearray | _Compressed | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> _Inbox:
        return self

    async def __anext__(self) -> bytes | bytearray:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if item is None:
            self._items.appendleft(None)
            raise StopAsyncIteration
        self._taken(len(item.message) if isinstance(item, _Compressed) else len(item))
        if isinstance(item, _Compressed):
            return await self._inflate(item.message)
        return item


class _Compressed:
    """A request message as it came, compressed."""

    __slots__ = ("message",)

    def __init__(self, message: bytes | bytearray) -> None:
        self.message = message


class _Budget:
    """The request bytes one connection's calls hold and have not handed on yet (messages
    arriving, and received ones a handler has not taken): bounded across all its streams, so
    that a client's memory is not the message limit times its streams."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class _Call(StreamHandler):
    """One RPC on one HTTP/2 stream."""

    def __init__(
        self,
        server: NativeGrpcServer,
        connection: Http2Connection,
        stream_id: int,
        method: Method,
        headers: Headers,
        encoding: bytes | None,
        budget: _Budget,
    ) -> None:
        self._server = server
        self._connection = connection
        self._budget = budget
        self._held = 0  # what this call holds of the connection's budget
        self._stream_id = stream_id
        self._method = method
        self._context = _Context(headers)
        self._encoding = encoding
        self._prefix = bytearray()
        self._message: bytearray | memoryview | None = None
        self._pooled: bytearray | None = None  # the buffer under a pooled message
        self._expected = 0  # the size of the message being received
        self._filled = 0
        self._growing = False  # whether it is received into a buffer that grows as it comes
        self._held_whole = False  # whether its whole size was counted when it began
        self._compressed = False
        self._request: bytes | bytearray | memoryview | _Compressed | None = None
        self._inbox: _Inbox | None = None
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._headers_sent = False
        self._done = False

    # --- from the connection ------------------------------------------------------------------

    def start(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        if timeout is not None:
            self._timer = loop.call_later(timeout, self._deadline)
        if self._method.streaming:
            self._inbox = _Inbox(self._inflate, self._release)
            self._launch(self._run_stream())

    def data_received(self, data: memoryview, end_stream: bool) -> None:
        view = data
        while view and not self._done:
            message = self._message
            if message is None:
                need = 5 - len(self._prefix)
                self._prefix += view[:need]
                view = view[need:]
                if len(self._prefix) < 5:
                    break
                self._begin_message(self._prefix)
                self._prefix = bytearray()
                continue
            size = min(len(view), self._expected - self._filled)
            if not self._held_whole and not self._hold(size):
                return
                assert isinstance(message, bytearray)
                message += view[:size]
            else:
                message[self._filled : self._filled + size] = view[:size]
            self._filled += size
            view = view[size:]
            if self._filled == self._expected:
                self._message_done()
        if end_stream:
            self._requests_end()

    def trailers_received(self) -> None:
        self._requests_end()

    def mid_message(self) -> bool:
        return not self._done and (self._message is not None or bool(self._prefix))

    def reset(self) -> None:
        """The client cancelled the call, or its connection is gone: stop the work."""
        self._done = True
        self._release(self._held)
        self._stop_timer()
        if self._task is not None:
            self._task.cancel()

    # --- messages in --------------------------------------------------------------------------

    def _begin_message(self, prefix: bytearray) -> None:
        size = int.from_bytes(prefix[1:5], "big")
        if size > self._server.max_message_bytes:
            self._fail(
                RESOURCE_EXHAUSTED,
                f"Received message larger than max ({size} vs. {self._server.max_message_bytes})",
            )
            return
        self._compressed = bool(prefix[0])
        self._expected = size
        self._filled = 0
        self._growing = False
        self._held_whole = False
        pooled = None
        if size >= _BufferPool.MIN_SIZE and self._inbox is None and self._pooled is None:
            pooled = self._server.buffers.take(size)
        if pooled is not None:
            self._pooled = pooled
            self._message = memoryview(pooled)[:size]
        elif size <= _PREALLOCATE:
            if not self._hold(size):
                return
            self._held_whole = True
            self._message = bytearray(size)
        else:
            # The length prefix is only a claim: the message grows as its bytes arrive (two
            # streams announcing 2 GiB and sending nothing cost nothing). A unary call's buffer
            # joins the pool afterwards, so repeated large calls reuse it.
            self._message = bytearray()
            self._growing = True
            if size >= _BufferPool.MIN_SIZE and self._inbox is None and self._pooled is None:
                self._pooled = self._message
        if size == 0:
            self._message_done()

    def _hold(self, size: int) -> bool:
        """Count ``size`` more bytes against the connection's budget; past it, the call fails
        (RESOURCE_EXHAUSTED) and the client is told to stop sending on the stream."""
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

    def _message_done(self) -> None:
        received = self._message
        self._message = None
        assert received is not None
        message: bytes | bytearray | memoryview | _Compressed = received
        if self._compressed:
            if self._encoding not in (b"gzip", b"deflate"):
                encoding = self._encoding
                name = "identity" if encoding is None else encoding.decode("latin-1")
                self._fail(
                    UNIMPLEMENTED if encoding is not None else INTERNAL,
                    f"a compressed message with grpc-encoding '{name}'",
                )
                return
            # Inflated by the call's task, not here: a large one goes to a thread.
            message = _Compressed(bytes(received) if isinstance(received, memoryview) else received)
        if self._inbox is not None:
            assert not isinstance(message, memoryview)  # streams' messages are never pooled
            self._inbox.put(message)
        elif self._request is None:
            self._request = message
        else:
            self._fail(UNIMPLEMENTED, "more than one request message for a unary method")

    async def _inflate(self, message: bytes | bytearray) -> bytes | bytearray:
        """Inflate a compressed message, refusing past the message size limit while inflating
        (a small "zip bomb" costs at most the limit); off the event loop unless small."""
        wbits = 16 + zlib.MAX_WBITS if self._encoding == b"gzip" else zlib.MAX_WBITS
        limit = self._server.max_message_bytes
        work = functools.partial(_inflate, message, wbits, limit)
        try:
            out = work() if len(message) < _INFLATE_INLINE else await asyncio.to_thread(work)
        except zlib.error as exc:
            raise _Abort(INTERNAL, f"failed to decompress the request message: {exc}") from None
        if out is None:
            raise _Abort(
                RESOURCE_EXHAUSTED,
                f"Received message larger than max (more than {limit} bytes uncompressed)",
            )
        return out

    def _requests_end(self) -> None:
        if self._done:
            return
        if self._message is not None or self._prefix:
            self._fail(INTERNAL, "the request stream ended inside a message")
        elif self._inbox is not None:
            self._inbox.put(None)
        elif self._task is None:
            if self._request is None:
                self._fail(UNIMPLEMENTED, "no request message for a unary method")
            else:
                self._launch(self._run_unary())

    # --- running ------------------------------------------------------------------------------

    def _launch(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._task = task
        self._server.running.add(task)
        task.add_done_callback(self._server.running.discard)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never reaches its ``except CancelledError``:
        the deadline (or the server's stop) came due in the loop iteration that launched it,
        ahead of the task. The call still needs its status."""
        if task.cancelled():
            self._cancelled()

    async def _run_unary(self) -> None:
        try:
            await self._run(self._unary())
        finally:
            self._request = None
            self._release(self._held)
            if self._pooled is not None:
                self._server.buffers.give_back(self._pooled)
                self._pooled = None

    async def _run_stream(self) -> None:
        await self._run(self._stream())

    async def _run(self, work: Awaitable[None]) -> None:
        """Run the call's work and end the call with its outcome's status."""
        try:
            await work
        except _Abort as exc:
            self._finish(exc.code, exc.details)
            return
        except asyncio.CancelledError:
            self._cancelled()
            return
        except Exception as exc:
            log.exception("unexpected error in a gRPC call")
            self._finish(UNKNOWN, f"Unexpected error in RPC handling: {exc!r}")
            return
        self._finish(OK, "")

    async def _unary(self) -> None:
        method = self._method
        request = self._request
        assert request is not None
        if isinstance(request, _Compressed):
            request = await self._inflate(request.message)
        if method.parse is None:
            parsed: Any = request
        else:
            parsed = method.parse(bytes(request))
        del request  # no view of a pooled buffer may outlive the call
        reply = await method.handle(parsed, self._context)
        del parsed
        body = reply if method.serialize is None else method.serialize(reply)
        if not self._done:
            self._send_headers()
            self._send_message(body)

    async def _stream(self) -> None:
        assert self._inbox is not None
        async for reply in self._method.handle(self._inbox, self._context):
            if self._done:
                break
            self._send_headers()
            self._send_message(reply)
            await self._connection.writable(self._stream_id, STREAM_BACKLOG)

    def _send_headers(self) -> None:
        if not self._headers_sent:
            self._connection.send_headers(self._stream_id, h2.GRPC_RESPONSE_HEADERS)
            self._headers_sent = True

    def _send_message(self, body: bytes | bytearray) -> None:
        prefix = b"\x00" + len(body).to_bytes(4, "big")
        if len(body) < 65536:
            self._connection.send_data(self._stream_id, prefix + body)
        else:  # no copy of a large message to put five bytes in front of it
            self._connection.send_data(self._stream_id, prefix)
            self._connection.send_data(self._stream_id, body)

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
        if self._task is not None and not self._task.done():
            self._task.cancel()
        else:
            self._finish(DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _fail(self, code: int, details: str) -> None:
        """End the call with an error from the transport side: the work, if any, is cancelled."""
        self._finish(code, details)
        if self._task is not None:
            self._task.cancel()

    def _finish(self, code: int, details: str, force: bool = False) -> None:
        if self._done and not force:
            return
        self._done = True
        self._message = None
        self._release(self._held)
        self._stop_timer()
        block = _OK_TRAILERS if code == OK else _status_block(code, details)
        if not self._headers_sent:
            block = h2.GRPC_RESPONSE_HEADERS + block  # trailers-only
        self._connection.send_headers(self._stream_id, block, end_stream=True)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _BufferPool:
    """Large request buffers, kept for reuse.

    A fresh multi-megabyte ``bytearray`` is zero-filled and page-faulted in on every request: a
    fifth of the supervisor's time per 4 MiB call. A buffer comes back only once no view of it
    is left (a bytearray with live views cannot be resized, which is what ``give_back`` tries).
    """

    MIN_SIZE = 256 * 1024
    MAX_SIZE = 16 * 1024 * 1024  # with KEEP, at most 64 MiB kept
    KEEP = 4

    def __init__(self) -> None:
        self._free: list[bytearray] = []

    def take(self, size: int) -> bytearray | None:
        """A kept buffer of at least ``size`` bytes; None (allocate nothing) when none fits."""
        fitting = [b for b in self._free if len(b) >= size]
        if not fitting:
            return None
        buffer = min(fitting, key=len)
        self._free.remove(buffer)
        return buffer

    def give_back(self, buffer: bytearray) -> None:
        if len(buffer) > self.MAX_SIZE:
            return
        try:
            buffer.append(0)
            del buffer[-1]
        except BufferError:
            return  # something still reads it: leave it to the garbage collector
        if len(self._free) >= self.KEEP:
            self._free.remove(min(self._free, key=len))
        self._free.append(buffer)


class NativeGrpcServer:
    """Serves ``inference.GRPCInferenceService`` on the running event loop (see the module).

    ``start`` binds and returns the bound port; ``stop`` refuses new calls (GOAWAY), lets
    running ones finish for up to ``grace`` seconds (None: cancels them at once) and returns.
    """

    def __init__(
        self,
        core: CoreAPI,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        restricted: Mapping[str, tuple[str, str]] | None = None,
        max_concurrent_streams: int = MAX_CONCURRENT_STREAMS,
        limits: FloodLimits | None = None,
        max_connection_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self._core = core
        self._limits = limits or FloodLimits()
        self.max_message_bytes = max_message_bytes
        self._max_streams = max_concurrent_streams
        self._restrictions = Restrictions(restricted or {}, prefix=GRPC_KEY_PREFIX, what="protocol")
        self._servicer: Servicer | None = None
        self._methods: dict[bytes, Method] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[Http2Connection] = set()
        self._budgets: dict[Http2Connection, _Budget] = {}
        #: Request bytes one connection may hold across its calls (at least one message).
        self.max_connection_bytes = max(max_connection_bytes, max_message_bytes)
        self.running: set[asyncio.Task[None]] = set()
        self.buffers = _BufferPool()

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port; or serve ``sock``,
        a socket bound (and listening) already, as a frontend worker does.

        Raises :class:`AddressInUseError` if the address is taken.
        """
        if self._server is not None:
            raise RuntimeError("the gRPC server is already running")
        servicer = Servicer(self._core)
        self._methods = {
            f"/{SERVICE_NAME}/{name}".encode(): method
            for name, method in method_table(servicer, self._restrictions).items()
        }
        if sock is None:
            sock = bind_socket(host, port, what="gRPC")
        bound: int = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(self._connection, sock=sock)
        except BaseException:
            sock.close()
            raise
        self._servicer = servicer
        return bound

    async def stop(self, grace: float | None = None) -> None:
        """Stop; a no-op when not running. Open streams end once their running requests are
        answered, so an idle stream does not hold the shutdown for all of ``grace``."""
        server, servicer = self._server, self._servicer
        self._server = self._servicer = None
        if server is None or servicer is None:
            return
        servicer.close_streams()
        server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.go_away()
        if grace is not None and connections:
            await asyncio.wait([c.closed for c in connections], timeout=grace)
        for connection in list(self._connections):
            connection.close()
        for task in list(self.running):
            task.cancel()
        if self.running:
            await asyncio.wait(list(self.running))
        await server.wait_closed()

    def _connection(self) -> Http2Connection:
        connection = Http2Connection(
            self._open_stream, self._closed, self._max_streams, self._limits
        )
        self._connections.add(connection)
        self._budgets[connection] = _Budget(self.max_connection_bytes)
        return connection

    def _closed(self, connection: Http2Connection) -> None:
        self._connections.discard(connection)
        self._budgets.pop(connection, None)

    def _open_stream(
        self, connection: Http2Connection, stream_id: int, headers: Headers, end_stream: bool
    ) -> StreamHandler | None:
        method_name = path = content_type = timeout = encoding = None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b":method":
                method_name = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
        if method_name != b"POST":
            connection.send_headers(stream_id, h2.status_headers(405), end_stream=True)
            return None
        if content_type is None or not bytes(content_type).startswith(b"application/grpc"):
            connection.send_headers(stream_id, h2.status_headers(415), end_stream=True)
            return None
        method = self._methods.get(bytes(path or b""))
        if method is None:
            block = h2.GRPC_RESPONSE_HEADERS + _status_block(UNIMPLEMENTED, "Method not found!")
            connection.send_headers(stream_id, block, end_stream=True)
            return None
        if encoding == b"identity":
            encoding = None
        budget = self._budgets.get(connection)
        if budget is None:  # a connection that closed meanwhile: nothing to serve
            return None
        call = _Call(self, connection, stream_id, method, headers, encoding, budget)
        call.start(None if timeout is None else _timeout_seconds(timeout))
        if end_stream:
            call.trailers_received()
        return call


def _inflate(message: bytes | bytearray, wbits: int, limit: int) -> bytearray | None:
    """``message`` inflated; None past ``limit`` bytes (checked after each piece).

    Inflated a piece at a time into one growing buffer: zlib releases the GIL while it
    inflates, but one call for the whole message would also assemble its output (a gigabyte
    copy) with the GIL held, stalling the event loop for seconds.
    """
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending: bytes | bytearray = message
    while True:
        piece = inflater.decompress(pending, _INFLATE_PIECE)
        out += piece
        if len(out) > limit:
            return None
        pending = inflater.unconsumed_tail
        if not pending and len(piece) < _INFLATE_PIECE:
            return out


def _timeout_seconds(value: bytes) -> float | None:
    found = _TIMEOUT.match(bytes(value))
    if found is None:
        return None
    return int(found[1]) * _TIMEOUT_UNITS[found[2]]


def _status_block(code: int, details: str) -> bytes:
    block = h2.literal(b"grpc-status", str(code).encode("ascii"))
    if details:
        block += h2.literal(b"grpc-message", _percent_encode(details))
    return block


def _percent_encode(text: str) -> bytes:
    """grpc-message's encoding: UTF-8, with bytes outside printable ASCII and '%' as %XX."""
    out = bytearray()
    for byte in text.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)
