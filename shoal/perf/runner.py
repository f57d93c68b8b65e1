"""A load run: find out what to send, serialise it once, then measure each concurrency level."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from shoal.perf import _external
from shoal.perf._control import (
    ControlClient,
    ModelInfo,
    OutputInfo,
    control_client,
    split_address,
)
from shoal.perf._load import Transport, measure
from shoal.perf._transports import GrpcStreamTransport, GrpcUnaryTransport, HttpTransport
from shoal.perf.errors import PerfError
from shoal.perf.input_data import is_perf_analyzer_data, tensors_from_data
from shoal.perf.requests import RequestPlan, grpc_request, http_request, infer_path
from shoal.perf.shm import ShmLayout, ShmRegion, plan_layout
from shoal.perf.stats import CellResult, summarize
from shoal.perf.tensors import (
    TensorSpec,
    random_tensor,
    tensors_from_json,
    tensors_from_metadata,
)

PROTOCOLS = ("http", "grpc")
CLIENTS = ("python", "wrk", "h2load")
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}


@dataclass(frozen=True)
class RunConfig:
    """Everything ``shoal perf`` was asked to do. ``inputs`` are ``(name, datatype, shape)``."""

    model: str
    url: str = ""
    protocol: str = "http"
    version: str = ""
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    input_data: Path | None = None  # a V2 request body or perf_analyzer's {"data": [...]}
    zero_data: bool = False  # perf_analyzer's --input-data zero
    batch_size: int = 1
    payload_bytes: int | None = None
    concurrency: tuple[int, ...] = (1,)
    duration_s: float = 5.0
    warmup_s: float = 1.0
    binary: bool = True
    shared_memory: bool = False
    streaming: bool | None = None  # None: when the model is decoupled
    client: str = "python"
    request_timeout_s: float = 30.0

    @property
    def address(self) -> tuple[str, int]:
        return split_address(self.url or "127.0.0.1", DEFAULT_PORTS[self.protocol])


def check(config: RunConfig) -> None:
    """Refuse combinations the run cannot honour, before connecting to anything."""
    if config.protocol not in PROTOCOLS:
        raise PerfError(f"--protocol must be one of {', '.join(PROTOCOLS)}")
    _check_client(config)
    if config.shared_memory and config.client != "python":
        raise PerfError("--shared-memory system needs the built-in client (--client python)")
    if config.duration_s <= 0 or config.warmup_s < 0:
        raise PerfError("--duration must be positive and --warmup not negative")
    if config.batch_size < 1:
        raise PerfError("--batch-size must be positive")


def _check_client(config: RunConfig) -> None:
    if config.client not in CLIENTS:
        raise PerfError(f"--client must be one of {', '.join(CLIENTS)}")
    expected = {"wrk": "http", "h2load": "grpc"}.get(config.client, config.protocol)
    if expected != config.protocol:
        raise PerfError(f"--client {config.client} drives --protocol {expected} only")


def choose_inputs(config: RunConfig, info: ModelInfo) -> list[TensorSpec]:
    """The inputs to send: from ``--input-data``, from ``--input``, else from the metadata."""
    if config.input_data is not None:
        return _inputs_from_file(config.input_data, config, info)
    if config.inputs:
        return [random_tensor(n, d, s, seed=i) for i, (n, d, s) in enumerate(config.inputs)]
    if not info.inputs:
        raise PerfError(f"model '{config.model}' declares no inputs; pass --input")
    if config.batch_size > max(info.max_batch_size, 1):
        raise PerfError(
            f"--batch-size {config.batch_size} is larger than the max_batch_size "
            f"({info.max_batch_size}) of model '{config.model}'"
        )
    return tensors_from_metadata(
        info.inputs,
        config.payload_bytes,
        batched=info.max_batch_size > 0,
        batch_size=config.batch_size,
        zeros=config.zero_data,
    )


def _inputs_from_file(path: Path, config: RunConfig, info: ModelInfo) -> list[TensorSpec]:
    """perf_analyzer's ``{"data": [...]}`` (its first entry) or a V2 request body."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PerfError(f"--input-data {path}: {error}") from None
    try:
        if is_perf_analyzer_data(document):
            batched = info.max_batch_size > 0
            return tensors_from_data(
                document, info.inputs, batch_size=config.batch_size, batched=batched
            )
        return tensors_from_json(path)
    except (ValueError, KeyError, TypeError) as error:
        raise PerfError(f"--input-data {path}: {error}") from None


