"""What each RPC of ``inference.GRPCInferenceService`` does: messages in, core calls, messages out.

Every method takes a request message and returns a response message, or raises a
:class:`~shoal.core.ShoalError` that :mod:`shoal.frontends.grpc.methods` maps to a status. The
inference methods take and return serialized bytes instead (see :mod:`shoal.frontends.grpc._infer`
for why). Nothing here imports gRPC.

Extension methods (statistics, repository, shared memory, logging) call the core's
:class:`~shoal.core.ExtensionAPI`; one that raises ``NotImplementedError`` is UNSUPPORTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterator

from google.protobuf import json_format

from shoal.core import (
    CoreAPI,
    InferResponse,
    InternalError,
    ShoalError,
    Unsupported,
)
from shoal.core.versions import check_version
from shoal.frontends._failed_log import infer_failed
from shoal.frontends._forwarding import HeaderForward
from shoal.frontends.grpc import _extensions as ext
from shoal.frontends.grpc._infer import (
    DecodedInfer,
    decode_infer_request,
    encode_infer_response,
    stream_error,
    stream_response_chunks,
)
from shoal.frontends.grpc._stream import Answer, InOrder, answer_stream
from shoal.protos import grpc_service_pb2 as pb

_logger = logging.getLogger("shoal.frontends.grpc")

#: Models a stream remembers whether each is decoupled (past it, it asks the core each time).
_MODELS_KNOWN = 256
#: How long a stream trusts what it was told of a model's being decoupled before it asks the
#: core again: a model reloaded decoupled (or not) is served so within it.
_KNOWN_SECS = 1.0


def unexpected(what: str) -> InternalError:
    """Log the exception being handled; the error the client gets instead of it."""
    _logger.exception("unexpected error while serving %s", what)
    return InternalError(f"internal error while serving {what}; see the server log")


def _model_version(version: str) -> str:
    check_version(version)
    return version


@contextlib.contextmanager
def _extension_call(what: str) -> Iterator[None]:
    try:
        yield
    except NotImplementedError:
        raise Unsupported(f"{what} is not supported by this server yet") from None


class Servicer:
    """The RPCs over one :class:`~shoal.core.api.CoreAPI`."""

    def __init__(self, core: CoreAPI, forward: HeaderForward | None = None) -> None:
        self._core = core
        self._closing = asyncio.Event()
        #: ``--grpc-header-forward-pattern``: the metadata inference requests get as parameters.
        self.forward = forward

    @property
    def core(self) -> CoreAPI:
        return self._core

    def close_streams(self) -> None:
        """Let every open ModelStreamInfer stream end once its running requests are answered."""
        self._closing.set()

    # -- health and metadata ---------------------------------------------------------------

    async def server_live(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._core.is_live())

    async def server_ready(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._core.is_ready())

    async def model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        version = _model_version(request.version)
        return pb.ModelReadyResponse(ready=await self._core.model_ready_now(request.name, version))

    async def server_metadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        metadata = self._core.server_metadata()
        return pb.ServerMetadataResponse(
            name=metadata.name, version=metadata.version, extensions=metadata.extensions
        )

    async def model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        metadata = self._core.model_metadata(request.name, _model_version(request.version))
        response = pb.ModelMetadataResponse(
            name=metadata.name, versions=metadata.versions, platform=metadata.platform
        )
        for tensors, target in (
            (metadata.inputs, response.inputs),
            (metadata.outputs, response.outputs),
        ):
            for tensor in tensors:
                target.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        return response

    async def model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        config = self._core.model_config(request.name, _model_version(request.version))
        response = pb.ModelConfigResponse()
        try:
            json_format.ParseDict(config, response.config, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise InternalError(
                f"the configuration of model '{request.name}' cannot be sent: {exc}"
            ) from None
        return response

    # -- inference -------------------------------------------------------------------------

    async def model_infer(
        self, data: bytes | bytearray | memoryview, forwarded: dict[str, str] | None = None
    ) -> bytes:
        """``forwarded``: the call's metadata :attr:`forward` picked, added to the parameters."""
        request_id = ""
        try:
            decoded = decode_infer_request(data)
            request_id = decoded.request.id
            if forwarded:
                decoded.request.parameters.update(forwarded)
            response = await self._core.infer(decoded.request)
        except ShoalError as exc:
            infer_failed(request_id, exc.message)
            raise
        try:
            return b"".join(encode_infer_response(response, decoded))
        finally:
            response.release()  # the message is a copy: give the shared memory back

    def model_stream_infer(
        self,
        requests: AsyncIterable[bytes],
        *,
        close_on_error: bool = False,
        forwarded: dict[str, str] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """``close_on_error`` (the client's ``triton_grpc_error: true`` metadata, as in Triton):
        the first error ends the whole stream with its gRPC status, instead of travelling in
        a response's ``error_message``. ``forwarded``: parameters every request gets."""
        decoupled: dict[tuple[str, str], tuple[bool, float]] = {}  # and until when it holds
        answer: Answer = functools.partial(
            self._stream_answer, decoupled, close_on_error, forwarded
        )
        return answer_stream(requests, answer, self._closing)

    def _stream_answer(
        self,
        decoupled: dict[tuple[str, str], tuple[bool, float]],
        close_on_error: bool,
        forwarded: dict[str, str] | None,
        data: bytes | bytearray | memoryview,
    ) -> AsyncIterator[bytes] | InOrder:
        """The replies to one request: as in Triton, those of a model that is not decoupled
        are written in the order of the stream's requests, a decoupled model's as they come."""
        try:
            decoded = decode_infer_request(data)
        except Exception as exc:
            return InOrder(_one(_stream_failure(exc, None, close_on_error)))
        if forwarded:
            decoded.request.parameters.update(forwarded)
        replies = self._stream_replies(decoded, close_on_error)
        key = (decoded.request.model_name, decoded.request.model_version)
        known = decoupled.get(key)
        if known is not None and time.monotonic() < known[1]:
            return replies if known[0] else InOrder(replies)
        # Asked without holding the event loop (a worker's question travels to the core).
        return InOrder(replies, functools.partial(self._decoupled, decoupled, key))

    async def _decoupled(
        self, known: dict[tuple[str, str], tuple[bool, float]], key: tuple[str, str]
    ) -> bool:
        try:
            decoupled = await self._core.model_decoupled(*key)
        except ShoalError:  # the core is going away: the request's answer (its error) in order
            decoupled = False
        if len(known) < _MODELS_KNOWN or key in known:
            known[key] = (decoupled, time.monotonic() + _KNOWN_SECS)
        return decoupled

    async def _stream_replies(
        self, decoded: DecodedInfer, close_on_error: bool
    ) -> AsyncIterator[bytes]:
        """Every response of one request (several for a decoupled model), each sent as soon as
        the model sends it, with ``triton_final_response`` saying whether it is the last. A
        decoupled model that ends with the final flag alone ends the stream with an empty
        response only if the client asked for one (``enable_empty_final_response``), as in
        Triton."""
        try:
            ended = False
            async for response in self._core.infer_stream(decoded.request):
                ended = response.final
                yield self._stream_message(response, decoded, close_on_error)
            if not ended and decoded.final_response_flag:
                empty = InferResponse(decoded.request.model_name, "", decoded.request.id)
                yield self._stream_reply(empty, decoded, final=True)
        except Exception as exc:
            yield _stream_failure(exc, decoded, close_on_error)

    def _stream_message(
        self, response: InferResponse, decoded: DecodedInfer, close_on_error: bool
    ) -> bytes:
        """One response of the stream: its reply, or its error (the stream goes on)."""
        if response.error is None:
            return self._stream_reply(response, decoded, final=response.final)
        response.release()
        if close_on_error:
            raise response.error
        return stream_error(response.error.message, decoded.request, final=response.final)

    @staticmethod
    def _stream_reply(response: InferResponse, decoded: DecodedInfer, *, final: bool) -> bytes:
        try:
            chunks = encode_infer_response(response, decoded, final=final)
            return b"".join(stream_response_chunks(chunks))
        finally:
            response.release()

    # -- statistics and model repository ---------------------------------------------------

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        with _extension_call("the statistics extension"):
            stats = self._core.model_statistics(request.name, _model_version(request.version))
        return ext.statistics_response(stats)

    async def repository_index(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        ext.check_no_repository_name(request.repository_name)
        with _extension_call("the model repository extension"):
            entries = self._core.repository_index(ready_only=request.ready)
        return ext.repository_index_response(entries)

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        ext.check_no_repository_name(request.repository_name)
        config, files = ext.load_arguments(request.parameters)
        with _extension_call("loading models"):
            await self._core.load_model(request.model_name, config_json=config, files=files)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        ext.check_no_repository_name(request.repository_name)
        dependents = ext.unload_dependents(request.parameters)
        with _extension_call("unloading models"):
            await self._core.unload_model(request.model_name, unload_dependents=dependents)
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ---------------------------------------------------------------------

    async def system_shared_memory_status(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        with _extension_call("system shared memory"):
            regions = self._core.system_shm_status(request.name)
        return ext.system_shm_status_response(regions)

    async def system_shared_memory_register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        with _extension_call("system shared memory"):
            self._core.register_system_shm(
                request.name, request.key, request.offset, request.byte_size
            )
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        with _extension_call("system shared memory"):
            self._core.unregister_system_shm(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_shared_memory_status(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        with _extension_call("CUDA shared memory"):
            regions = self._core.cuda_shm_status(request.name)
        return ext.cuda_shm_status_response(regions)

    async def cuda_shared_memory_register(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        with _extension_call("CUDA shared memory"):
            self._core.register_cuda_shm(
                request.name, request.raw_handle, request.device_id, request.byte_size
            )
        return pb.CudaSharedMemoryRegisterResponse()

    async def cuda_shared_memory_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        with _extension_call("CUDA shared memory"):
            self._core.unregister_cuda_shm(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- logging and tracing ---------------------------------------------------------------

    async def trace_setting(self, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        changes = ext.trace_settings_update(request.settings)
        if changes:
            with _extension_call("updating trace settings"):
                settings = self._core.update_trace_settings(changes, request.model_name)
        else:
            with _extension_call("the trace extension"):
                settings = self._core.trace_settings(request.model_name)
        return ext.trace_settings_response(settings)

    async def log_settings(self, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        update = ext.log_settings_update(request.settings)
        if update:
            with _extension_call("updating log settings"):
                settings = self._core.update_log_settings(update)
        else:
            with _extension_call("the logging extension"):
                settings = self._core.log_settings()
        return ext.log_settings_response(settings)


async def _one(reply: bytes) -> AsyncIterator[bytes]:
    yield reply


def _stream_failure(exc: Exception, decoded: DecodedInfer | None, close_on_error: bool) -> bytes:
    """The reply to a stream request that failed (called in the ``except`` that caught ``exc``),
    unless the failure ends the stream (``close_on_error``): then it raises."""
    error = exc if isinstance(exc, ShoalError) else unexpected("a streaming inference request")
    infer_failed("" if decoded is None else decoded.request.id, error.message)
    if close_on_error:
        raise error
    return stream_error(error.message, None if decoded is None else decoded.request)
