"""The onnxruntime backend's model class, and the supervisor's auto-complete from an ONNX graph.

Models are built in the tests with ``onnx.helper``. Skipped when onnx or onnxruntime is missing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from shoal import config as model_config  # noqa: E402
from shoal.protos import model_config_pb2 as pb  # noqa: E402
from shoal.stub import loader, pb_utils  # noqa: E402
from shoal.stub.backends import builtin_backend  # noqa: E402
from shoal.stub.backends._onnx_io import OnnxModelError  # noqa: E402
from shoal.stub.backends.onnxruntime import OnnxRuntimeModel  # noqa: E402
from shoal.supervisor.models import onnx_autocomplete as ac  # noqa: E402
from tests.unit.stub.helpers import config_tensor as tensor  # noqa: E402
from tests.unit.stub.helpers import instance_args as args_for  # noqa: E402
from tests.unit.stub.helpers import server_request  # noqa: E402

pytestmark = pytest.mark.timeout(60)

F = TensorProto.FLOAT


def save(path: Path, nodes, inputs, outputs, initializers=()) -> Path:
    """An ONNX model file (opset 13, IR 8: what every onnxruntime in use reads)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def vi(name: str, elem_type: int, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def add_sub(path: Path, shape=(4,)) -> Path:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    return save(
        path,
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [vi("INPUT0", F, list(shape)), vi("INPUT1", F, list(shape))],
        [vi("OUTPUT0", F, list(shape)), vi("OUTPUT1", F, list(shape))],
    )


WEIGHTS = np.arange(6, dtype=np.float32).reshape(3, 2)


def matmul(path: Path) -> Path:
    """Y[b, 2] = X[b, 3] @ W (an initializer)."""
    weights = helper.make_tensor("W", F, [3, 2], WEIGHTS.reshape(-1).tolist())
    return save(
        path,
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        [vi("X", F, ["batch", 3])],
        [vi("Y", F, ["batch", 2])],
        [weights],
    )


def load(path: Path, config: dict) -> OnnxRuntimeModel:
    model = OnnxRuntimeModel(str(path))
    model.initialize(args_for({"backend": "onnxruntime", **config}))
    return model


ADD_CONFIG = {
    "name": "add",
    "max_batch_size": 0,
    "input": [tensor("INPUT0", "TYPE_FP32", [4]), tensor("INPUT1", "TYPE_FP32", [4])],
    "output": [tensor("OUTPUT0", "TYPE_FP32", [4]), tensor("OUTPUT1", "TYPE_FP32", [4])],
}

MATMUL_CONFIG = {
    "name": "mm",
    "max_batch_size": 8,
    "input": [tensor("X", "TYPE_FP32", [3])],
    "output": [tensor("Y", "TYPE_FP32", [2])],
}


def outputs(response) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


class CountingSession:
    """Wraps a session to count ``run`` calls and keep what they were fed."""

    def __init__(self, session) -> None:
        self.session = session
        self.feeds: list[dict] = []

    def run(self, names, feed):
        self.feeds.append(feed)
        return self.session.run(names, feed)


# -- the model class ------------------------------------------------------------------------


def test_add_sub_returns_the_requested_outputs(tmp_path):
    model = load(add_sub(tmp_path / "1" / "model.onnx"), ADD_CONFIG)
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 10, dtype=np.float32)
    everything, only_sub = model.execute(
        [
            server_request({"INPUT0": a, "INPUT1": b}),
            server_request({"INPUT0": a, "INPUT1": b}, requested=["OUTPUT1"]),
        ]
    )
    got = outputs(everything)
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)
    assert list(outputs(only_sub)) == ["OUTPUT1"]
    model.finalize()
    assert model.session is None


def test_read_only_inputs_reach_onnxruntime_without_a_copy(tmp_path):
    model = load(add_sub(tmp_path / "1" / "model.onnx"), ADD_CONFIG)
    model.session = counting = CountingSession(model.session)
    request = server_request({"INPUT0": np.ones(4, np.float32), "INPUT1": np.ones(4, np.float32)})
    given = request.inputs()[0].as_numpy()
    assert not given.flags.writeable
    (response,) = model.execute([request])
    np.testing.assert_array_equal(outputs(response)["OUTPUT0"], np.full(4, 2, np.float32))
    assert counting.feeds[0]["INPUT0"] is given  # the shared-memory view itself


