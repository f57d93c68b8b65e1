"""Small tensors inside the Execute and Result, end to end: every size around the limit, BYTES,
a response whose outputs pass the inline budget, and an ensemble step whose budget is smaller
than the ensemble's (its inline inputs go to blocks), over HTTP and gRPC.

``SHOAL_TEST_FRONTEND_WORKERS=2`` runs the same through two frontend workers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shoal.ipc.tensor import INLINE_REQUEST_MAX, INLINE_TENSOR_MAX
from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(120)

# Y is X, Z is X doubled (a new array), S is the BYTES input reversed: one of each kind.
ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S")
            outputs = [pb_utils.Tensor("Y", x), pb_utils.Tensor("Z", x * 2)]
            if s is not None:
                words = s.as_numpy()
                outputs.append(pb_utils.Tensor("T", words[::-1].copy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

ECHO_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [
  {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "S" data_type: TYPE_STRING dims: [ -1 ] optional: true }}
]
output [
  {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "Z" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "T" data_type: TYPE_STRING dims: [ -1 ] }}
]
"""

# Five outputs of the largest inline size: four fill the response's budget, the fifth does not.
WIDE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            outputs = [pb_utils.Tensor(f"O{i}", x + i) for i in range(5)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

WIDE_CONFIG = (
    """name: "wide"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
"""
    + ",\n".join(f'  {{ name: "O{i}" data_type: TYPE_FP32 dims: [ -1 ] }}' for i in range(5))
    + """
]
"""
)

# The ensemble carries 4 KiB inline (its budget is 16 KiB); its step "batched" batches up to
# 1024 requests, so it may carry 256 bytes a request: the step's input goes to a block.
ENSEMBLE = """name: "through"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "echo" model_version: -1
      input_map { key: "X" value: "X" } output_map { key: "Z" value: "twice" } },
    { model_name: "batched" model_version: -1
      input_map { key: "X" value: "twice" } output_map { key: "Z" value: "Z" } }
  ]
}
"""

# Calls TARGET (a parameter) with its input X by BLS and answers with the called model's Z and
# its own input, passed on to the call unchanged (an inline input becomes a call's input).
CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            target = request.parameters()
            name = "echo"
            if '"to_batched": true' in target:  # a batch of one: [1, n]
                name, x = "batched", pb_utils.Tensor("X", x.as_numpy().reshape(1, -1))
            call = pb_utils.InferenceRequest(
                model_name=name, inputs=[x], requested_output_names=["Z", "Y"]
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            z = pb_utils.get_output_tensor_by_name(answer, "Z")
            y = pb_utils.get_output_tensor_by_name(answer, "Y")
            z, y = z.as_numpy().reshape(-1), y.as_numpy().reshape(-1)
            outputs = [pb_utils.Tensor("Z", z), pb_utils.Tensor("Y", y)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

CALLER_CONFIG = """name: "caller"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] }
]
"""

#: Around the limit (in FP32 values): inline, exactly the limit, one past it, 64 KiB.
SIZES = [16, INLINE_TENSOR_MAX // 4, INLINE_TENSOR_MAX // 4 + 1, 1 << 14]


def _model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("inline")
    _model(root, "echo", ECHO, ECHO_CONFIG.format(name="echo", max_batch_size=0))
    _model(root, "batched", ECHO, ECHO_CONFIG.format(name="batched", max_batch_size=1024))
    _model(root, "wide", WIDE, WIDE_CONFIG)
    _model(root, "caller", CALLER, CALLER_CONFIG)
    (root / "through" / "1").mkdir(parents=True)
    (root / "through" / "config.pbtxt").write_text(ENSEMBLE)
    with ShoalServer(root) as running:
        yield running


def _client(server, module):  # type: ignore[no-untyped-def]
    url = server.url if module is httpclient else server.grpc_url
    return module.InferenceServerClient(url)


def _input(module, name, array, datatype="FP32"):  # type: ignore[no-untyped-def]
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


PROTOCOLS = pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])


@PROTOCOLS
@pytest.mark.parametrize("size", SIZES)
def test_identity_and_a_new_output_of_every_size(server, module, size):
    client = _client(server, module)
    try:
        for round_ in range(3):  # blocks and inline bytes reused: each answer its own values
            x = np.arange(size, dtype=np.float32) + round_
            result = client.infer("echo", [_input(module, "X", x)], outputs=None)
            np.testing.assert_array_equal(result.as_numpy("Y"), x)
            np.testing.assert_array_equal(result.as_numpy("Z"), x * 2)
    finally:
        client.close()


@PROTOCOLS
@pytest.mark.parametrize("length", [3, INLINE_TENSOR_MAX])
def test_bytes_in_and_out(server, module, length):
    words = np.array([b"a" * length, b"", b"\x00\xff"], dtype=np.object_)
    client = _client(server, module)
    try:
        x = np.ones(2, np.float32)
        inputs = [_input(module, "X", x), _input(module, "S", words, "BYTES")]
        result = client.infer("echo", inputs)
        assert result.as_numpy("T").tolist() == words[::-1].tolist()
    finally:
        client.close()


@PROTOCOLS
def test_outputs_past_the_budget_of_a_response_take_blocks(server, module):
    assert 4 * INLINE_TENSOR_MAX == INLINE_REQUEST_MAX  # the fifth output passes the budget
    x = np.linspace(0, 1, INLINE_TENSOR_MAX // 4, dtype=np.float32)
    client = _client(server, module)
    try:
        result = client.infer("wide", [_input(module, "X", x)])
        for i in range(5):
            np.testing.assert_array_equal(result.as_numpy(f"O{i}"), x + i)
    finally:
        client.close()


@PROTOCOLS
@pytest.mark.parametrize("size", [16, INLINE_TENSOR_MAX // 4])
def test_an_ensemble_step_with_a_smaller_budget_gets_its_inputs_in_blocks(server, module, size):
    client = _client(server, module)
    try:
        for round_ in range(3):
            x = np.arange(size, dtype=np.float32) - round_
            result = client.infer("through", [_input(module, "X", x)])
            np.testing.assert_array_equal(result.as_numpy("Z"), x * 4)
    finally:
        client.close()


@PROTOCOLS
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("to_batched", [False, True], ids=["echo", "batched"])
def test_bls_inputs_and_outputs_of_every_size(server, module, size, to_batched):
    """``batched`` may take 256 inline bytes a request: a larger inline input of the call goes
    to a block in the supervisor, a smaller one stays inline; either way the same answer."""
    client = _client(server, module)
    try:
        for round_ in range(2):
            x = np.arange(size, dtype=np.float32) * 0.5 + round_
            params = {"to_batched": True} if to_batched else {}
            result = client.infer("caller", [_input(module, "X", x)], parameters=params)
            np.testing.assert_array_equal(result.as_numpy("Y"), x)
            np.testing.assert_array_equal(result.as_numpy("Z"), x * 2)
    finally:
        client.close()
