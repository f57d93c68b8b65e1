"""The gRPC frontend: KServe V2 ``inference.GRPCInferenceService``, compatible with Triton's.

:func:`build_grpc_handler` registers every RPC under the exact service name clients call
(``/inference.GRPCInferenceService/<Method>``) with ``grpc.method_handlers_generic_handler``, so
``tritonclient.grpc`` and stubs generated from Triton's proto work unchanged. The messages are
shoal's own (:mod:`shoal.protos.grpc_service_pb2`, wire-compatible with Triton's). What each RPC
does is in :mod:`shoal.frontends._grpc_servicer`; this module only maps errors and serves.

:class:`GrpcServer` serves the handler with ``grpc.aio`` on the running event loop. Core errors
end an RPC with the status of :data:`GRPC_STATUS`, the one table that maps error codes to gRPC
statuses, and the core's message as details. On ModelStreamInfer a failed request is reported in
its response's ``error_message`` instead, and the stream goes on.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
)
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError

from shoal.frontends._grpc_servicer import Servicer, unexpected
from shoal.frontends._h2_connection import FloodLimits
from shoal.frontends._restricted import GRPC_GROUPS, GRPC_KEY_PREFIX, Restrictions
from shoal.frontends._serving import AddressInUseError
from shoal.protos import grpc_service_pb2 as pb
from shoal.supervisor.core import CoreAPI, ErrorCode, InvalidArgument, ShoalError

__all__ = [
    "GRPC_STATUS",
    "MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "AddressInUseError",
    "GrpcServer",
    "build_grpc_handler",
]

#: The service name clients call; shoal's messages live in ``shoal.inference`` (see
#: docs/decisions.md), but the service keeps Triton's name.
SERVICE_NAME = "inference.GRPCInferenceService"

#: Largest message received or sent: as Triton and tritonclient, INT32_MAX.
MAX_MESSAGE_BYTES = 2**31 - 1

#: gRPC status of each core error code, as Triton's (TRITONSERVER_Error_Code -> grpc::StatusCode).
GRPC_STATUS: Mapping[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}

_Behavior = Callable[[Any], Awaitable[Any]]


def _unary_methods(servicer: Servicer) -> dict[str, tuple[type[Any], type[Any], _Behavior]]:
    """Method name -> (request class, response class, behaviour) of every message-based RPC."""
    s = servicer
    return {
        "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse, s.server_live),
        "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse, s.server_ready),
        "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse, s.model_ready),
        "ServerMetadata": (
            pb.ServerMetadataRequest,
            pb.ServerMetadataResponse,
            s.server_metadata,
        ),
        "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse, s.model_metadata),
        "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse, s.model_config),
        "ModelStatistics": (
            pb.ModelStatisticsRequest,
            pb.ModelStatisticsResponse,
            s.model_statistics,
        ),
        "RepositoryIndex": (
            pb.RepositoryIndexRequest,
            pb.RepositoryIndexResponse,
            s.repository_index,
        ),
        "RepositoryModelLoad": (
            pb.RepositoryModelLoadRequest,
            pb.RepositoryModelLoadResponse,
            s.repository_model_load,
        ),
        "RepositoryModelUnload": (
            pb.RepositoryModelUnloadRequest,
            pb.RepositoryModelUnloadResponse,
            s.repository_model_unload,
        ),
        "SystemSharedMemoryStatus": (
            pb.SystemSharedMemoryStatusRequest,
            pb.SystemSharedMemoryStatusResponse,
            s.system_shared_memory_status,
        ),
        "SystemSharedMemoryRegister": (
            pb.SystemSharedMemoryRegisterRequest,
            pb.SystemSharedMemoryRegisterResponse,
            s.system_shared_memory_register,
        ),
        "SystemSharedMemoryUnregister": (
            pb.SystemSharedMemoryUnregisterRequest,
            pb.SystemSharedMemoryUnregisterResponse,
            s.system_shared_memory_unregister,
        ),
        "CudaSharedMemoryStatus": (
            pb.CudaSharedMemoryStatusRequest,
            pb.CudaSharedMemoryStatusResponse,
            s.cuda_shared_memory_status,
        ),
        "CudaSharedMemoryRegister": (
            pb.CudaSharedMemoryRegisterRequest,
            pb.CudaSharedMemoryRegisterResponse,
            s.cuda_shared_memory_register,
        ),
        "CudaSharedMemoryUnregister": (
            pb.CudaSharedMemoryUnregisterRequest,
            pb.CudaSharedMemoryUnregisterResponse,
            s.cuda_shared_memory_unregister,
        ),
        "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse, s.trace_setting),
        "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse, s.log_settings),
    }


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
    return _generic_handler(Servicer(core), _restrictions(restricted))


def _restrictions(restricted: Mapping[str, tuple[str, str]] | None) -> Restrictions:
    return Restrictions(restricted or {}, prefix=GRPC_KEY_PREFIX, what="protocol")


@dataclass(frozen=True)
class Method:
    """One RPC: how its request is parsed, its behaviour, how its reply is serialized.

    ``parse`` and ``serialize`` are None for ModelInfer and ModelStreamInfer, which take and
    return serialized bytes. A unary ``handle`` takes the request and a context with grpc.aio's
    ``abort`` and ``invocation_metadata``; a streaming one takes the request messages too.
    """

    streaming: bool
    parse: Callable[[bytes | bytearray], Any] | None
    serialize: Callable[[Any], bytes] | None
    handle: Callable[[Any, Any], Any]


def method_table(servicer: Servicer, restrictions: Restrictions) -> dict[str, Method]:
    """Every RPC of the service by method name, guarded (errors become ``context.abort``)."""
    methods = {
        name: Method(
            False,
            _parser(request_type),
            response_type.SerializeToString,
            _guarded(behavior, name, restrictions),
        )
        for name, (request_type, response_type, behavior) in _unary_methods(servicer).items()
    }
    methods["ModelInfer"] = Method(
        False, None, None, _guarded(servicer.model_infer, "ModelInfer", restrictions)
    )
    methods["ModelStreamInfer"] = Method(
        True, None, None, _guarded_stream(servicer.model_stream_infer, restrictions)
    )
    return methods


def _generic_handler(servicer: Servicer, restrictions: Restrictions) -> Any:
    handlers = {}
    for name, method in method_table(servicer, restrictions).items():
        if method.streaming:
            handlers[name] = grpc.stream_stream_rpc_method_handler(method.handle)
        else:
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                method.handle,
                request_deserializer=method.parse,
                response_serializer=method.serialize,
            )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


# --- errors -----------------------------------------------------------------------------------


async def _abort(context: Any, error: ShoalError) -> None:
    await context.abort(GRPC_STATUS.get(error.code, grpc.StatusCode.INTERNAL), error.message)


def _parser(request_type: type[Any]) -> Callable[[bytes | bytearray], Any]:
    """``request_type.FromString``, with an undecodable message as an error for the handler
    (gRPC would answer UNKNOWN to a deserializer's exception)."""

    def parse(data: bytes | bytearray) -> Any:
        try:
            return request_type.FromString(data)
        except DecodeError as exc:
            return InvalidArgument(f"failed to parse the request message: {exc}")

    return parse


def _check(restrictions: Restrictions, group: str, context: Any) -> None:
    """PERMISSION_DENIED unless the call may use ``group`` (see :mod:`._restricted`)."""
    if restrictions.restricts(group):
        restrictions.check(group, context.invocation_metadata() or ())


def _guarded(
    behavior: _Behavior, name: str, restrictions: Restrictions
) -> Callable[[Any, Any], Awaitable[Any]]:
    group = GRPC_GROUPS[name]

    async def handle(request: Any, context: Any) -> Any:
        try:
            _check(restrictions, group, context)
            if isinstance(request, ShoalError):
                raise request
            return await behavior(request)
        except ShoalError as exc:
            error = exc
        except Exception:
            error = unexpected(name)
        await _abort(context, error)  # raises: the RPC ends with the error's status

    return handle


def _guarded_stream(
    behavior: Callable[[AsyncIterable[bytes]], AsyncGenerator[bytes, None]],
    restrictions: Restrictions,
) -> Callable[[AsyncIterable[bytes], Any], AsyncIterator[bytes]]:
    async def handle(requests: AsyncIterable[bytes], context: Any) -> AsyncIterator[bytes]:
        try:
            _check(restrictions, GRPC_GROUPS["ModelStreamInfer"], context)
            async with contextlib.aclosing(behavior(requests)) as replies:
                async for reply in replies:
                    yield reply
            return
        except ShoalError as exc:
            error = exc
        except Exception:
            error = unexpected("ModelStreamInfer")
        await _abort(context, error)

    return handle


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
    ) -> None:
        self._core = core
        self._max_message_bytes = max_message_bytes
        self._limits = limits or FloodLimits()
        self._restrictions = _restrictions(restricted)
        self._server: Any = None
        self._servicer: Servicer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port.

        Raises :class:`AddressInUseError` if the address is taken.
        """
        if self._server is not None:
            raise RuntimeError("the gRPC server is already running")
        servicer = Servicer(self._core)
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
            # Without this, gRPC binds with SO_REUSEPORT: a second server on a port in use would
            # start, and share the port, instead of failing.
            ("grpc.so_reuseport", 0),
        ]


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
            return AddressInUseError(
                errno.EADDRINUSE, f"the gRPC address {host}:{port} is already in use"
            )
        return OSError(f"cannot bind the gRPC server to {host}:{port}: {exc}")
    return OSError(f"cannot bind the gRPC server to {host}:{port}")