async def run(config: RunConfig) -> list[CellResult]:
    """Measure every concurrency level of ``config`` in turn."""
    check(config)
    host, port = config.address
    control = control_client(config.protocol, host, port)
    try:
        info = control.model_info(config.model, config.version)
        plan = RequestPlan(config.model, choose_inputs(config, info), config.version)
        streaming = info.decoupled if config.streaming is None else config.streaming
        if streaming and (config.protocol != "grpc" or config.client != "python"):
            raise PerfError("streaming (decoupled models) needs --protocol grpc --client python")
        if streaming and config.shared_memory:
            raise PerfError("--shared-memory is not supported with streaming")
        outputs = () if streaming else control.probe(plan)
        plan = replace(plan, outputs=tuple(o.name for o in outputs))
        with _shared_memory(config, control, plan, outputs) as plans:
            return [await _cell(config, plans, level, streaming) for level in config.concurrency]
    finally:
        control.close()


@contextmanager
def _shared_memory(
    config: RunConfig, control: ControlClient, plan: RequestPlan, outputs: Sequence[OutputInfo]
) -> Iterator[list[RequestPlan]]:
    """One plan per worker: the same plan, or each with its own shared-memory output slot."""
    workers = max(config.concurrency)
    if not config.shared_memory:
        yield [plan] * workers
        return
    sizes = [(o.name, o.nbytes) for o in outputs]
    layout = plan_layout(f"shoal_perf_{os.getpid()}", plan.inputs, sizes, workers)
    region = ShmRegion(layout.region, layout.byte_size)
    try:
        _write_inputs(region, layout, plan)
        control.register_shm(region.name, region.key, layout.byte_size)
        try:
            yield [replace(plan, input_refs=layout.inputs, output_refs=s) for s in layout.outputs]
        finally:
            control.unregister_shm(region.name)
    finally:
        region.close()


def _write_inputs(region: ShmRegion, layout: ShmLayout, plan: RequestPlan) -> None:
    for tensor in plan.inputs:
        region.write(layout.inputs[tensor.name].offset, tensor.data)


def _transports(
    config: RunConfig, plans: Sequence[RequestPlan], streaming: bool
) -> list[Transport]:
    return [_transport(config, plan, streaming) for plan in plans]


def _transport(config: RunConfig, plan: RequestPlan, streaming: bool) -> Transport:
    host, port = config.address
    target = f"{host}:{port}"
    if config.protocol == "http":
        return HttpTransport(host, port, http_request(plan, target, binary=config.binary))
    if streaming:
        return GrpcStreamTransport(target, grpc_request(plan, streaming=True))
    return GrpcUnaryTransport(target, grpc_request(plan), config.request_timeout_s)


async def _cell(
    config: RunConfig, plans: Sequence[RequestPlan], level: int, streaming: bool
) -> CellResult:
    if config.client != "python":
        return await _external_cell(config, plans[0], level)
    transports = _transports(config, plans[:level], streaming)
    try:
        measured = await measure(
            transports, config.warmup_s, config.duration_s, config.request_timeout_s
        )
    finally:
        await asyncio.gather(*(t.close() for t in transports))
    return summarize(
        model=config.model,
        protocol=config.protocol,
        client=config.client,
        concurrency=level,
        duration_s=config.duration_s,
        latencies_ns=measured.latencies_ns,
        errors=measured.errors,
        responses=measured.responses,
        cpu_seconds=measured.cpu_seconds,
        payload_bytes=plans[0].payload_bytes,
        error_samples=measured.error_samples,
    )


async def _external_cell(config: RunConfig, plan: RequestPlan, level: int) -> CellResult:
    host, port = config.address
    target = f"{host}:{port}"
    if config.client == "wrk":
        raw = http_request(plan, target, binary=config.binary)
        path = infer_path(plan.model, plan.version)
        got = await _external.run_wrk(target, path, raw, level, config.warmup_s, config.duration_s)
    else:
        method = "/inference.GRPCInferenceService/ModelInfer"
        got = await _external.run_h2load(
            target, method, grpc_request(plan), level, config.warmup_s, config.duration_s
        )
    return CellResult(
        model=config.model,
        protocol=config.protocol,
        client=config.client,
        concurrency=level,
        duration_s=got.duration_s,
        requests=got.requests,
        errors=got.errors,
        responses=got.requests,
        latency_ms=got.latency_ms,
        client_cpu_percent=100.0 * got.cpu_seconds / got.duration_s,
        payload_bytes=plan.payload_bytes,
    )
