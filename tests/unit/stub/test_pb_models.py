"""Triton-style model.py files, written as a Triton user would, run against shoal's pb_utils."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import threading

import numpy as np
import pytest

from shoal.stub import pb_utils
from tests.unit.stub.helpers import Recorder, server_request

MODULE = "triton_python_backend_utils"


@pytest.fixture
def model_from_source(tmp_path, monkeypatch):
    """Install pb_utils as triton_python_backend_utils (restored after the test); load sources."""
    monkeypatch.setitem(sys.modules, MODULE, pb_utils)
    counter = iter(range(1000))

    def load(source: str):
        number = next(counter)
        path = tmp_path / str(number) / "model.py"
        path.parent.mkdir()
        path.write_text(textwrap.dedent(source))
        spec = importlib.util.spec_from_file_location(f"shoal_test_model_{number}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.TritonPythonModel

    return load


def init_args(model_config: dict) -> dict[str, str]:
    return {
        "model_config": json.dumps(model_config),
        "model_instance_kind": "CPU",
        "model_instance_name": "m_0_0",
        "model_instance_device_id": "0",
        "model_repository": "/models/m",
        "model_version": "1",
        "model_name": "m",
    }


ADD_SUB = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

ADD_SUB_CONFIG = {
    "name": "add_sub",
    "backend": "python",
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
}


def test_add_sub(model_from_source):
    model = model_from_source(ADD_SUB)()
    model.initialize(init_args(ADD_SUB_CONFIG))
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([4, 3, 2, 1], dtype=np.float32)
    requests = [server_request({"INPUT0": a, "INPUT1": b}) for _ in range(3)]
    responses = model.execute(requests)
    assert len(responses) == 3
    for response in responses:
        assert not response.has_error()
        out0 = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
        out1 = pb_utils.get_output_tensor_by_name(response, "OUTPUT1")
        np.testing.assert_array_equal(out0.as_numpy(), a + b)
        np.testing.assert_array_equal(out1.as_numpy(), a - b)
        assert out0._datatype() == "FP32"
        assert out0.triton_dtype() == 11
    model.finalize()


STRINGS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.decode("utf-8").upper().encode("utf-8") for t in text.flat],
                             dtype=np.object_).reshape(text.shape)
            lengths = np.array([len(t) for t in text.flat], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("UPPER", upper),
                pb_utils.Tensor("LENGTH", lengths),
            ]))
        return responses
"""


def test_bytes_model(model_from_source):
    model = model_from_source(STRINGS)()
    text = np.array([[b"hello", b"w\xc3\xb6rld"]], dtype=np.object_)
    (response,) = model.execute([server_request({"TEXT": text})])
    upper = pb_utils.get_output_tensor_by_name(response, "UPPER")
    assert upper._datatype() == "BYTES"
    assert upper.shape() == [1, 2]
    assert upper._array().tolist() == [[b"HELLO", "WÖRLD".encode()]]
    encoded = pb_utils.serialize_byte_tensor(upper.as_numpy())
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"HELLO", "WÖRLD".encode()]
    length = pb_utils.get_output_tensor_by_name(response, "LENGTH")
    assert length.as_numpy().tolist() == [5, 6]


ERRORS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "IN") is None:
                error = pb_utils.TritonError("IN is required", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
        return responses
"""


def test_error_responses(model_from_source):
    model = model_from_source(ERRORS)()
    good = server_request({"IN": np.ones(2, np.int64)})
    bad = server_request({})
    ok, failed = model.execute([good, bad])
    assert not ok.has_error()
    assert failed.has_error()
    assert failed.error().message() == "IN is required"
    assert failed.error().code() == pb_utils.TritonError.INVALID_ARG
    assert failed._error_code_name() == "INVALID_ARG"
    # Passing an input straight through keeps the zero-copy array.
    out = pb_utils.get_output_tensor_by_name(ok, "OUT")
    assert out._array() is pb_utils.get_input_tensor_by_name(good, "IN").as_numpy()


REPEAT = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.respond, args=(values, sender))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, values, sender):
        for value in values:
            out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""


def test_decoupled_repeat_sends_from_a_thread(model_from_source):
    model = model_from_source(REPEAT)()
    model.initialize(init_args({"model_transaction_policy": {"decoupled": True}}))
    assert model.decoupled is True
    recorders = [Recorder(), Recorder()]
    requests = [
        server_request({"IN": np.array([1, 2, 3], np.int32)}, deliver=recorders[0], decoupled=True),
        server_request({"IN": np.array([], np.int32)}, deliver=recorders[1], decoupled=True),
    ]
    assert model.execute(requests) is None
    model.finalize()
    first = recorders[0].sent
    assert [flags for _, flags in first] == [0, 0, 0, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
    values = [r.output_tensors()[0].as_numpy()[0] for r, _ in first[:3]]
    assert values == [1, 2, 3]
    assert first[3][0] is None
    assert recorders[1].sent == [(None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]


MISUSE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender.send(pb_utils.InferenceResponse([]), flags=final)
        try:
            sender.send(pb_utils.InferenceResponse([]))
        except pb_utils.TritonModelException as error:
            self.error = str(error)
        return [None]
"""


def test_sender_misuse_surfaces_as_triton_model_exception(model_from_source):
    model = model_from_source(MISUSE)()
    recorder = Recorder()
    assert model.execute([server_request(deliver=recorder, decoupled=True)]) == [None]
    assert model.error == "Unable to send response. Response sender has been closed."
    assert len(recorder.sent) == 1


AUTO_COMPLETE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4], "optional": True}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config.get("input", [])]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=False))
        return auto_complete_model_config

    def execute(self, requests):
        return [None for _ in requests]
