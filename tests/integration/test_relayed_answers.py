"""The core relays the stub's response record to a frontend worker: clients get the same bytes.

One repository served twice: by the in-process frontend (``--frontend-workers 1``, whose
responses the core makes as before) and through two frontend workers (whose answers the core
relays from the stub's records). The same requests go to both, and the answers are compared
whole: HTTP bodies and headers (binary and JSON), gRPC responses, ``/generate``, errors, around
the inline (4 KiB) and in-place (32 KiB) sizes, BYTES, requested outputs and a classification
(which the core still makes itself).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from shoal.frontends.workers.arenas import INLINE_MAX
from shoal.ipc.tensor import INLINE_TENSOR_MAX
from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

# Y is X, Z is X doubled, T the BYTES input reversed; a negative first value is the model's
# error, named with the value.
ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x.size and x[0] < 0:
                error = pb_utils.TritonError(f"a negative input: {x[0]}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [pb_utils.Tensor("Y", x), pb_utils.Tensor("Z", x * 2)]
            s = pb_utils.get_input_tensor_by_name(request, "S")
            if s is not None:
                outputs.append(pb_utils.Tensor("T", s.as_numpy()[::-1].copy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [
  { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "S" data_type: TYPE_STRING dims: [ -1 ] optional: true }
]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "T" data_type: TYPE_STRING dims: [ -1 ] }
]
"""

#: FP32 values: inline, around the inline limit, around the in-place limit (Z doubles them).
SIZES = [
    4,
    INLINE_TENSOR_MAX // 4 - 1,
    INLINE_TENSOR_MAX // 4,
    INLINE_TENSOR_MAX // 4 + 1,
    INLINE_MAX // 4,
    INLINE_MAX // 4 + 1,
    INLINE_MAX // 2,
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[ShoalServer, ShoalServer]]:
    root: Path = tmp_path_factory.mktemp("relay")
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(ECHO)
    (root / "echo" / "config.pbtxt").write_text(CONFIG)
    with (
        ShoalServer(root, extra_args=("--frontend-workers", "1")) as made,
        ShoalServer(root, extra_args=("--frontend-workers", "2")) as relayed,
    ):
        yield made, relayed
        assert "Traceback" not in made.output + relayed.output


def _inputs(module, size: int, words: list[bytes] | None = None, first: float = 0.5) -> list:
    x = np.arange(size, dtype=np.float32) * 0.25 + first
    tensor = module.InferInput("X", [size], "FP32")
    tensor.set_data_from_numpy(x, **({"binary_data": True} if module is httpclient else {}))
    inputs = [tensor]
    if words is not None:
        s = module.InferInput("S", [len(words)], "BYTES")
        s.set_data_from_numpy(np.array(words, dtype=np.object_))
        inputs.append(s)
    return inputs


def _http(server: ShoalServer, body: bytes, headers: dict[str, str], path: str) -> tuple:
    request = urllib.request.Request(f"http://{server.url}{path}", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, got, data = answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        status, got, data = error.code, error.headers, error.read()
    kept = ("Content-Type", "Inference-Header-Content-Length", "Content-Length")
    return status, {name: got.get(name) for name in kept}, data


def _http_infer(servers, inputs: list, outputs: list | None = None, request_id: str = "") -> bytes:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id=request_id
    )
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    made, relayed = (_http(s, body, headers, "/v2/models/echo/infer") for s in servers)
    assert made == relayed
    return made[2]


def _grpc_infer(servers, inputs: list, outputs: list | None = None) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="echo", id="call-7")
    for tensor in inputs:
        request.inputs.append(tensor._get_tensor())
        request.raw_input_contents.append(tensor._get_content())
    for output in outputs or []:
        request.outputs.append(output._get_tensor())
    answers = []
    for server in servers:
        with grpc.insecure_channel(server.grpc_url) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            try:
                answers.append(call(request.SerializeToString(), timeout=30))
            except grpc.RpcError as error:
                answers.append((error.code(), error.details()))
    made, relayed = answers
    if isinstance(made, bytes) and isinstance(relayed, bytes):
        # Compared parsed (a map's order on the wire is the encoder's), then the tensors' bytes.
        made_response = service_pb2.ModelInferResponse.FromString(made)
        relayed_response = service_pb2.ModelInferResponse.FromString(relayed)
        assert made_response == relayed_response
        assert list(made_response.raw_output_contents) == list(relayed_response.raw_output_contents)
    else:
        assert made == relayed
    return made if isinstance(made, bytes) else b""


@pytest.mark.parametrize("size", SIZES)
def test_http_binary_answers_are_the_same_bytes(servers, size):
    data = _http_infer(servers, _inputs(httpclient, size), request_id=f"id-{size}")
    assert len(data) > 8 * size  # both outputs came, in binary


@pytest.mark.parametrize("size", [4, INLINE_TENSOR_MAX // 4 + 1, INLINE_MAX // 4 + 1])
def test_http_json_answers_are_the_same_bytes(servers, size):
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("Y", "Z")]
    data = _http_infer(servers, _inputs(httpclient, size), outputs)
    assert json.loads(data)["outputs"][1]["data"][0] == 1.0


@pytest.mark.parametrize("size", SIZES)
def test_grpc_answers_are_the_same(servers, size):
    assert len(_grpc_infer(servers, _inputs(grpcclient, size))) > 8 * size


@pytest.mark.parametrize("length", [3, INLINE_TENSOR_MAX, INLINE_MAX])
def test_bytes_outputs_are_the_same(servers, length):
    words = [b"a" * length, b"", b"\x00\xff"]
    _http_infer(servers, _inputs(httpclient, 2, words))
    _grpc_infer(servers, _inputs(grpcclient, 2, words))


def test_requested_outputs_and_a_classification_are_the_same(servers):
    outputs = [httpclient.InferRequestedOutput("Z", binary_data=True)]
    _http_infer(servers, _inputs(httpclient, 64), outputs)
    outputs = [httpclient.InferRequestedOutput("Y", binary_data=False, class_count=3)]
    assert b":" in _http_infer(servers, _inputs(httpclient, 64), outputs)
    _grpc_infer(servers, _inputs(grpcclient, 64), [grpcclient.InferRequestedOutput("Z")])
    _grpc_infer(
        servers, _inputs(grpcclient, 64), [grpcclient.InferRequestedOutput("Y", class_count=2)]
    )


def test_model_errors_are_the_same(servers):
    body = _http_infer(servers, _inputs(httpclient, 4, first=-2.0))
    assert b"a negative input: -2.0" in body
    _grpc_infer(servers, _inputs(grpcclient, 4, first=-2.0))


def test_generate_answers_are_the_same(servers):
    body = json.dumps({"X": [1.0, 2.5], "S": ["b", "c"]}).encode()
    headers = {"Content-Type": "application/json"}
    made, relayed = (_http(s, body, headers, "/v2/models/echo/generate") for s in servers)
    assert made == relayed and made[0] == 200
    assert json.loads(made[2])["T"] == ["c", "b"]
