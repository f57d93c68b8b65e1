"""Test doubles for the HTTP frontend tests: fake cores and an event loop in a thread.

``NoExtensions`` is an ExtensionAPI whose every call raises ``NotImplementedError`` (a core
without extensions). ``BaseEchoCore`` has only the InferenceAPI methods of its own; ``EchoCore``
adds simple in-memory versions of the extension methods (statistics, repository, system shared
memory, logging) that record what they were given; ``UnimplementedCore`` has the extension
methods but each raises ``NotImplementedError``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import uvloop

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
    RequestedOutput,
    ResponseStatistics,
    ServerMetadata,
    SharedMemoryRegion,
    ShoalError,
    StatDuration,
    TensorMetadata,
    TraceChange,
    TraceValue,
)
from shoal.ipc.dtypes import byte_size, serialize_bytes
from shoal.supervisor.memory.cuda_shm import CudaSharedMemoryRegistry

T = TypeVar("T")

#: Infer on "fail_<code>" raises a ShoalError with that code and this message.
FAIL_PREFIX = "fail_"


def failure_message(model: str) -> str:
    return f"failure of model '{model}': expected something else"


SHM_REGION = "shared_memory_region"


class NoExtensions:
    """Every call of :class:`~shoal.core.ExtensionAPI`, each raising ``NotImplementedError``."""

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        raise NotImplementedError

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        raise NotImplementedError

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        raise NotImplementedError

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        raise NotImplementedError

    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        raise NotImplementedError

    def unregister_system_shm(self, name: str = "") -> None:
        raise NotImplementedError

    def system_shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        raise NotImplementedError

    def register_cuda_shm(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        raise NotImplementedError

    def unregister_cuda_shm(self, name: str = "") -> None:
        raise NotImplementedError

    def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        raise NotImplementedError

    def log_settings(self) -> dict[str, ParamValue]:
        raise NotImplementedError

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        raise NotImplementedError

    def trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        raise NotImplementedError

    def update_trace_settings(
        self, changes: dict[str, TraceChange], model: str = ""
    ) -> dict[str, TraceValue]:
        raise NotImplementedError

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        raise NotImplementedError


class BaseEchoCore(NoExtensions):
    """A test double of the *core*: model "echo" returns every input as an output of that name.

    Models named ``fail_<error code>`` raise that error; "crash" raises a bug; "bad_output"
    returns an output whose bytes do not match its shape. Every response counts its release.
    Requested outputs with ``shared_memory_region`` come back as the core returns them: no data,
    the request's parameters with ``shared_memory_byte_size`` set to the bytes written. Inputs in
    shared memory are not read: their echo is zeros.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.live = True
        self.ready = True
        self.requests: list[InferRequest] = []
        self.issued = 0
        self.released = 0
        self.gate: asyncio.Event | None = None
        self.entered = threading.Event()

    def is_live(self) -> bool:
        return self.live

    def is_ready(self) -> bool:
        return self.ready

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("shoal", "0.1.0", ("binary_tensor_data", "model_configuration"))

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
        return ModelMetadata(name, ("1",), "python", (tensor,), (tensor,))

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        self._check_model(name)
        return {"name": name, "backend": "python", "max_batch_size": 8, "version": version}

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
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        self._check_model(request.model_name)
        if request.model_name == "crash":
            raise RuntimeError("a bug in the core")
        requested = {output.name: output for output in request.outputs}
        outputs = [
            _echo(tensor, requested.get(tensor.name))
            for tensor in request.inputs
            if _wanted(request, tensor.name)
        ]
        if request.model_name == "bad_output":
            outputs = [InferOutput("OUT", "FP32", (4,), memoryview(b"123"))]
        self.issued += 1
        return InferResponse(
            request.model_name,
            request.model_version or "1",
            request.id,
            outputs,
            parameters=dict(request.parameters),
            _release=self._on_release,
        )

    def _on_release(self) -> None:
        self.released += 1

    def _check_model(self, name: str) -> None:
        if name.startswith(FAIL_PREFIX):
            code = ErrorCode[name.removeprefix(FAIL_PREFIX).upper()]
            raise ShoalError(failure_message(name), code)
        if name not in ("echo", "crash", "bad_output"):
            raise NotFound(f"Request for unknown model: '{name}' is not found")


def _wanted(request: InferRequest, name: str) -> bool:
    requested = {output.name for output in request.outputs}
    if requested - {tensor.name for tensor in request.inputs}:
        raise InvalidArgument(f"unexpected inference output for model '{request.model_name}'")
    return not requested or name in requested


