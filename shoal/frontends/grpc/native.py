"""shoal's own gRPC server: ``inference.GRPCInferenceService`` over HTTP/2 on the event loop.

grpcio's asyncio server hands every call between its C++ threads, its poller thread and the
event loop: about thirty system calls and 125-200 µs of CPU per unary call on a small machine,
before shoal runs a line (benchmarks/results/grpc_perf.md). Here the HTTP/2 frames are parsed on
the event loop itself (:mod:`shoal.frontends.h2`), so a call costs one read and one write, as an
HTTP/1.1 request does. The RPCs themselves are the same objects the grpcio server
serves (:func:`shoal.frontends.grpc.methods.method_table`), so both servers behave alike;
``shoal serve --grpc-server grpcio`` still selects grpcio's.

What this module adds on top of HTTP/2 is gRPC's own layer (the gRPC over HTTP/2 protocol):
length-prefixed messages (compressed with ``grpc-encoding`` gzip or deflate, or not), the
``grpc-timeout`` deadline, status and message in trailers, and ``UNIMPLEMENTED`` for unknown
methods. Cleartext only, as the grpcio server shoal starts. This module is the listener and the
dispatch of a new stream to its method; :mod:`~shoal.frontends.grpc.native_call` is one call,
:mod:`~shoal.frontends.grpc.native_messages` its request messages and
:mod:`~shoal.frontends.grpc.native_headers` the headers and trailers gRPC adds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Final

from shoal.core import CoreAPI
from shoal.frontends._forwarding import HeaderForward
from shoal.frontends._restricted import GRPC_KEY_PREFIX, Restrictions
from shoal.frontends._serving import bind_socket
from shoal.frontends.grpc.methods import MAX_MESSAGE_BYTES, SERVICE_NAME, method_table
from shoal.frontends.grpc.native_call import NativeCall
from shoal.frontends.grpc.native_compression import AnswerCompression
from shoal.frontends.grpc.native_context import CallMethod, CallServer
from shoal.frontends.grpc.native_headers import status_block, timeout_seconds
from shoal.frontends.grpc.native_messages import BufferPool, ConnectionBudget
from shoal.frontends.grpc.native_split import ReceiveArena
from shoal.frontends.grpc.servicer import Servicer
from shoal.frontends.grpc.status import Status
from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import MAX_CONCURRENT_STREAMS, Http2Connection
from shoal.frontends.h2.floods import FloodLimits
from shoal.frontends.h2.header_blocks import Headers
from shoal.frontends.h2.reading import read_buffer
from shoal.frontends.h2.streams import StreamHandler

__all__ = ["FloodLimits", "NativeGrpcServer"]

log = logging.getLogger(__name__)

#: The trailers-only answer to a call of a method the server does not have.
_NO_METHOD = h2.GRPC_RESPONSE_HEADERS + status_block(Status.UNIMPLEMENTED, "Method not found!")


#: Header lists whose reading is kept (see _CallHeaders.of).
_KEPT_CALL_HEADERS: Final = 64


class _CallHeaders:
    """What a new stream's headers say about the call."""

    __slots__ = (
        "accepted",
        "content_type",
        "encoding",
        "headers",
        "method",
        "path",
        "refused",
        "timeout",
    )

    def __init__(self, headers: Headers) -> None:
        self.headers = headers
        self.method: bytes | None = None
        self.path = b""  # bytes, not a view: the key of the method's look-up, made once
        self.content_type: bytes | None = None
        self.timeout: bytes | None = None
        self.encoding: bytes | None = None
        self.accepted: bytes | None = None  # grpc-accept-encoding: what answers may be
        for name, value in headers:
            if name == b":path":
                self.path = bytes(value)
            elif name == b":method":
                self.method = value
            elif name == b"content-type":
                self.content_type = value
            elif name == b"grpc-timeout":
                self.timeout = value
            elif name == b"grpc-encoding":
                self.encoding = None if value == b"identity" else value
            elif name == b"grpc-accept-encoding":
                self.accepted = value
        self.refused = self.refusal()

    @staticmethod
    def of(headers: Headers, kept: dict[int, _CallHeaders]) -> _CallHeaders:
        """The reading of ``headers``, kept in ``kept`` by the list's identity: a connection's
        decoder hands the same list for a block it has seen (a client's repeated calls), so
        each call's headers are not read again. A kept reading holds its list: an identity is
        never reused while kept."""
        call = kept.get(id(headers))
        if call is None or call.headers is not headers:
            call = _CallHeaders(headers)
            if len(kept) >= _KEPT_CALL_HEADERS:
                kept.clear()
            kept[id(headers)] = call
        return call

    def refusal(self) -> int | None:
        """The HTTP status that refuses a request that is not a gRPC call; None for a call."""
        if self.method != b"POST":
            return 405
        if self.content_type is None or not bytes(self.content_type).startswith(
            b"application/grpc"
        ):
            return 415
        return None


