"""Test doubles for the HTTP frontend tests: a fake core and an event loop in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import uvloop

from shoal.ipc.dtypes import serialize_bytes
from shoal.supervisor.core import (
    ErrorCode,
    InferOutput,
    InferRequest,
    InferResponse,
    InvalidArgument,
    ModelMetadata,
    NotFound,
    ServerMetadata,
    ShoalError,
    TensorMetadata,
)

T = TypeVar("T")

#: Infer on "fail_<code>" raises a ShoalError with that code and this message.
FAIL_PREFIX = "fail_"


def failure_message(model: str) -> str:
    return f"failure of model '{model}': expected something else"


class EchoCore:
    """A test double of the *core*: model "echo" returns every input as an output of that name.

    Models named ``fail_<error code>`` raise that error; "crash" raises a bug; "bad_output"
    returns an output whose bytes do not match its shape. Every response counts its release.
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

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        self._check_model(name)
        tensor = TensorMetadata("INPUT0", "FP32", (-1, 3))
        return ModelMetadata(name, ("1",), "python", (tensor,), (tensor,))

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        self._check_model(name)
        return {"name": name, "backend": "python", "max_batch_size": 8, "version": version}

    async def infer(self, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        self._check_model(request.model_name)
        if request.model_name == "crash":
            raise RuntimeError("a bug in the core")
        outputs = [_echo(tensor) for tensor in request.inputs if _wanted(request, tensor.name)]
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


def _echo(tensor: Any) -> InferOutput:
    data = tensor.data
    if isinstance(data, np.ndarray):
        raw = serialize_bytes(data) if tensor.datatype == "BYTES" else data.tobytes()
    else:
        raw = bytes(data)  # as the core would copy it into shared memory
    return InferOutput(tensor.name, tensor.datatype, tensor.shape, memoryview(raw))


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