"""


def test_auto_complete_config(model_from_source):
    model_class = model_from_source(AUTO_COMPLETE)
    given = pb_utils.ModelConfig(json.dumps({"name": "auto", "backend": "python"}))
    completed = model_class.auto_complete_config(given)
    assert isinstance(completed, pb_utils.ModelConfig)
    config = completed.as_dict()
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][1]["optional"] is True
    assert config["output"][0]["dims"] == [4]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"] == {}
    assert config["model_transaction_policy"] == {"decoupled": False}


def test_auto_complete_config_conflict_raises_value_error(model_from_source):
    model_class = model_from_source(AUTO_COMPLETE)
    given = pb_utils.ModelConfig(json.dumps({"name": "auto", "max_batch_size": 16}))
    with pytest.raises(ValueError, match="max_batch_size"):
        model_class.auto_complete_config(given)


IN_PLACE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            try:
                data *= 2
            except ValueError:
                data = data.copy()
                data *= 2
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
        return responses
"""


def test_inputs_are_read_only_so_models_copy(model_from_source):
    model = model_from_source(IN_PLACE)()
    source = np.array([1.0, 2.0], dtype=np.float32)
    request = server_request({"IN": source})
    (response,) = model.execute([request])
    np.testing.assert_array_equal(response.output_tensors()[0].as_numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(source, [1.0, 2.0])


PARAMS_LOG_BLS = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("initialize " + args["model_name"])
        self.model_dir = pb_utils.get_model_dir()
        try:
            pb_utils.InferenceRequest(
                model_name="other", inputs=[], requested_output_names=["OUT"]
            ).exec()
        except pb_utils.TritonModelException as error:
            self.bls_error = str(error)

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            logger = pb_utils.Logger
            logger.log("params", logger.VERBOSE)
            wanted = request.requested_output_names()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[],
                parameters={"echo": params["tag"], "count": len(wanted), "ok": True},
            ))
        return responses
"""


def test_parameters_logging_model_dir_and_bls_outside_execute(model_from_source):
    records = []
    pb_utils._set_log_sink(lambda *record: records.append(record))
    pb_utils._set_model_dir("/models/m/1")
    model = model_from_source(PARAMS_LOG_BLS)()
    model.initialize(init_args({}))
    assert model.model_dir == "/models/m/1"
    assert model.bls_error == "BLS is only supported during the 'execute' function."
    request = server_request(parameters={"tag": "x", "temperature": 0.5}, requested=["A", "B"])
    (response,) = model.execute([request])
    assert json.loads(response.parameters()) == {"echo": "x", "count": 2, "ok": True}
    assert [(level, message) for level, message, _, _ in records] == [
        (pb_utils.Logger.INFO, "initialize m"),
        (pb_utils.Logger.VERBOSE, "params"),
    ]
    assert records[0][2].endswith("model.py")


DLPACK = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            view = pb_utils.Tensor.from_dlpack("VIEW", tensor.to_dlpack())
            doubled = np.from_dlpack(tensor) * 2
            out = pb_utils.Tensor.from_dlpack("OUT", doubled)
            responses.append(pb_utils.InferenceResponse([view, out]))
        return responses
"""


def test_dlpack_model(model_from_source):
    model = model_from_source(DLPACK)()
    source = np.arange(4, dtype=np.float64)
    request = server_request({"IN": source})
    (response,) = model.execute([request])
    view, out = response.output_tensors()
    assert np.shares_memory(view.as_numpy(), source)
    np.testing.assert_array_equal(out.as_numpy(), source * 2)
    assert out._datatype() == "FP64"


def test_sender_used_after_execute_from_another_thread(model_from_source):
    model = model_from_source(REPEAT)()
    model.initialize(init_args({}))
    recorder = Recorder()
    done = threading.Event()

    def deliver(response, flags):
        recorder(response, flags)
        if flags:
            done.set()

    model.execute(
        [server_request({"IN": np.array([7], np.int32)}, deliver=deliver, decoupled=True)]
    )
    assert done.wait(5)
    model.finalize()
    assert len(recorder.sent) == 2
