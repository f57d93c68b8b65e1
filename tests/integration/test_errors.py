"""Bad input and failing models: clear errors, and the server stays healthy."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(120)


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _fp32(name, values, shape=None):
    arr = np.asarray(values, dtype=np.float32)
    inp = httpclient.InferInput(name, list(shape or arr.shape), "FP32")
    inp.set_data_from_numpy(arr)
    return inp


def _expect_error(fn, *fragments):
    with pytest.raises(InferenceServerException) as info:
        fn()
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, text
    return info.value


def test_unknown_model_and_version(client):
    _expect_error(
        lambda: client.infer("nope", [_fp32("X", [1])]),
        "Request for unknown model: 'nope' is not found",
    )
    a = _fp32("INPUT0", np.ones(4))
    b = _fp32("INPUT1", np.ones(4))
    _expect_error(
        lambda: client.infer("add_sub", [a, b], model_version="3"),
        "'add_sub' version 3 is not found",
    )


def test_missing_and_extra_inputs(client):
    a = _fp32("INPUT0", np.ones(4))
    _expect_error(
        lambda: client.infer("add_sub", [a]),
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. "
        "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all "
        "required input(s).",
    )
    extra = _fp32("BOGUS", np.ones(4))
    b = _fp32("INPUT1", np.ones(4))
    # Triton's count message first, then (unlike Triton's empty list) which input is extra.
    _expect_error(
        lambda: client.infer("add_sub", [a, b, extra]),
        "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. "
        "Got input(s) ['INPUT0','INPUT1','BOGUS'], but the model has no input(s) ['BOGUS'].",
    )
    # As many inputs as the model has, one of them unknown: no request-id prefix, as Triton.
    _expect_error(
        lambda: client.infer("add_sub", [a, extra]),
        "unexpected inference input 'BOGUS' for model 'add_sub'",
    )


def test_wrong_datatype_and_shape(client):
    a = httpclient.InferInput("INPUT0", [4], "INT32")
    a.set_data_from_numpy(np.ones(4, dtype=np.int32))
    b = _fp32("INPUT1", np.ones(4))
    _expect_error(
        lambda: client.infer("add_sub", [a, b]),
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    )
    a = _fp32("INPUT0", np.ones(5))
    b = _fp32("INPUT1", np.ones(5))
    _expect_error(
        lambda: client.infer("add_sub", [a, b]),
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]",
    )


def test_unknown_output(client):
    a, b = _fp32("INPUT0", np.ones(4)), _fp32("INPUT1", np.ones(4))
    _expect_error(
        lambda: client.infer("add_sub", [a, b], outputs=[httpclient.InferRequestedOutput("NOPE")]),
        "unexpected inference output 'NOPE' for model 'add_sub'",
    )


@pytest.mark.parametrize("protocol", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_output_asked_for_twice_is_refused(bundled_server, protocol):
    """Triton refuses a request naming one output twice (its words), on both protocols."""
    url = bundled_server.url if protocol is httpclient else bundled_server.grpc_url
    client = protocol.InferenceServerClient(url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = protocol.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        inputs.append(tensor)
    twice = [protocol.InferRequestedOutput("OUTPUT0") for _ in range(2)]
    _expect_error(
        lambda: client.infer("add_sub", inputs, outputs=twice, request_id="r-2"),
        "[request id: r-2] output 'OUTPUT0' already exists in request",
    )
    client.close()


@pytest.mark.parametrize(
    ("first_dim", "words"),
    [
        (2**4, "shape [16,1152921504606846978] causes total element count to exceed maximum size"),
        (2**2, "byte size overflow for input 'INPUT0': element count (4611686018427387912) * data"),
    ],
)
def test_json_shapes_past_int64_are_refused_before_the_data(bundled_server, first_dim, words):
    """Elements, or bytes, an int64 cannot count: Triton's words, not a data/shape mismatch."""
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [first_dim, 2**60 + 2], "data": [1.0]}
    body = json.dumps({"inputs": [tensor]}).encode()
    status, answer = _post(f"http://{bundled_server.url}/v2/models/add_sub/infer", body)
    assert status == 400
    assert words in answer["error"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_version_that_is_not_a_number_is_invalid_argument(bundled_server, protocol):
    """Triton reads the version before it looks for the model: INVALID_ARGUMENT with its text
    (the gRPC frontend answered NOT_FOUND, "version wrong is not found")."""
    client_module = httpclient if protocol == "http" else grpcclient
    url = bundled_server.url if protocol == "http" else bundled_server.grpc_url
    client = client_module.InferenceServerClient(url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = client_module.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, np.float32))
        inputs.append(tensor)
    # 5,000 digits: past Python's int() limit, which answered 500 with a traceback.
    for model, version in [
        ("add_sub", "wrong"),
        ("no_such_model", "wrong"),
        ("add_sub", "9" * 5000),
    ]:
        error = _expect_error(
            lambda model=model, version=version: client.infer(model, inputs, model_version=version),
            # (a gRPC status message is cut at 4 KiB: the long one is checked to its version)
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0"
            if len(version) < 100
            else f"failed to get model version from specified version string '{version[:100]}",
        )
        assert error.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    client.close()