def _echo(tensor: InferInput, requested: RequestedOutput | None) -> InferOutput:
    if requested is not None and SHM_REGION in requested.parameters:
        # The core writes the output into the client's region and says how much it wrote.
        written = byte_size(tensor.datatype, tensor.shape) or 0
        parameters = {**requested.parameters, "shared_memory_byte_size": written}
        return InferOutput(tensor.name, tensor.datatype, tensor.shape, memoryview(b""), parameters)
    data = tensor.data
    if SHM_REGION in tensor.parameters:
        raw = bytes(byte_size(tensor.datatype, tensor.shape) or 0)
    elif isinstance(data, np.ndarray):
        raw = serialize_bytes(data) if tensor.datatype == "BYTES" else data.tobytes()
    else:
        raw = bytes(data)  # as the core would copy it into shared memory
    return InferOutput(tensor.name, tensor.datatype, tensor.shape, memoryview(raw))


#: The statistics EchoCore reports for "echo" version 1: every field non-zero and distinct.
ECHO_STATS = ModelStatistics(
    name="echo",
    version="1",
    last_inference=1_700_000_000_000,
    inference_count=12,
    execution_count=7,
    inference_stats=InferStatistics(
        success=StatDuration(10, 1000),
        fail=StatDuration(2, 200),
        queue=StatDuration(10, 300),
        compute_input=StatDuration(10, 400),
        compute_infer=StatDuration(10, 500),
        compute_output=StatDuration(10, 600),
        cache_hit=StatDuration(1, 70),
        cache_miss=StatDuration(3, 80),
    ),
    batch_stats=[
        BatchStatistics(1, StatDuration(4, 11), StatDuration(4, 12), StatDuration(4, 13)),
        BatchStatistics(4, StatDuration(3, 21), StatDuration(3, 22), StatDuration(3, 23)),
    ],
    response_stats={
        "0": ResponseStatistics(
            compute_infer=StatDuration(5, 31),
            compute_output=StatDuration(5, 32),
            success=StatDuration(5, 33),
            fail=StatDuration(1, 34),
            empty_response=StatDuration(2, 35),
            cancel=StatDuration(1, 36),
        )
    },
    memory_usage=[MemoryUsage("CPU", 0, 4096), MemoryUsage("GPU", 1, 1 << 20)],
)

DEFAULT_LOG_SETTINGS: dict[str, ParamValue] = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


class EchoCore(BaseEchoCore):
    """``BaseEchoCore`` plus in-memory extensions that record what they are given.

    The repository starts with "echo" (READY), "broken" (UNAVAILABLE, with a reason) and "lazy"
    (known by name only). Loading or unloading a ``fail_<code>`` model raises that error.
    """

    def reset(self) -> None:
        super().reset()
        self.models: dict[str, RepositoryEntry] = {
            "echo": RepositoryEntry("echo", "1", "READY"),
            "broken": RepositoryEntry("broken", "1", "UNAVAILABLE", "load failed: bad config"),
            "lazy": RepositoryEntry("lazy"),
        }
        self.loads: list[tuple[str, str | None, dict[str, bytes] | None]] = []
        self.unloads: list[tuple[str, bool]] = []
        self.regions: dict[str, SharedMemoryRegion] = {}
        # The real one: it opens clients' handles where there is a GPU.
        self.cuda = CudaSharedMemoryRegistry()
        self.log: dict[str, ParamValue] = dict(DEFAULT_LOG_SETTINGS)
        self.stats_calls: list[tuple[str, str]] = []

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        self.stats_calls.append((name, version))
        if name not in ("", "echo"):
            raise NotFound(f"requested model '{name}' is not found")
        if version not in ("", "1"):
            raise NotFound(f"requested model version is not available for model '{name}'")
        return [ECHO_STATS]

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        entries = sorted(self.models.values(), key=lambda entry: entry.name)
        return [entry for entry in entries if entry.state == "READY" or not ready_only]

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        self._check_control(name)
        self.loads.append((name, config_json, files))
        self.models[name] = RepositoryEntry(name, "1", "READY")

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._check_control(name)
        self.unloads.append((name, unload_dependents))
        self.models[name] = RepositoryEntry(name, "1", "UNAVAILABLE", "unloaded")

    def _check_control(self, name: str) -> None:
        if name.startswith(FAIL_PREFIX):
            self._check_model(name)

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
        return dict(self.log)

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        unknown = set(settings) - set(self.log)
        if unknown:
            raise InvalidArgument(f"unknown log setting '{sorted(unknown)[0]}'")
        self.log.update(settings)
        return dict(self.log)


class UnimplementedCore(BaseEchoCore):
    """Has every extension method, and each raises ``NotImplementedError``."""

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        raise NotImplementedError

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        raise NotImplementedError

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        raise NotImplementedError

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        raise NotImplementedError

    def register_system_shm(self, name: str, key: str, offset: int, byte_size: int) -> None:
        raise NotImplementedError

    def unregister_system_shm(self, name: str = "") -> None:
        raise NotImplementedError

    def system_shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        raise NotImplementedError

    def log_settings(self) -> dict[str, ParamValue]:
        raise NotImplementedError

    def update_log_settings(self, settings: dict[str, ParamValue]) -> dict[str, ParamValue]:
        raise NotImplementedError


class LoopThread:
    """An event loop running in a daemon thread; ``run`` waits for a coroutine's result."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop")
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 15) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, func: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(func)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
