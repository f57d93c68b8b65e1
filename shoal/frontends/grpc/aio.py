"""The gRPC frontend: KServe V2 ``inference.GRPCInferenceService``, compatible with Triton's.

:func:`build_grpc_handler` registers every RPC under the exact service name clients call
(``/inference.GRPCInferenceService/<Method>``) with ``grpc.method_handlers_generic_handler``, so
``tritonclient.grpc`` and stubs generated from Triton's proto work unchanged. The messages are
shoal's own (:mod:`shoal.protos.grpc_service_pb2`, wire-compatible with Triton's). What each RPC
does is in :mod:`shoal.frontends.grpc.methods` (shared with the native server); this module only
serves. Only this module imports grpcio; ``shoal serve`` imports it for ``--grpc-server grpcio``.

:class:`GrpcServer` serves the handler with ``grpc.aio`` on the running event loop. Core errors
end an RPC with the status of :data:`~shoal.frontends.grpc.status.GRPC_STATUS`, the one table
that maps error codes to gRPC statuses, and the core's message as details. On ModelStreamInfer a
failed request is reported in its response's ``error_message`` instead, and the stream goes on.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]

from shoal.core import CoreAPI
from shoal.frontends._forwarding import HeaderForward
from shoal.frontends._restricted import Restrictions
from shoal.frontends._serving import AddressInUseError, address_in_use
from shoal.frontends.grpc.methods import (
    MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    Method,
    method_table,
    restrictions,
)
from shoal.frontends.grpc.native_compression import LEVELS
from shoal.frontends.grpc.native_headers import cut_message
from shoal.frontends.grpc.servicer import Servicer
from shoal.frontends.grpc.status import Status
from shoal.frontends.h2.floods import FloodLimits

__all__ = ["AddressInUseError", "GrpcServer", "build_grpc_handler"]


def build_grpc_handler(
    core: CoreAPI, *, restricted: Mapping[str, tuple[str, str]] | None = None
) -> Any:
    """The ``grpc.GenericRpcHandler`` of ``inference.GRPCInferenceService`` over ``core``.

    ModelInfer and ModelStreamInfer take and return serialized bytes (no (de)serializer): their
    behaviours slice tensor bytes out of the request without copies and release the core's
    response once the reply is serialized. ``restricted`` maps a protocol group (see
    :mod:`shoal.frontends._restricted`) to the key and value its calls must carry
    (``--grpc-restricted-protocol``; the metadata key is ``triton-grpc-protocol-<key>``).
    """
    return _generic_handler(Servicer(core), restrictions(restricted))


def _generic_handler(servicer: Servicer, restrictions: Restrictions) -> Any:
    methods = method_table(servicer, restrictions)
    handlers = {name: _method_handler(method) for name, method in methods.items()}
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def _method_handler(method: Method) -> Any:
    if method.streaming:
        return grpc.stream_stream_rpc_method_handler(_aio_stream(method.handle))
    return grpc.unary_unary_rpc_method_handler(
        _aio_unary(method.handle),
        request_deserializer=method.parse,
        response_serializer=method.serialize,
    )


class _AioContext:
    """A grpc.aio context as the :class:`~shoal.frontends.grpc.methods.CallContext` of a call."""

    __slots__ = ("_context",)

    def __init__(self, context: Any) -> None:
        self._context = context

    def invocation_metadata(self) -> Sequence[tuple[str, str]] | None:
        metadata: Sequence[tuple[str, str]] | None = self._context.invocation_metadata()
        return metadata

    async def abort(self, code: Status, details: str) -> None:
        await self._context.abort(grpc.StatusCode[code.name], cut_message(details))


def _aio_unary(handle: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def call(request: Any, context: Any) -> Any:
        return await handle(request, _AioContext(context))

    return call


def _aio_stream(
    handle: Callable[[Any, Any], Any],
) -> Callable[[AsyncIterable[bytes], Any], AsyncIterator[bytes]]:
    async def call(requests: AsyncIterable[bytes], context: Any) -> AsyncIterator[bytes]:
        async with contextlib.aclosing(handle(requests, _AioContext(context))) as replies:
            async for reply in replies:
                yield reply

    return call


# --- serving ----------------------------------------------------------------------------------


class GrpcServer:
    """Serves :func:`build_grpc_handler` with ``grpc.aio`` on the running event loop.

    ``start`` binds and returns the bound port; ``stop`` stops accepting RPCs, lets running ones
    finish for up to ``grace`` seconds (None: cancels them at once) and returns. It installs no
    signal handlers: the CLI owns signals and calls :meth:`stop`.
    """

    def __init__(
        self,
        core: CoreAPI,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        restricted: Mapping[str, tuple[str, str]] | None = None,
        limits: FloodLimits | None = None,
        reuse_port: bool = False,
        forward: HeaderForward | None = None,
        compression_level: str = "none",
    ) -> None:
        self._core = core
        self._forward = forward
        #: grpc-core's level (``--grpc-infer-response-compression-level``); 0: none.
        self._compression_level = LEVELS[compression_level]
        #: Frontend workers each bind the same port (grpcio cannot serve an inherited socket).
        self._reuse_port = reuse_port
        self._max_message_bytes = max_message_bytes
        self._limits = limits or FloodLimits()
        self._restrictions = restrictions(restricted)
        self._server: Any = None
        self._servicer: Servicer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port.

        Raises :class:`AddressInUseError` if the address is taken.
        """
        if self._server is not None:
            raise RuntimeError("the gRPC server is already running")
        servicer = Servicer(self._core, self._forward)
        server = grpc.aio.server(options=self._options())
        server.add_generic_rpc_handlers((_generic_handler(servicer, self._restrictions),))
        bound = _bind(server, host, port)
        await server.start()
        self._server, self._servicer = server, servicer
        return bound

    async def stop(self, grace: float | None = None) -> None:
        """Stop; a no-op when not running. Open streams end once their running requests are
        answered, so an idle stream does not hold the shutdown for all of ``grace``."""
        server, servicer = self._server, self._servicer
        self._server = self._servicer = None
        if server is None or servicer is None:
            return
        servicer.close_streams()
        await server.stop(grace)

    def _options(self) -> list[tuple[str, int]]:
        limits = self._limits  # grpc-core's ping policy; it has its own flood defenses
        return [
            ("grpc.max_receive_message_length", self._max_message_bytes),
            ("grpc.max_send_message_length", self._max_message_bytes),
            ("grpc.http2.max_ping_strikes", limits.max_ping_strikes),
            ("grpc.http2.min_ping_interval_without_data_ms", int(limits.min_ping_interval * 1000)),
            ("grpc.keepalive_permit_without_calls", int(limits.permit_pings_without_calls)),
            ("grpc.keepalive_time_ms", int(limits.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(limits.keepalive_timeout * 1000)),
            ("grpc.http2.max_pings_without_data", limits.max_pings_without_data),
            *_age_options(limits),
            # Without this, gRPC binds with SO_REUSEPORT: a second server on a port in use would
            # start, and share the port, instead of failing.
            ("grpc.so_reuseport", int(self._reuse_port)),
            *_compression_options(self._compression_level),
        ]


def _compression_options(level: int) -> list[tuple[str, int]]:
    """The answers' compression level, if any: grpc-core picks an algorithm the client accepts,
    as for Triton; but for the answers of every method, where Triton compresses only
    ModelInfer's and ModelStreamInfer's (grpcio sets a level per server, not per method)."""
    return [("grpc.default_compression_level", level)] if level else []


def _age_options(limits: FloodLimits) -> list[tuple[str, int]]:
    """The connection age options, as Triton sets them: only those given (0: grpc's default,
    no limit)."""
    ages = [("grpc.max_connection_age_ms", limits.max_age)]
    ages.append(("grpc.max_connection_age_grace_ms", limits.max_age_grace))
    return [(name, int(seconds * 1000)) for name, seconds in ages if seconds]


def _bind(server: Any, host: str, port: int) -> int:
    address = f"[{host}]:{port}" if ":" in host else f"{host or '0.0.0.0'}:{port}"
    try:
        bound: int = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise _bind_error(host, port)
    return bound


def _bind_error(host: str, port: int) -> OSError:
    """Why gRPC could not bind (it does not say): find out by binding a socket ourselves."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return address_in_use("gRPC", host, port)
        return OSError(f"cannot bind the gRPC server to {host}:{port}: {exc}")
    return OSError(f"cannot bind the gRPC server to {host}:{port}")
