"""The test double of the core that the gRPC frontend tests serve, and their server harness.

No tests here: the other ``test_grpc_*`` modules import from this one. The double implements the
whole CoreAPI (with the extensions) in memory; it is not the thing under test, the frontend is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from shoal.core import (
    BatchStatistics,
    CudaSharedMemoryRegion,
    ErrorCode,
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    InferStatistics,
    InvalidArgument,
    MemoryUsage,
    ModelMetadata,
    ModelStatistics,
    NotFound,
    ParamValue,
    RepositoryEntry,
    ResponseStatistics,
    ServerMetadata,
    SharedMemoryRegion,
    ShoalError,
    StatDuration,
    TensorMetadata,
    TraceChange,
    TraceValue,
)
from shoal.frontends.grpc.aio import GrpcServer
from shoal.ipc.dtypes import serialize_bytes
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.memory.cuda_shm import CudaSharedMemoryRegistry
from tests.unit.frontends.doubles import LoopThread, NoExtensions

#: Models named "fail_<error code>" raise a ShoalError with that code and this message.
FAIL_PREFIX = "fail_"
#: Model "gated" waits for ``core.gate`` to be set (streaming order tests).
GATED = "gated"

CONFIG_JSON: dict[str, Any] = {
    "name": "echo",
    "platform": "",
    "backend": "python",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3], "optional": False}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]}],
    "instance_group": [{"name": "echo_0", "kind": "KIND_CPU", "count": 2, "gpus": []}],
    "dynamic_batching": {"max_queue_delay_microseconds": 100, "preferred_batch_size": [4]},
    "parameters": {"key": {"string_value": "value"}},
    "not_a_config_field": "ignored",
}


def failure_message(model: str) -> str:
    return f"failure of model '{model}': expected something else"


def stats_of(name: str) -> ModelStatistics:
    return ModelStatistics(
        name=name,
        version="1",
        last_inference=1_700_000_000_000,
        inference_count=12,
        execution_count=7,
        inference_stats=InferStatistics(
            success=StatDuration(10, 1000), fail=StatDuration(2, 200), cache_miss=StatDuration(3)
        ),
        batch_stats=[BatchStatistics(4, compute_infer=StatDuration(3, 22))],
        response_stats={"0": ResponseStatistics(success=StatDuration(5, 33))},
        memory_usage=[MemoryUsage("CPU", 0, 4096)],
    )


class BareCore(NoExtensions):
    """The core without any extension: health, metadata, config and an echo model."""

    def __init__(self) -> None:
        self.live = True
        self.ready = True
        self.requests: list[InferRequest] = []
        self.issued = 0
        self.released = 0
        self.gate: asyncio.Event | None = None
        self.cancelled = 0

    def is_live(self) -> bool:
        return self.live

    def is_ready(self) -> bool:
        return self.ready

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("shoal", "0.1.0", ("binary_tensor_data", "statistics"))

    def model_ready(self, name: str, version: str = "") -> bool:
        return name == "echo" and version in ("", "1")

    async def model_ready_now(self, name: str, version: str = "") -> bool:
        return self.model_ready(name, version)

    async def model_decoupled(self, name: str, version: str = "") -> bool:
        policy = self.model_config(name, version).get("model_transaction_policy") or {}
        return bool(policy.get("decoupled", False))

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        self._check_model(name)
        tensor = TensorMetadata("INPUT0", "FP32", (-1, 3))
        return ModelMetadata(name, ("1", "2"), "python", (tensor,), (tensor,))

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        self._check_model(name)
        return dict(CONFIG_JSON, name=name)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """One response, as for a non-decoupled model; "repeat_<n>" models answer n times."""
        count = (
            int(request.model_name.split("_", 1)[1])
            if request.model_name.startswith("repeat_")
            else 1
        )
        for _ in range(count):
            yield await self.infer(request)

    async def infer(self, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        if request.model_name == GATED:
            assert self.gate is not None
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        self._check_model(request.model_name)
        if request.model_name == "crash":
            raise RuntimeError("a bug in the core")
        outputs = [_echo(tensor, request) for tensor in request.inputs if _wanted(request, tensor)]
        if request.model_name == "bad_output":
            outputs = [InferOutput("OUT", "FP32", (4,), memoryview(b"123"))]
        self.issued += 1
        return InferResponse(
            request.model_name,
            request.model_version or "1",
            request.id,
            outputs,
            parameters={**request.parameters, "echoed": True},
            _release=self._on_release,
        )

    def _on_release(self) -> None:
        self.released += 1

    def _check_model(self, name: str) -> None:
        if name.startswith(FAIL_PREFIX):
            code = ErrorCode[name.removeprefix(FAIL_PREFIX).upper()]
            raise ShoalError(failure_message(name), code)
        if name not in ("echo", "crash", "bad_output", GATED):
            raise NotFound(f"Request for unknown model: '{name}' is not found")


def _wanted(request: InferRequest, tensor: InferInput) -> bool:
    requested = {output.name for output in request.outputs}
    if requested - {tensor.name for tensor in request.inputs}:
        raise InvalidArgument(f"unexpected inference output for model '{request.model_name}'")
    return not requested or tensor.name in requested


def _echo(tensor: InferInput, request: InferRequest) -> InferOutput:
    """The input as an output; written to "shared memory" (no data) when the client asked."""
    parameters = next((o.parameters for o in request.outputs if o.name == tensor.name), {})
    if "shared_memory_region" in parameters:
        return InferOutput(tensor.name, tensor.datatype, tensor.shape, memoryview(b""), parameters)
    data = tensor.data
    if isinstance(data, np.ndarray):
        raw = serialize_bytes(data) if tensor.datatype == "BYTES" else data.tobytes()
    else:
        raw = bytes(data)  # as the core copies it into shared memory
    return InferOutput(tensor.name, tensor.datatype, tensor.shape, memoryview(raw))


class FullCore(BareCore):
    """The core with every extension, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[tuple[str, str | None, dict[str, bytes] | None]] = []
        # The real one: it opens clients' handles where there is a GPU.
        self.cuda = CudaSharedMemoryRegistry()
        self.unloads: list[tuple[str, bool]] = []
        self.regions: dict[str, SharedMemoryRegion] = {}
        self.logging: dict[str, ParamValue] = {
            "log_file": "",
            "log_info": True,
            "log_verbose_level": 0,
        }
        self.tracing = TraceSettings(lambda name: name == "echo")

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        if name:
            self._check_model(name)
            return [stats_of(name)]
        return [stats_of("echo"), stats_of("crash")]

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        ready = RepositoryEntry("echo", "1", "READY")
        if ready_only:
            return [ready]
        return [ready, RepositoryEntry("broken", "1", "UNAVAILABLE", "load failed")]

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        self._check_model(name)
        self.loads.append((name, config_json, files))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_model(name)
        self.unloads.append((name, unload_dependents))

    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self.regions:
            raise ShoalError(
                f"shared memory region '{name}' already in manager", ErrorCode.ALREADY_EXISTS
            )
        self.regions[name] = SharedMemoryRegion(name, key, offset, byte_size)

    def unregister_system_shm(self, name: str = "") -> None:
        if name:
            self.regions.pop(name, None)
        else:
            self.regions.clear()

    def system_shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        if not name:
            return list(self.regions.values())
        if name not in self.regions:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [self.regions[name]]

    def register_cuda_shm(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self.cuda.register(name, raw_handle, device_id, byte_size, taken=name in self.regions)

    def unregister_cuda_shm(self, name: str = "") -> None:
        self.cuda.unregister(name)

    def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return self.cuda.status(name)

    def log_settings(self) -> dict[str, ParamValue]:
        return dict(self.logging)

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        unknown = set(settings) - set(self.logging)
        if unknown:
            raise InvalidArgument(f"unknown log setting '{sorted(unknown)[0]}'")
        self.logging.update(settings)
        return dict(self.logging)

    def trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        return self.tracing.current(model)

    def update_trace_settings(
        self, changes: dict[str, TraceChange], model: str = ""
    ) -> dict[str, TraceValue]:
        return self.tracing.update(changes, model)

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        self.tracing.frontend(trace_id, timestamps)


class NotImplementedCore(BareCore):
    """The extensions exist but raise NotImplementedError (a core part-way through them)."""

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        raise NotImplementedError

    def log_settings(self) -> dict[str, ParamValue]:
        raise NotImplementedError


@contextmanager
def serving(loop_thread: LoopThread, core: Any, **options: Any) -> Iterator[str]:
    """A GrpcServer over ``core`` on 127.0.0.1, port 0; yields "host:port", then stops it."""
    server = GrpcServer(core, **options)
    port = loop_thread.run(server.start("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop_thread.run(server.stop(None))


@contextmanager
def client_of(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(url)
    try:
        yield client
    finally:
        client.close()