def test_a_batch_of_requests_is_one_session_run_split_back(tmp_path):
    model = load(matmul(tmp_path / "1" / "model.onnx"), MATMUL_CONFIG)
    model.session = counting = CountingSession(model.session)
    xs = [np.arange(n * 3, dtype=np.float32).reshape(n, 3) + n for n in (1, 3, 2)]
    responses = model.execute([server_request({"X": x}) for x in xs])
    assert len(counting.feeds) == 1
    assert counting.feeds[0]["X"].shape == (6, 3)
    for x, response in zip(xs, responses, strict=True):
        y = outputs(response)["Y"]
        assert y.shape == (x.shape[0], 2)
        np.testing.assert_allclose(y, x @ WEIGHTS)


def test_a_single_batched_request_is_not_copied(tmp_path):
    model = load(matmul(tmp_path / "1" / "model.onnx"), MATMUL_CONFIG)
    model.session = counting = CountingSession(model.session)
    request = server_request({"X": np.ones((2, 3), np.float32)})
    (response,) = model.execute([request])
    assert counting.feeds[0]["X"] is request.inputs()[0].as_numpy()
    np.testing.assert_allclose(outputs(response)["Y"], np.ones((2, 3)) @ WEIGHTS)


def test_strings_go_in_and_come_back_as_bytes(tmp_path):
    path = save(
        tmp_path / "1" / "model.onnx",
        [helper.make_node("Identity", ["S"], ["T"])],
        [vi("S", TensorProto.STRING, [-1])],
        [vi("T", TensorProto.STRING, [-1])],
    )
    config = {
        "name": "strings",
        "max_batch_size": 0,
        "input": [tensor("S", "TYPE_STRING", [-1])],
        "output": [tensor("T", "TYPE_STRING", [-1])],
    }
    model = load(path, config)
    words = np.array([b"hello", "w\u00f6rld".encode()], dtype=np.object_)
    good, bad = model.execute(
        [
            server_request({"S": words}),
            server_request({"S": np.array([b"\xff\xfe"], dtype=np.object_)}),
        ]
    )
    got = outputs(good)["T"]
    assert got.dtype == np.object_ and list(got) == list(words)
    assert bad.has_error()
    assert "input 'S'" in bad.error().message() and "UTF-8" in bad.error().message()


def test_bool_tensors(tmp_path):
    path = save(
        tmp_path / "1" / "model.onnx",
        [helper.make_node("Not", ["B"], ["NB"])],
        [vi("B", TensorProto.BOOL, [3])],
        [vi("NB", TensorProto.BOOL, [3])],
    )
    config = {
        "name": "not",
        "input": [tensor("B", "TYPE_BOOL", [3])],
        "output": [tensor("NB", "TYPE_BOOL", [3])],
    }
    model = load(path, config)
    (response,) = model.execute([server_request({"B": np.array([True, False, True])})])
    np.testing.assert_array_equal(outputs(response)["NB"], [False, True, False])


def test_a_scalar_is_dims_1_for_the_client(tmp_path):
    path = save(
        tmp_path / "1" / "model.onnx",
        [helper.make_node("Neg", ["A"], ["B"])],
        [vi("A", F, [])],
        [vi("B", F, [])],
    )
    config = {
        "name": "scalar",
        "input": [tensor("A", "TYPE_FP32", [1])],
        "output": [tensor("B", "TYPE_FP32", [1])],
    }
    model = load(path, config)
    (response,) = model.execute([server_request({"A": np.array([2.5], np.float32)})])
    got = outputs(response)["B"]
    assert got.shape == (1,) and got[0] == -2.5


def test_output_reshape_gives_the_client_its_dims(tmp_path):
    path = save(
        tmp_path / "1" / "model.onnx",
        [helper.make_node("Neg", ["A"], ["B"])],
        [vi("A", F, ["n"])],
        [vi("B", F, ["n"])],
    )
    config = {
        "name": "flat",
        "max_batch_size": 4,
        "input": [tensor("A", "TYPE_FP32", [1], reshape=[])],
        "output": [tensor("B", "TYPE_FP32", [1], reshape=[])],
    }
    model = load(path, config)
    # The supervisor applies input reshapes: the stub gets [batch] for dims [1] reshape [].
    first, second = model.execute(
        [
            server_request({"A": np.array([1, 2], np.float32)}),
            server_request({"A": np.array([3], np.float32)}),
        ]
    )
    np.testing.assert_array_equal(outputs(first)["B"], [[-1], [-2]])
    np.testing.assert_array_equal(outputs(second)["B"], [[-3]])


