"""ONNX models served by a real ``shoal serve`` through the built-in onnxruntime backend.

The repository is written in ``tmp_path``: models with a full config.pbtxt, with none, with only
a backend line (auto-completed from the graph), a dynamically batched one, and broken ones.
Skipped when onnx or onnxruntime is missing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from tests.integration.inputs import http_inputs  # noqa: E402
from tests.integration.server import ShoalServer  # noqa: E402

pytestmark = pytest.mark.timeout(120)

F = TensorProto.FLOAT
WEIGHTS = np.arange(6, dtype=np.float32).reshape(3, 2)


def save(path: Path, nodes, inputs, outputs, initializers=()) -> None:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def add_sub(path: Path, shape) -> None:
    save(
        path,
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [vi("INPUT0", F, shape), vi("INPUT1", F, shape)],
        [vi("OUTPUT0", F, shape), vi("OUTPUT1", F, shape)],
    )


def matmul(path: Path) -> None:
    weights = helper.make_tensor("W", F, [3, 2], WEIGHTS.reshape(-1).tolist())
    save(
        path,
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        [vi("X", F, ["batch", 3])],
        [vi("Y", F, ["batch", 2])],
        [weights],
    )


ADD_CONFIG = """
backend: "onnxruntime"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# Three requests of 1, 2 and 3 rows make the preferred batch of 6: one execution, at once.
BATCHED_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 5000000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


# Implicit state through the sequence batcher: STATE_OUT = STATE_IN + IN, OUT = STATE_OUT.
ACCUMULATOR_CONFIG = """
backend: "onnxruntime"
max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
sequence_batching {
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ {
    input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }
  } ]
}
"""


