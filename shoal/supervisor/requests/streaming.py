"""Every response of a request, as an async iterator (the core's ``infer_stream``).

Kept apart from ``service.py``: mypyc compiles that module and does not support async
generators, and a stream's per-response cost is in the stub and the frontend anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from shoal.core.backlog import StreamQueue, stall_message, stalled
from shoal.core.errors import Cancelled, ErrorCode, ModelError, ResourceExhausted, ShoalError
from shoal.core.types import InferRequest, InferResponse
from shoal.ipc.arena import Block
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import TensorDesc
from shoal.supervisor.drain import DrainGate
from shoal.supervisor.extensions.trace_settings import TraceSettings
from shoal.supervisor.instances.decoupled import new_stream
from shoal.supervisor.memory.system_shm import Held, SharedMemoryRegistry
from shoal.supervisor.models import ensemble_stream
from shoal.supervisor.models._ensemble_outcomes import (
    count_success,
    made_outputs,
    sequence_parameters,
)
from shoal.supervisor.models.ensemble import EnsembleRunner
from shoal.supervisor.requests import classification, staging, traced
from shoal.supervisor.requests.client_shm import held_regions, keep_inside
from shoal.supervisor.requests.responses import response_of
from shoal.supervisor.work import Completion, Work

if TYPE_CHECKING:
    from shoal.supervisor.models.version import ModelVersion


class StreamingService(Protocol):
    """What a stream needs of the inference service (``service.py`` implements it)."""

    @property
    def gate(self) -> DrainGate: ...

    @property
    def ensembles(self) -> EnsembleRunner: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def resolve(self, request: InferRequest) -> ModelVersion: ...

    def stage(
        self, mv: ModelVersion, request: InferRequest
    ) -> tuple[RequestRecord, list[Block]]: ...

    @property
    def tracing(self) -> TraceSettings: ...

    @property
    def shm(self) -> SharedMemoryRegistry: ...


async def responses(
    service: StreamingService, request: InferRequest
) -> AsyncIterator[InferResponse]:
    """One response for most models, any number for a decoupled one."""
    mv = service.resolve(request)
    if not mv.config.decoupled:
        yield await service.infer(request)
        return
    service.gate.enter(request.model_name)
    held = held_regions(service.shm, request)
    try:
        # aclosing: a client that goes away closes the inner stream (and cancels) at once.
        inner = (
            _ensemble(service, mv, request)
            if mv.is_ensemble
            else _decoupled(service, mv, request, held)
        )
        async with contextlib.aclosing(inner) as each:
            async for response in each:
                yield response
    finally:
        service.shm.release(held)
        service.gate.leave()


async def _decoupled(
    service: StreamingService, mv: ModelVersion, request: InferRequest, held: Held
) -> AsyncGenerator[InferResponse, None]:
    classes = classification.requested(request, mv.config) if request.outputs else {}
    started = time.monotonic_ns()
    record, blocks = service.stage(mv, request)
    trace = traced.begin(service.tracing, mv, record, started)
    future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    stream = new_stream()
    work = Work(
        record, blocks, future, batch_size=staging.batch_size(mv.summary, request), stream=stream
    )
    mv.submit(work)
    finished = False
    try:
        while (item := await stream.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            if item.response.error is not None:
                yield _error_response(mv, request, item)
                continue
            response = response_of(mv, request, item)
            response.final = item.final
            if classes:
                classification.apply(response, mv.config, classes)
            yield response
        finished = True
    finally:
        work.closed = True  # later responses are released as they come
        if not finished:
            work.cancel()
            keep_inside(service.shm, work, held)  # until its execute returns
        while not stream.empty():
            left = stream.get_nowait()
            if isinstance(left, Completion):
                left.release()
        traced.end(trace)


async def _ensemble(
    service: StreamingService, mv: ModelVersion, request: InferRequest
) -> AsyncGenerator[InferResponse, None]:
    """A decoupled ensemble's responses (``models/ensemble_stream.py``); the last one carries
    the final flag when it is known to be the last as it is sent."""
    classes = classification.requested(request, mv.config) if request.outputs else {}
    started = time.monotonic_ns()
    record, blocks = service.stage(mv, request)
    queue: StreamQueue[InferResponse | BaseException | None] = StreamQueue()
    run = _start_ensemble(service.ensembles, mv, request, (record, blocks), queue)
    # The item after the one being sent, when already there: None makes that one the last.
    after: InferResponse | BaseException | _Later | None = _LATER
    try:
        while True:
            item = await queue.get() if isinstance(after, _Later) else after
            after = _LATER
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            if not queue.empty():
                after = queue.get_nowait()
            item.final = after is None
            if classes:
                classification.apply(item, mv.config, classes)
            yield item
    finally:
        if not run.finished:  # the client went away
            mv.stats.failure(time.monotonic_ns() - started, Cancelled.reason)
        run.abort()
        if isinstance(after, InferResponse):
            after.release()
        while not queue.empty():
            left = queue.get_nowait()
            if isinstance(left, InferResponse):
                left.release()


def _start_ensemble(
    runner: EnsembleRunner,
    mv: ModelVersion,
    request: InferRequest,
    staged: tuple[RequestRecord, list[Block]],
    queue: asyncio.Queue[InferResponse | BaseException | None],
) -> ensemble_stream.StreamRun:
    """Start a decoupled ensemble's request: each response goes to ``queue``, then ``None``
    (an error before it ends the stream). The staged client inputs are freed once every
    response is released and no step runs."""
    record, blocks = staged
    started = time.monotonic_ns()
    batch = staging.batch_size(mv.summary, request)

    def emit(tensors: dict[str, TensorDesc], release: Callable[[], None]) -> None:
        if run.emitted == 1:
            mv.stats.first_response(time.monotonic_ns() - started)
        made = made_outputs(mv.name, record.requested_outputs, tensors)
        response = InferResponse(
            model_name=mv.name,
            model_version=str(mv.version),
            id=request.id,
            outputs=[runner.output(mv, tensors, name) for name in made],
            parameters=sequence_parameters(record),
            _release=release,
        )
        if (cause := stalled(queue)) is not None:  # a client that stopped reading
            response.release()
            run.fail(ResourceExhausted(stall_message("request", cause)))
            return
        queue.put_nowait(response)

    def end(error: BaseException | None) -> None:
        elapsed = time.monotonic_ns() - started
        if error is None:
            count_success(mv, batch, elapsed, run.times)
        else:
            if not isinstance(error, ShoalError):  # a step's request cancelled by another
                error = Cancelled(f"in ensemble '{mv.name}', a step's request was cancelled")
            mv.stats.failure(elapsed, error.reason)
            queue.put_nowait(error)
        queue.put_nowait(None)

    wanted = tuple(record.requested_outputs)
    run = ensemble_stream.StreamRun(runner, mv, record, wanted, (), emit, end)
    if runner.tracing is not None:
        run.trace = traced.begin(runner.tracing, mv, record, started)
    run.start(
        {desc.name: desc for desc in record.inputs}, functools.partial(runner.free_inputs, blocks)
    )
    return run


class _Later:
    """The next item is not there yet."""


_LATER = _Later()


def _error_response(mv: ModelVersion, request: InferRequest, item: Completion) -> InferResponse:
    """An error response the model sent: a response of its own, the stream goes on."""
    assert item.response.error is not None
    code_name, message = item.response.error
    error = ModelError(message, ErrorCode.__members__.get(code_name, ErrorCode.INTERNAL))
    return InferResponse(
        model_name=mv.name,
        model_version=str(mv.version),
        id=request.id,
        _release=item.release,
        final=item.final,
        error=error,
    )