def test_a_session_error_fails_the_requests_naming_the_model(tmp_path):
    model = load(matmul(tmp_path / "1" / "model.onnx"), MATMUL_CONFIG)
    (response,) = model.execute([server_request({"X": np.ones((1, 5), np.float32)})])
    assert response.has_error()
    message = response.error().message()
    assert "onnxruntime failed to run model 'mm'" in message


def test_requests_that_cannot_be_concatenated_fail_together(tmp_path):
    model = load(matmul(tmp_path / "1" / "model.onnx"), MATMUL_CONFIG)
    first, second = model.execute(
        [
            server_request({"X": np.ones((1, 3), np.float32)}),
            server_request({"X": np.ones((1, 4), np.float32)}),
        ]
    )
    for response in (first, second):
        assert response.has_error()
        assert "cannot be concatenated" in response.error().message()


# -- load errors ----------------------------------------------------------------------------


def test_a_missing_file_is_a_load_error_naming_the_model(tmp_path):
    model = OnnxRuntimeModel(str(tmp_path / "1" / "model.onnx"))
    with pytest.raises(OnnxModelError, match=r"'add' version 1: ONNX model file .* not found"):
        model.initialize(args_for({"backend": "onnxruntime", **ADD_CONFIG}))


def test_a_bad_graph_is_a_load_error_naming_the_model(tmp_path):
    path = tmp_path / "1" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(b"this is not an onnx model")
    with pytest.raises(OnnxModelError, match="unable to load model 'add' version 1: onnxruntime"):
        load(path, ADD_CONFIG)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"input": [tensor("INPUT0", "TYPE_INT32", [4]), tensor("INPUT1", "TYPE_FP32", [4])]},
            "configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides "
            "TYPE_FP32",
        ),
        (
            {"input": [tensor("INPUT0", "TYPE_FP32", [4]), tensor("OTHER", "TYPE_FP32", [4])]},
            "configuration has input 'OTHER', which the ONNX graph does not have",
        ),
        (
            {"input": [tensor("INPUT0", "TYPE_FP32", [4])]},
            "the ONNX graph has input(s) 'INPUT1' that the configuration does not list",
        ),
        (
            {"output": [tensor("OUTPUT0", "TYPE_FP32", [5])]},
            "output 'OUTPUT0' has shape [4] in the ONNX graph, but the configuration gives [5]",
        ),
        (
            {"max_batch_size": 4},
            "needs a variable first (batch) dimension",
        ),
        # Triton's onnxruntime backend's words, which its L0_model_config matches
        (
            {"input": [tensor("INPUT0", "TYPE_FP32", [4]), tensor("OTHER", "TYPE_FP32", [4])]},
            "unexpected inference input 'OTHER', allowed inputs are: INPUT0, INPUT1",
        ),
        (
            {"input": [tensor("INPUT0", "TYPE_FP32", [4])]},
            "unable to load model 'add', configuration expects 1 inputs, model provides 2",
        ),
        (
            {"output": [tensor("OUTPUT0", "TYPE_FP32", [4, 1])]},
            "tensor 'OUTPUT0': the model expects 1 dimensions (shape [4]) but the model "
            "configuration specifies 2 dimensions (shape [4,1])",
        ),
    ],
)
def test_a_configuration_that_does_not_fit_the_graph_is_a_load_error(tmp_path, change, message):
    path = add_sub(tmp_path / "1" / "model.onnx")
    with pytest.raises(OnnxModelError) as caught:
        load(path, {**ADD_CONFIG, **change})
    assert message in str(caught.value)
    assert "'add'" in str(caught.value)