class NativeGrpcServer:
    """Serves ``inference.GRPCInferenceService`` on the running event loop (see the module).

    ``start`` binds and returns the bound port; ``stop`` refuses new calls (GOAWAY), lets
    running ones finish for up to ``grace`` seconds (None: cancels them at once) and returns.
    ``receive_into``: the arena a frontend worker stages inputs in; large ModelInfer inputs
    are received straight into it (:mod:`~shoal.frontends.grpc.native_split`).
    """

    _servicer: Servicer | None = None
    _server: asyncio.Server | None = None  # the listener, while serving

    def __init__(
        self,
        core: CoreAPI,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        restricted: Mapping[str, tuple[str, str]] | None = None,
        max_concurrent_streams: int = MAX_CONCURRENT_STREAMS,
        limits: FloodLimits | None = None,
        max_connection_bytes: int = MAX_MESSAGE_BYTES,
        receive_into: ReceiveArena | None = None,
        forward: HeaderForward | None = None,
        compression_level: str = "none",
    ) -> None:
        self._core = core
        self._forward = forward
        #: ``--grpc-infer-response-compression-level``: None for ``none``.
        self._compression = AnswerCompression.of(compression_level)
        self._limits = limits or FloodLimits()
        self._max_streams = max_concurrent_streams
        self._restrictions = Restrictions(restricted or {}, prefix=GRPC_KEY_PREFIX, what="protocol")
        self._calls = CallServer(max_message_bytes, BufferPool(), receive_into)
        self._methods: dict[bytes, CallMethod] = {}
        self._connections: set[Http2Connection] = set()
        self._budgets: dict[Http2Connection, ConnectionBudget] = {}
        self._reads = read_buffer()  # what every connection's transport reads into
        self._call_headers: dict[int, _CallHeaders] = {}  # see _CallHeaders.of
        #: Request bytes one connection may hold across its calls (at least one message).
        self.max_connection_bytes = max(max_connection_bytes, max_message_bytes)

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port; or serve ``sock``,
        a socket bound (and listening) already, as a frontend worker does.

        Raises :class:`AddressInUseError` if the address is taken.
        """
        if self._servicer is not None:
            raise RuntimeError("the gRPC server is already running")
        servicer = Servicer(self._core, self._forward)
        self._methods = self._method_paths(servicer)
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

    def start_unbound(self) -> Callable[[], Http2Connection]:
        """Serve only the connections whose protocols the returned factory makes: a frontend
        worker's, which the core accepts and deals (``workers/dealing.py``)."""
        if self._servicer is not None:
            raise RuntimeError("the gRPC server is already running")
        self._servicer = Servicer(self._core, self._forward)
        self._methods = self._method_paths(self._servicer)
        return self._connection

    def _method_paths(self, servicer: Servicer) -> dict[bytes, CallMethod]:
        """Each method by the ``:path`` its calls carry."""
        return {
            f"/{SERVICE_NAME}/{name}".encode(): CallMethod(method, stepped=name == "ModelInfer")
            for name, method in method_table(
                servicer, self._restrictions, lent_replies=True
            ).items()
        }

    async def stop(self, grace: float | None = None) -> None:
        """Stop; a no-op when not running. Open streams end once their running requests are
        answered, so an idle stream does not hold the shutdown for all of ``grace``."""
        server, servicer = self._server, self._servicer
        self._server = self._servicer = None
        if servicer is None:
            return
        servicer.close_streams()
        if server is not None:
            server.close()
        await self._close_connections(grace)
        await self._cancel_calls()
        if server is not None:
            await server.wait_closed()

    async def _close_connections(self, grace: float | None) -> None:
        """GOAWAY on every connection; close them once their streams end, or after ``grace``."""
        connections = list(self._connections)
        for connection in connections:
            connection.go_away()
        if grace is not None and connections:
            await asyncio.wait([c.closed for c in connections], timeout=grace)
        for connection in list(self._connections):
            connection.close()

    async def _cancel_calls(self) -> None:
        tasks = [task for call in list(self._calls.running) if (task := call.stop()) is not None]
        if tasks:
            await asyncio.wait(tasks)

    def _connection(self) -> Http2Connection:
        connection = Http2Connection(
            self._open_stream, self._closed, self._max_streams, self._limits, self._reads
        )
        self._connections.add(connection)
        self._budgets[connection] = ConnectionBudget(self.max_connection_bytes)
        return connection

    def _closed(self, connection: Http2Connection) -> None:
        self._connections.discard(connection)
        self._budgets.pop(connection, None)

    def _open_stream(
        self, connection: Http2Connection, stream_id: int, headers: Headers, end_stream: bool
    ) -> StreamHandler | None:
        call = _CallHeaders.of(headers, self._call_headers)
        method = self._methods.get(call.path)
        if method is None or call.refused is not None:
            connection.send_headers(stream_id, _refusal(call), end_stream=True)
            return None
        budget = self._budgets.get(connection)
        if budget is None:  # the connection closed meanwhile
            return None
        handler = NativeCall(
            self._calls, connection, stream_id, method, headers, call.encoding, budget
        )
        if self._compression is not None:
            handler.squeeze = self._compression.for_call(call.path, call.accepted)
        handler.start(None if call.timeout is None else timeout_seconds(call.timeout))
        if end_stream:
            handler.trailers_received()
        return handler


def _refusal(call: _CallHeaders) -> bytes:
    """The header block that answers a stream that is no call of ours at once: HTTP 405 or 415
    for a request that is not a gRPC call, else UNIMPLEMENTED (an unknown method)."""
    status = call.refused
    return _NO_METHOD if status is None else h2.status_headers(status)
