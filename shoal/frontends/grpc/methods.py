"""The RPCs of ``inference.GRPCInferenceService``: each method's parsing, behaviour, error
mapping and reply serialization, shared by both servers (no grpcio import).

A server calls :attr:`Method.handle` with a :class:`CallContext`: the call's metadata and an
``abort`` that ends the call with a :class:`~shoal.frontends.grpc.status.Status`.
"""

from __future__ import annotations

import contextlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from shoal.core import InvalidArgument, ShoalError
from shoal.frontends._forwarding import HeaderForward
from shoal.frontends._restricted import GRPC_GROUPS, GRPC_KEY_PREFIX, Restrictions
from shoal.frontends.grpc.infer_call import InferCall
from shoal.frontends.grpc.servicer import Servicer, unexpected
from shoal.frontends.grpc.status import GRPC_STATUS, Status
from shoal.protos import grpc_service_pb2 as pb

__all__ = [
    "MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "CallContext",
    "Method",
    "method_table",
    "restrictions",
]


class CallContext(Protocol):
    """What an RPC's behaviour needs of its server: the call's metadata, and ending it."""

    def invocation_metadata(self) -> Sequence[tuple[str, str]] | None: ...

    async def abort(self, code: Status, details: str) -> None:
        """End the call with ``code`` and ``details``; raises."""
        ...


#: The service name clients call; shoal's messages live in ``shoal.inference`` (see
#: docs/decisions.md), but the service keeps Triton's name.
SERVICE_NAME = "inference.GRPCInferenceService"

#: Largest message received or sent: as Triton and tritonclient, INT32_MAX.
MAX_MESSAGE_BYTES = 2**31 - 1

_Behavior = Callable[[Any], Awaitable[Any]]


_Methods = dict[str, tuple[type[Any], type[Any], _Behavior]]


def _unary_methods(servicer: Servicer) -> _Methods:
    """Method name -> (request class, response class, behaviour) of every message-based RPC."""
    return {
        **_health_methods(servicer),
        **_metadata_methods(servicer),
        **_repository_methods(servicer),
        **_system_shm_methods(servicer),
        **_cuda_shm_methods(servicer),
        **_settings_methods(servicer),
    }


def _health_methods(s: Servicer) -> _Methods:
    """The RPCs of health and readiness."""
    return {
        "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse, s.server_live),
        "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse, s.server_ready),
        "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse, s.model_ready),
    }


def _metadata_methods(s: Servicer) -> _Methods:
    """The RPCs of metadata, configuration and statistics."""
    return {
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
    }


def _repository_methods(s: Servicer) -> _Methods:
    """The RPCs of the model repository."""
    return {
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
    }


def _system_shm_methods(s: Servicer) -> _Methods:
    """The RPCs of system shared memory."""
    return {
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
    }


def _cuda_shm_methods(s: Servicer) -> _Methods:
    """The RPCs of CUDA shared memory."""
    return {
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
    }


def _settings_methods(s: Servicer) -> _Methods:
    """The RPCs of trace and log settings."""
    return {
        "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse, s.trace_setting),
        "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse, s.log_settings),
    }


def restrictions(restricted: Mapping[str, tuple[str, str]] | None) -> Restrictions:
    return Restrictions(restricted or {}, prefix=GRPC_KEY_PREFIX, what="protocol")


@dataclass(frozen=True)
class Method:
    """One RPC: how its request is parsed, its behaviour, how its reply is serialized.

    ``parse`` and ``serialize`` are None for ModelInfer and ModelStreamInfer, which take and
    return serialized bytes. A unary ``handle`` takes the request and a context with grpc.aio's
    ``abort`` and ``invocation_metadata``; a streaming one takes the request messages too.
    ``split``: the request may come received in parts (ModelInfer on shoal's own server, see
    ``native_split``).
    """

    streaming: bool
    parse: Callable[[bytes | bytearray], Any] | None
    serialize: Callable[[Any], bytes] | None
    handle: Callable[[Any, Any], Any]
    split: bool = False


