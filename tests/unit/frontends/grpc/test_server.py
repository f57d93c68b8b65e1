"""The gRPC frontend driven by the real ``tritonclient.grpc``: health, metadata, config, inference,
errors, and the server's lifecycle."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.grpc import service_pb2_grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from shoal.core import ErrorCode
from shoal.frontends.grpc.aio import AddressInUseError, GrpcServer
from shoal.frontends.grpc.status import GRPC_STATUS, Status
from tests.unit.frontends.doubles import LoopThread
from tests.unit.frontends.grpc.test_double import FullCore, client_of, failure_message, serving

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def grpc_core() -> FullCore:
    return FullCore()


@pytest.fixture(scope="module")
def grpc_url(loop_thread: LoopThread, grpc_core: FullCore) -> Iterator[str]:
    with serving(loop_thread, grpc_core) as url:
        yield url


@pytest.fixture(scope="module")
def grpc_client(grpc_url: str) -> Iterator[grpcclient.InferenceServerClient]:
    with client_of(grpc_url) as client:
        yield client


@pytest.fixture
def stub(grpc_url: str) -> Iterator[Any]:
    with grpc.insecure_channel(grpc_url) as channel:
        yield triton_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(autouse=True)
def _fresh_core(grpc_core: FullCore) -> None:
    grpc_core.__init__()  # type: ignore[misc]


# --- health and metadata --------------------------------------------------------------------


def test_live_and_ready_follow_the_core(grpc_client: Any, grpc_core: FullCore) -> None:
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    grpc_core.live = grpc_core.ready = False
    assert not grpc_client.is_server_live()
    assert not grpc_client.is_server_ready()


def test_model_ready(grpc_client: Any) -> None:
    assert grpc_client.is_model_ready("echo")
    assert grpc_client.is_model_ready("echo", "1")
    assert not grpc_client.is_model_ready("echo", "2")
    assert not grpc_client.is_model_ready("unknown")


def test_server_metadata(grpc_client: Any) -> None:
    metadata = grpc_client.get_server_metadata(as_json=True)
    assert metadata == {
        "name": "shoal",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "statistics"],
    }


def test_model_metadata(grpc_client: Any) -> None:
    metadata = grpc_client.get_model_metadata("echo")
    assert metadata.name == "echo"
    assert list(metadata.versions) == ["1", "2"]
    assert metadata.platform == "python"
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "FP32", [-1, 3])
    ]
    assert [t.name for t in metadata.outputs] == ["INPUT0"]


def test_model_config_is_the_core_json_as_a_message(grpc_client: Any) -> None:
    config = grpc_client.get_model_config("echo").config
    assert config.name == "echo" and config.backend == "python"
    assert config.max_batch_size == 8
    assert config.input[0].data_type == triton_pb.model__config__pb2.TYPE_FP32
    assert list(config.input[0].dims) == [3]
    assert list(config.output[0].dims) == [-1]
    assert config.instance_group[0].count == 2
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.parameters["key"].string_value == "value"
    as_json = grpc_client.get_model_config("echo", as_json=True)["config"]
    assert as_json["input"][0] == {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["3"]}
    assert as_json["dynamic_batching"]["preferred_batch_size"] == [4]


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_model_metadata("echo", "x1"),
        lambda c: c.get_model_config("echo", "-1"),
        lambda c: c.is_model_ready("echo", "one"),
    ],
    ids=["metadata", "config", "ready"],
)
def test_a_version_must_be_an_integer(grpc_client: Any, call: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(grpc_client)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "version should be an integral value > 0" in info.value.message()


# --- inference: raw contents, every datatype --------------------------------------------------

SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([0, 7, 255], np.uint8),
    "UINT16": np.array([0, 65535], np.uint16),
    "UINT32": np.array([2**32 - 1], np.uint32),
    "UINT64": np.array([2**64 - 1, 0], np.uint64),
    "INT8": np.array([-128, 127], np.int8),
    "INT16": np.array([-3, 3], np.int16),
    "INT32": np.arange(6, dtype=np.int32).reshape(2, 3),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([0.5, -1.25, 65504], np.float16),
    "FP32": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 2, 2),
    "FP64": np.array([np.pi, -np.e]),
    "BYTES": np.array([b"a", b"", "ünï".encode(), b"\x00\xff"], np.object_).reshape(2, 2),
}


def _input(name: str, datatype: str, array: np.ndarray) -> Any:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_every_datatype_round_trips(grpc_client: Any, grpc_core: FullCore, datatype: str) -> None:
    array = SAMPLES[datatype]
    result = grpc_client.infer("echo", [_input("X", datatype, array)])
    output = result.as_numpy("X")
    assert output.dtype == array.dtype and output.shape == array.shape
    np.testing.assert_array_equal(output, array)
    (received,) = grpc_core.requests[-1].inputs
    assert (received.datatype, received.shape) == (datatype, array.shape)
    assert isinstance(received.data, memoryview) and received.data.readonly
    assert grpc_core.released == grpc_core.issued == 1


def test_response_carries_id_version_parameters_and_raw_contents(
    grpc_client: Any, grpc_core: FullCore
) -> None:
    inputs = [
        _input("A", "INT32", np.array([1, 2], np.int32)),
        _input("B", "FP64", SAMPLES["FP64"]),
    ]
    result = grpc_client.infer(
        "echo",
        inputs,
        model_version="1",
        request_id="req-7",
        parameters={"text": "x", "count": 3, "ratio": 0.5, "flag": False},
        priority=2,
        timeout=1000,
    )
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("echo", "1", "req-7")
    assert [o.name for o in response.outputs] == ["A", "B"]
    assert len(response.raw_output_contents) == 2
    params = result.get_response(as_json=True)["parameters"]
    assert params["text"] == {"string_param": "x"}
    assert params["count"] == {"int64_param": "3"}
    assert params["ratio"] == {"double_param": 0.5}
    assert params["flag"] == {"bool_param": False}
    assert params["echoed"] == {"bool_param": True}
    request = grpc_core.requests[-1]
    assert request.parameters == {
        "text": "x",
        "count": 3,
        "ratio": 0.5,
        "flag": False,
        "priority": 2,
        "timeout": 1000,
    }


def test_requested_outputs_and_their_parameters_reach_the_core(
    grpc_client: Any, grpc_core: FullCore
) -> None:
    inputs = [_input("A", "INT8", SAMPLES["INT8"]), _input("B", "INT16", SAMPLES["INT16"])]
    result = grpc_client.infer(
        "echo", inputs, outputs=[grpcclient.InferRequestedOutput("B", class_count=2)]
    )
    assert [o.name for o in result.get_response().outputs] == ["B"]
    assert result.as_numpy("A") is None
    (requested,) = grpc_core.requests[-1].outputs
    assert (requested.name, requested.parameters) == ("B", {"classification": 2})


def test_shared_memory_outputs_get_an_empty_raw_entry_that_keeps_positions(
    stub: Any, grpc_core: FullCore
) -> None:
    request = triton_pb.ModelInferRequest(model_name="echo")
    for name in ("A", "B"):
        request.inputs.add(name=name, datatype="INT32", shape=[2])
        request.raw_input_contents.append(np.array([1, 2], np.int32).tobytes())
        request.outputs.add(name=name)
    request.outputs[0].parameters["shared_memory_region"].string_param = "out"
    request.outputs[0].parameters["shared_memory_byte_size"].int64_param = 8
    response = stub.ModelInfer(request, timeout=10)
    assert [o.name for o in response.outputs] == ["A", "B"]
    assert list(response.raw_output_contents) == [b"", np.array([1, 2], np.int32).tobytes()]
    params = response.outputs[0].parameters
    assert params["shared_memory_region"].string_param == "out"
    assert grpc_core.requests[-1].outputs[0].parameters == {
        "shared_memory_region": "out",
        "shared_memory_byte_size": 8,
    }


def test_shared_memory_inputs_take_no_raw_entry(stub: Any, grpc_core: FullCore) -> None:
    request = triton_pb.ModelInferRequest(model_name="echo")
    shm = request.inputs.add(name="A", datatype="FP32", shape=[4])
    shm.parameters["shared_memory_region"].string_param = "in"
    shm.parameters["shared_memory_offset"].int64_param = 16
    request.inputs.add(name="B", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([9], np.int32).tobytes())
    request.outputs.add(name="B")
    response = stub.ModelInfer(request, timeout=10)
    assert list(response.raw_output_contents) == [np.array([9], np.int32).tobytes()]
    first, second = grpc_core.requests[-1].inputs
    assert bytes(first.data) == b"" and first.parameters["shared_memory_offset"] == 16
    assert bytes(second.data) == np.array([9], np.int32).tobytes()


# --- inference: typed contents ----------------------------------------------------------------

TYPED: list[tuple[str, str, list[Any], Any]] = [
    ("BOOL", "bool_contents", [True, False], np.bool_),
    ("INT8", "int_contents", [-128, 127], np.int8),
    ("INT16", "int_contents", [-300, 300], np.int16),
    ("INT32", "int_contents", [-(2**31), 2**31 - 1], np.int32),
    ("INT64", "int64_contents", [-(2**63), 5], np.int64),
    ("UINT8", "uint_contents", [0, 255], np.uint8),
    ("UINT16", "uint_contents", [1, 65535], np.uint16),
    ("UINT32", "uint_contents", [0, 2**32 - 1], np.uint32),
    ("UINT64", "uint64_contents", [2**64 - 1, 3], np.uint64),
    ("FP32", "fp32_contents", [0.5, -2.0], np.float32),
    ("FP64", "fp64_contents", [1e300, -0.25], np.float64),
    ("BYTES", "bytes_contents", [b"hi", b""], np.object_),
]


@pytest.mark.parametrize(("datatype", "field", "values", "dtype"), TYPED, ids=[t[0] for t in TYPED])
def test_typed_contents_become_arrays_of_the_datatype(
    stub: Any, grpc_core: FullCore, datatype: str, field: str, values: list[Any], dtype: Any
) -> None:
    request = triton_pb.ModelInferRequest(model_name="echo", id="typed")
    tensor = request.inputs.add(name="X", datatype=datatype, shape=[1, 2])
    getattr(tensor.contents, field).extend(values)
    response = stub.ModelInfer(request, timeout=10)
    (received,) = grpc_core.requests[-1].inputs
    assert isinstance(received.data, np.ndarray)
    assert received.data.dtype == np.dtype(dtype) and received.data.shape == (1, 2)
    assert received.data.reshape(-1).tolist() == values
    assert response.id == "typed" and len(response.raw_output_contents) == 1
    result = grpcclient.InferResult(response)
    assert result.as_numpy("X").reshape(-1).tolist() == values


@pytest.mark.parametrize(
    ("datatype", "field", "values", "message"),
    [
        ("INT8", "int_contents", [1, 128], "out of range for INT8"),
        ("FP32", "fp64_contents", [1.0, 2.0], "got fp64_contents, expected fp32_contents"),
        ("FP16", "fp32_contents", [1.0, 2.0], "FP16 data cannot be sent in 'contents'"),
        ("INT32", "int_contents", [1, 2, 3], "shape [1, 2] has 2 elements, got 3"),
    ],
)
def test_bad_typed_contents_are_invalid(
    stub: Any, datatype: str, field: str, values: list[Any], message: str
) -> None:
    request = triton_pb.ModelInferRequest(model_name="echo")
    tensor = request.inputs.add(name="X", datatype=datatype, shape=[1, 2])
    getattr(tensor.contents, field).extend(values)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def _raw_request(**changes: Any) -> Any:
    request = triton_pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="A", datatype="INT32", shape=[2])
    request.inputs.add(name="B", datatype="INT32", shape=[2])
    request.raw_input_contents.extend([np.array([1, 2], np.int32).tobytes()] * 2)
    for key, value in changes.items():
        value(request) if callable(value) else setattr(request, key, value)
    return request


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.raw_input_contents.pop(), "unable to find data for input tensor 'B'"),
        (lambda r: r.raw_input_contents.append(b""), "expected 2 raw_input_contents entries"),
        (lambda r: r.inputs[0].contents.int_contents.extend([1, 2]), "contents field must not"),
        (lambda r: r.raw_input_contents.__setitem__(0, b"123"), "Expected 8, got 3"),
        (lambda r: setattr(r.inputs[1], "name", "A"), "input 'A' already exists"),
        (lambda r: setattr(r.inputs[1], "datatype", "FP8"), "invalid datatype for input B: 'FP8'"),
        (lambda r: r.inputs[1].shape.__setitem__(0, -2), "dimensions must be >= 0"),
        (lambda r: setattr(r.parameters["triton_x"], "bool_param", True), "reserved for Triton"),
        (
            lambda r: setattr(r.parameters["sequence_start"], "int64_param", 1),
            "Unable to parse 'sequence_start'",
        ),
        (lambda r: r.parameters["empty"], "no value is set"),
    ],
    ids=[
        "too-few-raw",
        "too-many-raw",
        "raw-and-typed",
        "byte-size",
        "duplicate",
        "datatype",
        "shape",
        "reserved",
        "param-type",
        "empty-param",
    ],
)
def test_malformed_requests_are_invalid_argument(stub: Any, change: Any, message: str) -> None:
    request = _raw_request()
    change(request)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_malformed_bytes_input_is_invalid(grpc_client: Any, stub: Any) -> None:
    request = triton_pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="S", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(b"\x09\x00\x00\x00abc")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds the end of the buffer" in info.value.details()


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata"])
def test_a_message_that_is_not_protobuf_is_invalid(grpc_url: str, method: str) -> None:
    with grpc.insecure_channel(grpc_url) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\x0a\x05ab", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to parse the request message" in info.value.details()


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(ErrorCode), ids=[c.name for c in ErrorCode])
def test_every_core_error_code_maps_to_its_status(grpc_client: Any, code: ErrorCode) -> None:
    model = f"fail_{code.name.lower()}"
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(model, [_input("X", "INT32", np.array([1], np.int32))])
    assert info.value.status() == f"StatusCode.{GRPC_STATUS[code].name}"
    assert info.value.message() == failure_message(model)


def test_status_table_is_complete_and_as_documented() -> None:
    assert set(GRPC_STATUS) == set(ErrorCode)
    assert {code.name: status.name for code, status in GRPC_STATUS.items()} == {
        "UNKNOWN": "UNKNOWN",
        "INTERNAL": "INTERNAL",
        "NOT_FOUND": "NOT_FOUND",
        "INVALID_ARG": "INVALID_ARGUMENT",
        "UNAVAILABLE": "UNAVAILABLE",
        "UNSUPPORTED": "UNIMPLEMENTED",
        "ALREADY_EXISTS": "ALREADY_EXISTS",
        "CANCELLED": "CANCELLED",
        "RESOURCE_EXHAUSTED": "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED": "DEADLINE_EXCEEDED",
        "PERMISSION_DENIED": "PERMISSION_DENIED",
    }


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_model_metadata("missing"),
        lambda c: c.get_model_config("missing"),
        lambda c: c.infer("missing", [_input("X", "INT32", np.array([1], np.int32))]),
    ],
    ids=["metadata", "config", "infer"],
)
def test_unknown_model_is_not_found(grpc_client: Any, call: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        call(grpc_client)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "'missing' is not found" in info.value.message()


def test_a_bug_in_the_core_is_internal_and_logged(
    grpc_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("crash", [_input("X", "INT32", np.array([1], np.int32))])
    assert info.value.status() == "StatusCode.INTERNAL"
    assert info.value.message() == "internal error while serving ModelInfer; see the server log"
    assert "a bug in the core" in caplog.text


def test_a_bad_output_is_internal_and_the_response_still_released(
    grpc_client: Any, grpc_core: FullCore
) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("bad_output", [_input("X", "INT32", np.array([1], np.int32))])
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "shape [4] of FP32 needs 16 bytes, got 3" in info.value.message()
    assert grpc_core.released == grpc_core.issued == 1


def test_an_unknown_method_is_unimplemented(grpc_url: str) -> None:
    with grpc.insecure_channel(grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


# --- lifecycle --------------------------------------------------------------------------------


def test_port_zero_binds_a_free_port_and_stop_releases_it(loop_thread: LoopThread) -> None:
    server = GrpcServer(FullCore())
    port = loop_thread.run(server.start("127.0.0.1", 0))
    with client_of(f"127.0.0.1:{port}") as client:
        assert client.is_server_live()
    loop_thread.run(server.stop(None))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()  # nobody listens
    loop_thread.run(server.stop())  # stopping twice is a no-op


def test_address_in_use_is_a_clear_error(loop_thread: LoopThread) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = GrpcServer(FullCore())
        with pytest.raises(AddressInUseError) as info:
            loop_thread.run(server.start("127.0.0.1", port))
    # Triton's log line, word for word (its QA greps for it).
    socket_in_use = f"Socket '127.0.0.1:{port}' already in use"
    expected = f"failed to start GRPC service: Unavailable - {socket_in_use}"
    assert str(info.value) == expected


def test_a_second_server_on_the_same_port_is_refused(loop_thread: LoopThread) -> None:
    with serving(loop_thread, FullCore()) as url:
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(AddressInUseError):
            loop_thread.run(GrpcServer(FullCore()).start("127.0.0.1", port))


def test_starting_twice_is_refused(loop_thread: LoopThread) -> None:
    server = GrpcServer(FullCore())
    loop_thread.run(server.start("127.0.0.1", 0))
    try:
        with pytest.raises(RuntimeError, match="already running"):
            loop_thread.run(server.start("127.0.0.1", 0))
    finally:
        loop_thread.run(server.stop())


def test_messages_over_the_limit_are_refused(loop_thread: LoopThread) -> None:
    with serving(loop_thread, FullCore(), max_message_bytes=1024) as url, client_of(url) as c:
        small = _input("X", "UINT8", np.zeros(100, np.uint8))
        assert c.infer("echo", [small]).as_numpy("X").shape == (100,)
        with pytest.raises(InferenceServerException) as info:
            c.infer("echo", [_input("X", "UINT8", np.zeros(4096, np.uint8))])
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_stop_with_grace_lets_a_running_request_finish(loop_thread: LoopThread) -> None:
    import asyncio

    core = FullCore()
    core.gate = asyncio.Event()
    server = GrpcServer(core)
    port = loop_thread.run(server.start("127.0.0.1", 0))
    with client_of(f"127.0.0.1:{port}") as client:
        results: list[Any] = []
        client.async_infer(
            "gated",
            [_input("X", "INT32", np.array([4], np.int32))],
            callback=lambda result, error: results.append((result, error)),
        )
        _wait_for(lambda: len(core.requests) == 1)
        stopping = loop_thread.submit(server.stop(grace=10))
        loop_thread.call(core.gate.set)
        stopping.result(15)
        _wait_for(lambda: bool(results))
    result, error = results[0]
    assert error is None and result.as_numpy("X").tolist() == [4]


def _wait_for(condition: Any, timeout: float = 10) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)  # polling a condition set by another thread, not waiting on time


def test_status_numbers_are_grpcs() -> None:
    assert {status.name: int(status) for status in Status} == {
        code.name: code.value[0] for code in grpc.StatusCode
    }


def test_native_server_and_method_table_do_not_import_grpcio() -> None:
    code = (
        "import sys, shoal.frontends.grpc.native, shoal.frontends.grpc.methods, shoal.server;"
        " print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