def accumulator(path: Path) -> None:
    i32 = TensorProto.INT32
    save(
        path,
        [
            helper.make_node("Add", ["STATE_IN", "IN"], ["STATE_OUT"]),
            helper.make_node("Identity", ["STATE_OUT"], ["OUT"]),
        ],
        [vi("IN", i32, ["b", 1]), vi("START", i32, ["b", 1]), vi("STATE_IN", i32, ["b", 1])],
        [vi("OUT", i32, ["b", 1]), vi("STATE_OUT", i32, ["b", 1])],
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("onnx_repo")
    # Full configuration, no batching.
    add_sub(root / "add_config" / "1" / "model.onnx", [4])
    (root / "add_config" / "config.pbtxt").write_text(ADD_CONFIG)
    # No config.pbtxt at all: everything comes from the graph (batch dim -> max_batch_size 4).
    add_sub(root / "add_auto" / "1" / "model.onnx", ["batch", 4])
    # Only the platform and the batcher: inputs and outputs come from the graph.
    matmul(root / "matmul_batched" / "1" / "model.onnx")
    (root / "matmul_batched" / "config.pbtxt").write_text(BATCHED_CONFIG)
    # Strings with a batch dim only: dims [1] with reshape [] (as Triton auto-completes them).
    save(
        root / "strings" / "1" / "model.onnx",
        [helper.make_node("Identity", ["S"], ["T"])],
        [vi("S", TensorProto.STRING, ["n"])],
        [vi("T", TensorProto.STRING, ["n"])],
    )
    (root / "strings" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    accumulator(root / "accumulator" / "1" / "model.onnx")
    (root / "accumulator" / "config.pbtxt").write_text(ACCUMULATOR_CONFIG)
    # Broken: not a graph (with inputs/outputs given, so the stub finds out) ...
    (root / "bad_graph" / "1").mkdir(parents=True)
    (root / "bad_graph" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    (root / "bad_graph" / "config.pbtxt").write_text(ADD_CONFIG)
    # ... not a graph, to be auto-completed (the supervisor finds out) ...
    (root / "bad_auto" / "1").mkdir(parents=True)
    (root / "bad_auto" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    (root / "bad_auto" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    # ... and a datatype that disagrees with the graph.
    add_sub(root / "wrong_type" / "1" / "model.onnx", [4])
    (root / "wrong_type" / "config.pbtxt").write_text(
        ADD_CONFIG.replace('"INPUT0" data_type: TYPE_FP32', '"INPUT0" data_type: TYPE_INT32')
    )
    return root


@pytest.fixture(scope="module")
def server(repo):
    with ShoalServer(repo) as running:
        yield running


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    yield c
    c.close()


def test_a_configured_model_infers_over_http_and_grpc(server, client):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 3, dtype=np.float32)
    result = client.infer("add_config", http_inputs(INPUT0=a, INPUT1=b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = []
        for name, array in (("INPUT0", a), ("INPUT1", b)):
            tensor = grpcclient.InferInput(name, [4], "FP32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        wanted = [grpcclient.InferRequestedOutput("OUTPUT1")]
        result = grpc.infer("add_config", inputs, outputs=wanted, client_timeout=60)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        assert result.as_numpy("OUTPUT0") is None  # not requested, not sent
    finally:
        grpc.close()


def test_a_model_without_config_is_completed_from_its_graph(client):
    config = client.get_model_config("add_auto")
    assert config["backend"] == "onnxruntime"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4]),
        ("INPUT1", "TYPE_FP32", [4]),
    ]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer("add_auto", http_inputs(INPUT0=a, INPUT1=a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_requests_are_batched_into_one_session_run(client, server):
    config = client.get_model_config("matmul_batched")
    assert config["max_batch_size"] == 8  # as configured, not the default
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("X", [3])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("Y", [2])]
    xs = [np.arange(n * 3, dtype=np.float32).reshape(n, 3) + n for n in (1, 2, 3)]

    def infer(x: np.ndarray) -> np.ndarray:
        own = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            return own.infer("matmul_batched", http_inputs(X=x)).as_numpy("Y")
        finally:
            own.close()

    with ThreadPoolExecutor(len(xs)) as pool:
        ys = list(pool.map(infer, xs))
    for x, y in zip(xs, ys, strict=True):
        np.testing.assert_allclose(y, x @ WEIGHTS)
    stats = client.get_inference_statistics("matmul_batched")["model_stats"][0]
    assert stats["inference_count"] == 6
    assert stats["execution_count"] == 1
    assert [b["batch_size"] for b in stats["batch_stats"]] == [6]


def test_strings_round_trip_with_the_auto_completed_reshape(client):
    config = client.get_model_config("strings")
    assert config["max_batch_size"] == 4
    assert config["input"][0]["dims"] == [1]
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    words = np.array([[b"alpha"], ["\u00e9t\u00e9".encode()]], dtype=np.object_)
    result = client.infer("strings", http_inputs(S=words))
    got = result.as_numpy("T")
    assert got.shape == (2, 1)
    assert got.reshape(-1).tolist() == words.reshape(-1).tolist()


def test_broken_models_fail_to_load_with_a_reason_naming_them(client):
    reasons = {
        entry["name"]: entry.get("reason", "")
        for entry in client.get_model_repository_index()
        if entry.get("state") != "READY"
    }
    assert (
        "unable to load model 'bad_graph' version 1: onnxruntime cannot create a session"
        in (reasons["bad_graph"])
    )
    assert "cannot read the ONNX graph" in reasons["bad_auto"]
    assert (
        "configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"
        in reasons["wrong_type"]
    )
    assert {"add_config", "add_auto", "matmul_batched", "strings", "accumulator"}.isdisjoint(
        reasons
    )
    with pytest.raises(InferenceServerException, match="bad_graph"):
        a = np.zeros(4, dtype=np.float32)
        client.infer("bad_graph", http_inputs(INPUT0=a, INPUT1=a))


def test_a_bad_request_is_an_error_and_the_model_keeps_serving(client):
    bad = np.zeros((1, 5), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        client.infer("add_auto", http_inputs(INPUT0=bad, INPUT1=bad))
    a = np.ones((1, 4), dtype=np.float32)
    result = client.infer("add_auto", http_inputs(INPUT0=a, INPUT1=a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 4), np.float32))


def test_implicit_state_through_the_sequence_batcher(client):
    def step(value: int, sequence: int, start: bool = False, end: bool = False) -> int:
        tensor = httpclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer(
            "accumulator",
            [tensor],
            sequence_id=sequence,
            sequence_start=start,
            sequence_end=end,
        )
        assert result.as_numpy("STATE_OUT") is None  # the state stays in the server
        return int(result.as_numpy("OUT")[0, 0])

    assert [step(1, 7, start=True), step(2, 7), step(3, 7, end=True)] == [1, 3, 6]
    assert [step(10, 8, start=True), step(5, 8, end=True)] == [10, 15]