def test_sequence_control_and_state_tensors_need_not_be_configured(tmp_path):
    path = save(
        tmp_path / "1" / "model.onnx",
        [
            helper.make_node("Add", ["STATE_IN", "X"], ["STATE_OUT"]),
            helper.make_node("Identity", ["STATE_OUT"], ["Y"]),
        ],
        [vi("X", F, ["b", 1]), vi("START", F, ["b", 1]), vi("STATE_IN", F, ["b", 1])],
        [vi("Y", F, ["b", 1]), vi("STATE_OUT", F, ["b", 1])],
    )
    sequence = {
        "control_input": [{"name": "START"}],
        "state": [{"input_name": "STATE_IN", "output_name": "STATE_OUT"}],
    }
    config = {
        "name": "acc",
        "max_batch_size": 2,
        "input": [tensor("X", "TYPE_FP32", [1])],
        "output": [tensor("Y", "TYPE_FP32", [1])],
        "sequence_batching": sequence,
    }
    model = load(path, config)
    one = np.ones((1, 1), np.float32)
    # The sequence batcher adds START and STATE_IN, and asks for STATE_OUT besides Y.
    (response,) = model.execute(
        [
            server_request(
                {"X": one, "START": one, "STATE_IN": one * 5}, requested=["Y", "STATE_OUT"]
            )
        ]
    )
    got = outputs(response)
    assert got["Y"][0, 0] == 6 and got["STATE_OUT"][0, 0] == 6
    wrong = {**sequence, "state": [{"input_name": "STATE_IN", "output_name": "NOPE"}]}
    with pytest.raises(OnnxModelError, match="state output 'NOPE' is not an output"):
        load(path, {**config, "sequence_batching": wrong})


def test_overridable_initializers_need_not_be_configured(tmp_path):
    weights = helper.make_tensor("W", F, [3, 2], WEIGHTS.reshape(-1).tolist())
    path = save(
        tmp_path / "1" / "model.onnx",
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        [vi("X", F, ["batch", 3]), vi("W", F, [3, 2])],  # W is also a graph input
        [vi("Y", F, ["batch", 2])],
        [weights],
    )
    model = load(path, MATMUL_CONFIG)
    (response,) = model.execute([server_request({"X": np.ones((1, 3), np.float32)})])
    np.testing.assert_allclose(outputs(response)["Y"], np.ones((1, 3)) @ WEIGHTS)


def test_session_options_follow_tritons_parameters(tmp_path):
    config = {
        **ADD_CONFIG,
        "parameters": {
            "intra_op_thread_count": {"string_value": "2"},
            "execution_mode": {"string_value": "1"},
        },
        "optimization": {"graph": {"level": 2}},
    }
    model = load(add_sub(tmp_path / "1" / "model.onnx"), config)
    options = model.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert str(options.execution_mode).endswith("ORT_PARALLEL")
    assert str(options.graph_optimization_level).endswith("ORT_DISABLE_ALL")
    with pytest.raises(OnnxModelError, match="execution_mode must be 0"):
        load(
            add_sub(tmp_path / "2" / "model.onnx"),
            {**ADD_CONFIG, "parameters": {"execution_mode": {"string_value": "3"}}},
        )


def test_the_loader_creates_the_builtin_model_for_the_onnxruntime_backend(tmp_path):
    path = add_sub(tmp_path / "1" / "model.onnx")
    args = args_for({"platform": "onnxruntime_onnx", **ADD_CONFIG})
    assert builtin_backend(args) == "onnxruntime"
    assert builtin_backend(args_for({"backend": "python", "name": "p"})) is None
    model = loader.create_model(str(path), args)
    assert isinstance(model, OnnxRuntimeModel)
    model.initialize(args)
    (response,) = model.execute(
        [server_request({"INPUT0": np.ones(4, np.float32), "INPUT1": np.ones(4, np.float32)})]
    )
    assert isinstance(response, pb_utils.InferenceResponse)
    assert not response.has_error()


# -- auto-complete in the supervisor ----------------------------------------------------------


def graph(inputs, outputs) -> ac.Graph:
    return ac.Graph(
        tuple(ac.GraphTensor(n, t, d) for n, t, d in inputs),
        tuple(ac.GraphTensor(n, t, d) for n, t, d in outputs),
    )


BATCHED = graph([("X", 1, (-1, 3)), ("S", 8, (-1,))], [("Y", 1, (-1, 2))])


def complete(proto: pb.ModelConfig, g: ac.Graph, default: int = 4) -> pb.ModelConfig:
    return ac.complete_from_graph(proto, g, model="m", default_max_batch=default)


def as_json(config: pb.ModelConfig) -> dict:
    return model_config.config_to_json(config, include_defaults=False)


def test_a_batching_graph_gets_the_default_max_batch_size_and_dynamic_batching():
    done = as_json(complete(pb.ModelConfig(backend="onnxruntime"), BATCHED))
    assert done["max_batch_size"] == 4
    assert "dynamic_batching" in done
    assert done["input"] == [
        {"name": "X", "data_type": "TYPE_FP32", "dims": [3]},
        {"name": "S", "data_type": "TYPE_STRING", "dims": [1], "reshape": {}},
    ]
    assert done["output"] == [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]