def test_input_errors_read_as_tritons(client):
    """Triton 2.51's texts, prefix and order (checked against it on the same models)."""
    a, b = _fp32("INPUT0", np.ones(5)), _fp32("INPUT1", np.ones(5))
    _expect_error(
        lambda: client.infer("add_sub", [a, b], request_id="r-7"),
        "[request id: r-7] unexpected shape for input 'INPUT0' for model 'add_sub'. "
        "Expected [4], got [5]. ",
    )
    # A batched model's shape error carries Triton's note about the batch dimension.
    text = httpclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"a", b"b"], np.object_))
    error = _expect_error(
        lambda: client.infer("string_upper", [text]),
        "[request id: <id_unknown>] unexpected shape for input 'TEXT' for model "
        "'string_upper'. Expected [-1,-1], got [2]. NOTE: Setting a non-zero max_batch_size",
    )
    assert str(error).rstrip().endswith("for more info on max_batch_size.")
    scalar = httpclient.InferInput("TEXT", [], "BYTES")
    scalar.set_data_from_numpy(np.array(b"a", np.object_))
    _expect_error(
        lambda: client.infer("string_upper", [scalar]),
        "input 'TEXT' has no shape but model requires batch dimension for 'string_upper'",
    )
    # The requested outputs are checked before the inputs.
    _expect_error(
        lambda: client.infer(
            "add_sub", [_fp32("INPUT0", np.ones(4))], outputs=[httpclient.InferRequestedOutput("X")]
        ),
        "unexpected inference output 'X' for model 'add_sub'",
    )


def test_a_one_response_call_to_a_decoupled_model_names_the_way_to_call_it(test_server):
    body = {"inputs": [{"name": "COUNT", "shape": [1], "datatype": "INT32", "data": [1]}]}
    url = f"http://{test_server.url}/v2/models/decoupled_repeat/infer"
    status, answer = _post(url, json.dumps(body).encode())
    assert status == 501
    assert answer["error"].startswith(
        "HTTP end point doesn't support models with decoupled transaction policy: model "
        "'decoupled_repeat' is decoupled"
    )
    assert "generate_stream" in answer["error"]
    client = grpcclient.InferenceServerClient(test_server.grpc_url)
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("decoupled_repeat", [count])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert str(info.value.message()).startswith(
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )


def test_statistics_of_a_missing_version_is_invalid_argument(client):
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("add_sub", "7")
    assert info.value.status() == "400"
    assert "requested model version is not available for model 'add_sub'" in str(info.value)


def test_load_and_unload_without_explicit_mode_are_unavailable(bundled_server):
    status, body = _post(f"http://{bundled_server.url}/v2/repository/models/add_sub/load", b"{}")
    assert status == 503
    # Triton's words in every mode but explicit: clients (Triton's own QA) match them.
    assert body["error"].startswith(
        "explicit model load / unload is not allowed if polling is enabled"
    )
    assert "--model-control-mode=explicit" in body["error"]
    # and on gRPC.
    client = grpcclient.InferenceServerClient(bundled_server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.unload_model("add_sub")
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "explicit model load / unload is not allowed if polling is enabled" in str(info.value)
    client.close()


def test_byte_size_mismatch(bundled_server):
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [4],
                    "parameters": {"binary_data_size": 12},
                },
                {
                    "name": "INPUT1",
                    "datatype": "FP32",
                    "shape": [4],
                    "parameters": {"binary_data_size": 16},
                },
            ]
        }
    ).encode()
    body = header + b"\0" * 28
    status, answer = _post(
        f"http://{bundled_server.url}/v2/models/add_sub/infer",
        body,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400
    assert "INPUT0" in answer["error"]


def test_bad_json_and_header_beyond_body(bundled_server):
    url = f"http://{bundled_server.url}/v2/models/add_sub/infer"
    status, answer = _post(url, b"{not json")
    assert status == 400 and answer["error"]
    status, answer = _post(url, b'{"inputs": []}', {"Inference-Header-Content-Length": "999"})
    assert status == 400 and answer["error"]


def test_broken_bytes_length_prefix(bundled_server):
    payload = struct.pack("<I", 50) + b"short"
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(payload)},
                }
            ]
        }
    ).encode()
    status, answer = _post(
        f"http://{bundled_server.url}/v2/models/string_upper/infer",
        header + payload,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400
    assert "TEXT" in answer["error"]


def test_model_that_raises(test_client):
    err = _expect_error(
        lambda: test_client.infer("raiser", [_fp32("IN", [1.0])]),
        "Failed to process the request(s) for model 'raiser_0'",
        "intentional failure in execute",
    )
    assert err.status() in ("500", 500, None) or True  # the text is what clients match on
    assert test_client.is_model_ready("raiser")


def test_model_that_returns_triton_error(test_server):
    body = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    ).encode()
    status, answer = _post(f"http://{test_server.url}/v2/models/error_response/infer", body)
    assert status == 400  # INVALID_ARG from the model's TritonError
    assert answer["error"] == "rejected by the model"


def test_failed_models_are_unavailable_with_reason(test_client, test_server):
    assert not test_client.is_model_ready("init_fail")
    _expect_error(lambda: test_client.infer("init_fail", [_fp32("IN", [1.0])]), "lorem_ipsum")
    assert not test_client.is_model_ready("broken_config")
    _expect_error(lambda: test_client.infer("broken_config", [_fp32("IN", [1.0])]), "config.pbtxt")
    _expect_error(
        lambda: test_client.infer("no_model_file", [_fp32("IN", [1.0])]),
        "Python model file not found",
    )
    # The failures did not stop the other models.
    a = _fp32("INPUT0", np.ones(4))
    b = _fp32("INPUT1", np.ones(4))
    assert test_client.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [2] * 4
    assert test_client.is_server_live()
    assert not test_client.is_server_ready()  # strict readiness: some models failed


def test_server_healthy_after_errors(client):
    assert client.is_server_live() and client.is_server_ready()
