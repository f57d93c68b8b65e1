"""The records between frontend workers and the core survive a round trip exactly."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.core import errors
from shoal.core.types import (
    BatchStatistics,
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStatistics,
    RequestedOutput,
    ResponseStatistics,
    StatDuration,
    TensorMetadata,
)
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire

pytestmark = pytest.mark.timeout(10)


def _through(header: list, payloads: list) -> tuple[list, list[memoryview]]:
    """Through a FrameReader, the bytes cut at every position (frames arrive in pieces)."""
    data = b"".join(bytes(p) for p in wire.frame(header, payloads))
    got: list = []
    for cut in sorted({0, 1, 5, len(data) // 2, len(data) - 1}):
        frames: list = []

        def keep(h: list, p: list, frames: list = frames) -> None:
            frames.append((h, [bytes(v) for v in p]))

        reader = wire.FrameReader(keep, list)
        for piece in (data[:cut], data[cut:], data):  # one frame in two parts, then a whole one
            if piece:
                reader.data_received(piece)
        assert len(frames) == 2 and frames[0] == frames[1]
        got = frames
    header_back, payloads_back = got[0]
    return header_back, [memoryview(p) for p in payloads_back]


def test_a_request_keeps_raw_array_and_object_inputs():
    raw = np.arange(6, dtype=np.int32)
    request = InferRequest(
        "m",
        "2",
        "id-1",
        [
            InferInput("RAW", "INT32", (2, 3), memoryview(raw.tobytes()), {"p": 1}),
            InferInput("JSON", "FP32", (2,), np.array([1.5, 2.5])),
            InferInput("TEXT", "BYTES", (2,), np.array([b"a", "b"], dtype=object)),
            InferInput("SHM", "FP32", (4,), b"", {"shared_memory_region": "r"}),
        ],
        [RequestedOutput("OUT", {"binary_data": True})],
        {"sequence_id": 7, "sequence_start": True},
    )
    payloads: list = []
    header, views = _through(wire.request_to_wire(request, payloads), payloads)
    back = wire.request_from_wire(header, views)
    assert (back.model_name, back.model_version, back.id) == ("m", "2", "id-1")
    assert back.parameters == request.parameters
    assert back.outputs == request.outputs
    assert bytes(back.inputs[0].data) == raw.tobytes()
    assert back.inputs[0].shape == (2, 3) and back.inputs[0].parameters == {"p": 1}
    json_in = back.inputs[1].data
    assert isinstance(json_in, np.ndarray) and json_in.dtype == np.float64
    assert json_in.tolist() == [1.5, 2.5]
    text = back.inputs[2].data
    assert isinstance(text, np.ndarray) and text.dtype == object
    assert text.tolist() == [b"a", "b"]
    assert bytes(back.inputs[3].data) == b""
    assert back.inputs[3].parameters == {"shared_memory_region": "r"}


def test_a_response_keeps_outputs_and_its_stream_fields():
    released = []
    response = InferResponse(
        "m",
        "1",
        "r",
        [InferOutput("OUT", "UINT8", (3,), memoryview(b"abc"), {"x": "y"})],
        {"triton_final_response": False},
        _release=lambda: released.append(True),
        final=False,
        error=errors.ModelError("model 'm' failed", errors.ErrorCode.INVALID_ARG),
    )
    payloads: list = []
    header, views = _through(response_wire.response_to_wire(response, payloads), payloads)
    back = response_wire.response_from_wire(header, views)
    assert bytes(back.outputs[0].data) == b"abc"
    assert back.outputs[0].shape == (3,) and back.outputs[0].parameters == {"x": "y"}
    assert back.final is False and back.parameters == {"triton_final_response": False}
    assert isinstance(back.error, errors.ModelError)
    assert back.error.code is errors.ErrorCode.INVALID_ARG and back.error.reason == "BACKEND"


@pytest.mark.parametrize(
    "error",
    [
        errors.NotFound("unknown model 'x'"),
        errors.Rejected("queue full"),
        errors.DecoupledInfer("d"),
        NotImplementedError("no"),
    ],
)
def test_errors_keep_class_code_reason_and_messages(error):
    back = plain.error_from_wire(plain.error_to_wire(error))
    assert type(back) is type(error) and str(back) == str(error)
    if isinstance(error, errors.ShoalError):
        assert isinstance(back, errors.ShoalError)
        assert (back.code, back.reason) == (error.code, error.reason)
        assert getattr(back, "http_message", None) == getattr(error, "http_message", None)


def test_an_unexpected_exception_is_an_internal_error():
    back = plain.error_from_wire(plain.error_to_wire(KeyError("k")))
    assert isinstance(back, errors.ShoalError) and back.code is errors.ErrorCode.INTERNAL


def test_nested_statistics_and_metadata_round_trip():
    stats = ModelStatistics("m", "1", 5, 3, 2)
    stats.inference_stats.success = StatDuration(3, 300)
    stats.batch_stats = [BatchStatistics(2, compute_infer=StatDuration(1, 10))]
    stats.response_stats = {"0": ResponseStatistics(success=StatDuration(1, 1))}
    stats.failure_reasons = {"BACKEND": 1}
    assert plain.from_plain(list[ModelStatistics], plain.to_plain([stats])) == [stats]
    metadata = ModelMetadata("m", ("1",), "python", (TensorMetadata("I", "FP32", (-1, 2)),), ())
    assert plain.from_plain(ModelMetadata, plain.to_plain(metadata)) == metadata


def test_server_options_reach_the_workers_intact():
    from shoal.supervisor.options import ArenaOptions, Restriction, ServerOptions

    options = ServerOptions(
        ("/models",),
        http_port=9,
        http_restricted_api=(Restriction(("health", "metadata"), "k", "v"),),
        arenas=ArenaOptions(limit_bytes=5),
        backend_config=(("python", "a", "b"),),
        rate_limit_resources=((("R", None), 2), (("G", 1), 3)),
        cuda_pool_limits=((0, 1 << 20),),
        frontend_workers=4,
        trace_settings=(("trace_level", ("TIMESTAMPS",)), ("trace_rate", "10")),
    )
    assert plain.from_plain(ServerOptions, plain.to_plain(options)) == options


def test_every_core_api_call_is_forwarded_the_way_it_is_declared():
    import inspect

    from shoal.core.api import CoreAPI
    from shoal.frontends.workers.client import ASYNC_METHODS, SYNC_METHODS, RemoteCore

    declared = {
        name: member
        for name, member in vars(CoreAPI).items() | _inherited(CoreAPI)
        if not name.startswith("_") and callable(member)
    }
    for name, member in declared.items():
        if name in ("infer", "infer_stream"):
            continue
        if name == "frontend_trace":  # one way, a frame of its own (wire.TRACE_STAMPS)
            assert name not in SYNC_METHODS | ASYNC_METHODS
            assert not inspect.iscoroutinefunction(getattr(RemoteCore, name))
            continue
        is_async = inspect.iscoroutinefunction(member)
        assert name in (ASYNC_METHODS if is_async else SYNC_METHODS), name
        assert inspect.iscoroutinefunction(getattr(RemoteCore, name)) == is_async, name


def _inherited(cls: type) -> set:
    found: set = set()
    for base in cls.__mro__[1:]:
        if base.__module__ == "shoal.core.api":
            found |= set(vars(base).items())
    return found


def test_a_large_frame_in_many_reads_then_small_ones_in_one():
    big = np.random.default_rng(1).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    stream = b"".join(bytes(p) for p in wire.frame([1, "big"], [big]))
    stream += b"".join(bytes(p) for p in wire.frame([2, "small"], [b"xy"]))
    stream += b"".join(bytes(p) for p in wire.frame([3, "empty"]))
    frames: list = []
    reader = wire.FrameReader(lambda h, p: frames.append((h, [bytes(v) for v in p])), list)
    for at in range(0, len(stream), 65_531):  # reads that cut prefixes, headers and payloads
        reader.data_received(stream[at : at + 65_531])
    assert frames == [([1, "big"], [big]), ([2, "small"], [b"xy"]), ([3, "empty"], [])]


def test_a_lone_surrogate_crosses_unchanged():
    header, _ = _through(["\udc00", {"note": "\udc00"}], [])
    assert header == ["\udc00", {"note": "\udc00"}]


def test_an_empty_json_tensor_crosses_with_its_shape():
    """A zero in the shape (``[0, 0]``): no bytes, the shape kept (was a 500: memoryview cannot
    cast such a view)."""
    request = InferRequest(
        "m", "", "", [InferInput("E", "UINT8", (0, 0), np.zeros((0, 0), np.uint8))], [], {}
    )
    payloads: list = []
    header, views = _through(wire.request_to_wire(request, payloads), payloads)
    back = wire.request_from_wire(header, views).inputs[0].data
    assert isinstance(back, np.ndarray) and back.shape == (0, 0) and back.dtype == np.uint8