def test_a_configured_max_batch_size_and_scheduler_are_kept():
    proto = pb.ModelConfig(max_batch_size=16)
    proto.sequence_batching.SetInParent()
    done = complete(proto, BATCHED)
    assert done.max_batch_size == 16
    assert not done.HasField("dynamic_batching")
    assert complete(pb.ModelConfig(), BATCHED, default=1).max_batch_size == 1
    assert not complete(pb.ModelConfig(), BATCHED, default=1).HasField("dynamic_batching")


def test_a_graph_without_a_batch_dim_keeps_max_batch_size_0():
    fixed = graph([("A", 1, (4,))], [("B", 7, (2, -1))])
    done = as_json(complete(pb.ModelConfig(), fixed))
    assert done.get("max_batch_size", 0) == 0
    assert "dynamic_batching" not in done
    assert done["input"] == [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}]
    assert done["output"] == [{"name": "B", "data_type": "TYPE_INT64", "dims": [2, -1]}]
    scalar = as_json(complete(pb.ModelConfig(), graph([("A", 9, ())], [("B", 9, ())])))
    assert scalar["input"] == [{"name": "A", "data_type": "TYPE_BOOL", "dims": [1]}]
    with pytest.raises(model_config.ConfigError, match="does not support batching"):
        complete(pb.ModelConfig(max_batch_size=8), fixed)


def test_only_the_missing_side_is_filled_and_a_full_config_is_untouched():
    proto = pb.ModelConfig(max_batch_size=2)
    proto.input.add(name="X", data_type=pb.TYPE_FP32, dims=[3])
    done = complete(proto, BATCHED)
    assert [t.name for t in done.input] == ["X"]
    assert [t.name for t in done.output] == ["Y"]
    assert done.HasField("dynamic_batching")
    full = pb.ModelConfig()
    full.CopyFrom(done)
    full.ClearField("dynamic_batching")
    assert complete(full, graph([], [])) == full


def test_tensors_that_cannot_be_configured_are_clear_errors():
    with pytest.raises(model_config.ConfigError, match="'Z' has ONNX element type 14"):
        complete(pb.ModelConfig(), graph([("Z", 14, (2,))], []))
    with pytest.raises(model_config.ConfigError, match="gives no shape for 'U'"):
        complete(pb.ModelConfig(), graph([("U", 1, None)], []))


def test_the_graph_is_read_without_its_initializers(tmp_path):
    weights = helper.make_tensor("W", F, [3, 2], WEIGHTS.reshape(-1).tolist())
    path = save(
        tmp_path / "1" / "model.onnx",
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        [vi("X", F, ["batch", 3]), vi("W", F, [3, 2])],
        [vi("Y", F, ["batch", 2])],
        [weights],
    )
    read = ac.read_graph(path)
    assert read == graph([("X", 1, (-1, 3))], [("Y", 1, (-1, 2))])
    done = asyncio.run(ac.auto_complete(path, pb.ModelConfig(), model="m", default_max_batch=4))
    assert done.max_batch_size == 4 and [t.name for t in done.input] == ["X"]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(model_config.ConfigError, match="cannot read the ONNX graph"):
        ac.read_graph(bad)


def test_which_models_are_onnx_models(tmp_path):
    add_sub(tmp_path / "m" / "3" / "model.onnx")
    model_dir = tmp_path / "m"
    assert ac.is_onnx_model(model_dir, pb.ModelConfig())  # no config: found from the file
    assert ac.is_onnx_model(model_dir, pb.ModelConfig(platform="onnxruntime_onnx"))
    assert not ac.is_onnx_model(model_dir, pb.ModelConfig(backend="python"))
    assert ac.model_file(model_dir, pb.ModelConfig(), [1, 3]) == model_dir / "3" / "model.onnx"
    assert ac.model_file(model_dir, pb.ModelConfig(), [1]) is None  # no 1/model.onnx
    assert ac.default_max_batch_size([]) == 4
    assert ac.default_max_batch_size([("onnxruntime", "default-max-batch-size", "16")]) == 16
    assert ac.default_max_batch_size([("python", "default-max-batch-size", "16")]) == 4
    with pytest.raises(model_config.ConfigError, match="must be an integer"):
        ac.default_max_batch_size([("onnxruntime", "default-max-batch-size", "x")])
