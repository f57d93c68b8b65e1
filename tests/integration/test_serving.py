"""Serving the bundled models to the real tritonclient.http client."""

from __future__ import annotations

import gzip
import json
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)

DATATYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def _add_sub_inputs(a, b, binary=True):
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("no_such_model")
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("add_sub")
    assert model["name"] == "add_sub"
    assert model["versions"] == ["1"]
    assert model["platform"] == "python"
    assert [i["name"] for i in model["inputs"]] == ["INPUT0", "INPUT1"]
    assert model["inputs"][0]["datatype"] == "FP32"
    assert [int(d) for d in model["inputs"][0]["shape"]] == [4]
    batched = client.get_model_metadata("string_upper")
    assert [int(d) for d in batched["inputs"][0]["shape"]] == [-1, -1]


def test_model_config_in_triton_json_form(client):
    config = client.get_model_config("add_sub")
    assert config["name"] == "add_sub"
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 0
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [4]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub(client, binary):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer(
        "add_sub", _add_sub_inputs(a, b, binary), outputs=outputs, request_id="req-7"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "req-7"
    assert result.get_response()["model_version"] == "1"


def test_only_requested_outputs_are_returned(client):
    a = np.ones(4, dtype=np.float32)
    result = client.infer(
        "add_sub", _add_sub_inputs(a, a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")]
    )
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, dtype=np.float32))


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@pytest.mark.parametrize("binary", [True, False])
def test_identity_every_datatype(client, datatype, binary):
    rng = np.random.default_rng(7)
    dtype = DATATYPES[datatype]
    if dtype is np.bool_:
        data = rng.integers(0, 2, 17).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        data = rng.integers(info.min, info.max, 17, dtype=dtype, endpoint=True)
    else:
        data = rng.standard_normal(17).astype(dtype)
    inp = httpclient.InferInput(f"IN_{datatype}", [17], datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput(f"OUT_{datatype}", binary_data=binary)
    result = client.infer("identity", [inp], outputs=[out])
    got = result.as_numpy(f"OUT_{datatype}")
    assert got.dtype == data.dtype
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors(client, binary):
    text = np.array([[b"hello", b"shoal", "ünïcode".encode()]], dtype=np.object_)
    inp = httpclient.InferInput("TEXT", [1, 3], "BYTES")
    inp.set_data_from_numpy(text, binary_data=binary)
    result = client.infer(
        "string_upper",
        [inp],
        outputs=[
            httpclient.InferRequestedOutput("UPPER", binary_data=binary),
            httpclient.InferRequestedOutput("LENGTH", binary_data=binary),
        ],
    )
    upper = result.as_numpy("UPPER")
    assert upper.shape == (1, 3)
    assert [x if isinstance(x, bytes) else x.encode() for x in upper.reshape(-1)] == [
        b"HELLO",
        b"SHOAL",
        "ÜNÏCODE".encode(),
    ]
    np.testing.assert_array_equal(result.as_numpy("LENGTH"), [[5, 5, len("ünïcode".encode())]])


def test_large_tensors_grow_small_arenas():
    small = (
        "--backend-config",
        "python,shm-default-byte-size=1048576",
        "--backend-config",
        "python,shm-growth-byte-size=1048576",
    )
    with ShoalServer(BUNDLED, extra_args=small) as server:
        client = httpclient.InferenceServerClient(server.url)
        for size in (1, 3 << 20, 5 << 20):  # elements: far beyond the 1 MiB first segments
            data = np.arange(size, dtype=np.float32)
            as_text = np.array([b"x" * 1000] * (size // 1000 + 1), dtype=np.object_)
            ints = httpclient.InferInput("IN_FP32", list(data.shape), "FP32")
            ints.set_data_from_numpy(data)
            text = httpclient.InferInput("TEXT", [1, len(as_text)], "BYTES")
            text.set_data_from_numpy(as_text.reshape(1, -1))
            result = client.infer("identity", [ints])
            np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
            upper = client.infer("string_upper", [text]).as_numpy("UPPER")
            assert upper.shape == (1, len(as_text)) and upper[0, -1] == b"X" * 1000
        client.close()


def test_request_over_max_input_size_is_refused(client):
    data = np.zeros(17 * 1024 * 1024, dtype=np.float32)  # 68 MiB > the 64 MiB default
    inp = httpclient.InferInput("IN_FP32", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException, match="--http-max-input-size"):
        client.infer("identity", [inp])
    assert client.is_server_ready()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client, algorithm):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    result = client.infer(
        "add_sub",
        _add_sub_inputs(a, a),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_curl_style_json_request(bundled_server):
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [[1, 1], [1, 1]]},
            ]
        }
    ).encode()
    request = urllib.request.Request(
        f"http://{bundled_server.url}/v2/models/add_sub/infer", data=body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        answer = json.loads(reply.read())
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [2, 3, 4, 5]
    assert outputs["OUTPUT0"]["datatype"] == "FP32"
    assert outputs["OUTPUT0"]["shape"] == [4]


def test_versioned_endpoints(client):
    a = np.ones(4, dtype=np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, a), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")


def test_gzip_body_is_really_compressed(bundled_server):
    payload = json.dumps(
        {"inputs": [{"name": "IN_INT32", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]}]}
    ).encode()
    request = urllib.request.Request(
        f"http://{bundled_server.url}/v2/models/identity/infer",
        data=gzip.compress(payload),
        headers={"Content-Encoding": "gzip"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        answer = json.loads(reply.read())
    assert answer["outputs"][0]["data"] == [1, 2, 3]