def method_table(
    servicer: Servicer, restrictions: Restrictions, *, lent_replies: bool = False
) -> dict[str, Method]:
    """Every RPC of the service by method name, guarded (errors become ``context.abort``).
    ``lent_replies``: ModelInfer returns a :class:`~shoal.frontends.grpc.infer_call.LentReply`
    (shoal's own server writes it without a copy) instead of bytes, and runs compiled
    (:class:`~shoal.frontends.grpc.infer_call.InferCall`, the same guard written out)."""
    methods = {
        name: Method(
            False,
            _parser(request_type),
            response_type.SerializeToString,
            _guarded(behavior, name, restrictions),
        )
        for name, (request_type, response_type, behavior) in _unary_methods(servicer).items()
    }
    forward = servicer.forward
    if lent_replies:
        infer = InferCall(servicer.core, restrictions, forward)
        handle: Callable[[Any, Any], Awaitable[Any]] = infer.handle
    elif forward is not None:
        handle = _forwarding_infer(servicer, restrictions, forward)
    else:
        handle = _guarded(servicer.model_infer, "ModelInfer", restrictions)
    methods["ModelInfer"] = Method(False, None, None, handle, split=True)
    methods["ModelStreamInfer"] = Method(
        True, None, None, _guarded_stream(servicer.model_stream_infer, restrictions, forward)
    )
    return methods


# --- errors -----------------------------------------------------------------------------------


async def _abort(context: CallContext, error: ShoalError) -> None:
    await context.abort(GRPC_STATUS.get(error.code, Status.INTERNAL), error.message)


def _parser(request_type: type[Any]) -> Callable[[bytes | bytearray], Any]:
    """``request_type.FromString``, with an undecodable message as an error for the handler
    (gRPC would answer UNKNOWN to a deserializer's exception)."""

    def parse(data: bytes | bytearray) -> Any:
        try:
            return request_type.FromString(data)
        except DecodeError as exc:
            return InvalidArgument(f"failed to parse the request message: {exc}")

    return parse


def _check(restrictions: Restrictions, group: str, context: CallContext) -> None:
    """PERMISSION_DENIED unless the call may use ``group`` (see ``frontends/_restricted.py``)."""
    if restrictions.restricts(group):
        restrictions.check(group, context.invocation_metadata() or ())


def _guarded(
    behavior: _Behavior, name: str, restrictions: Restrictions
) -> Callable[[Any, Any], Awaitable[Any]]:
    group = GRPC_GROUPS[name]

    async def handle(request: Any, context: CallContext) -> Any:
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


def _forwarding_infer(
    servicer: Servicer, restrictions: Restrictions, forward: HeaderForward
) -> Callable[[Any, Any], Awaitable[Any]]:
    """ModelInfer with the call's metadata that ``forward`` picks as request parameters."""

    async def handle(data: Any, context: CallContext) -> Any:
        try:
            _check(restrictions, GRPC_GROUPS["ModelInfer"], context)
            forwarded = forward.matching(context.invocation_metadata() or ())
            return await servicer.model_infer(data, forwarded)
        except ShoalError as exc:
            error = exc
        except Exception:
            error = unexpected("ModelInfer")
        await _abort(context, error)

    return handle


def _closes_on_error(context: CallContext) -> bool:
    """Triton's ``triton_grpc_error: true`` stream metadata: an error ends the stream with
    its gRPC status."""
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "triton_grpc_error":
            return str(value).strip().lower() == "true"
    return False


def _guarded_stream(
    behavior: Callable[..., AsyncGenerator[bytes, None]],
    restrictions: Restrictions,
    forward: HeaderForward | None = None,
) -> Callable[[AsyncIterable[bytes], Any], AsyncIterator[bytes]]:
    async def handle(requests: AsyncIterable[bytes], context: CallContext) -> AsyncIterator[bytes]:
        try:
            _check(restrictions, GRPC_GROUPS["ModelStreamInfer"], context)
            close = _closes_on_error(context)
            forwarded = None
            if forward is not None:
                forwarded = forward.matching(context.invocation_metadata() or ())
            answers = behavior(requests, close_on_error=close, forwarded=forwarded)
            async with contextlib.aclosing(answers) as replies:
                async for reply in replies:
                    yield reply
            return
        except ShoalError as exc:
            error = exc
        except Exception:
            error = unexpected("ModelStreamInfer")
        await _abort(context, error)

    return handle
