"""One behaviour suite over both protocols: the same calls through tritonclient.http and .grpc."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
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


@pytest.fixture(scope="module")
def server():
    args = ("--model-control-mode", "explicit", "--load-model", "*")
    with ShoalServer(BUNDLED, extra_args=args) as srv:
        yield srv


@pytest.fixture(params=["http", "grpc"])
def api(request, server):
    if request.param == "http":
        client = httpclient.InferenceServerClient(server.url)
        yield httpclient, client
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        yield grpcclient, client
    client.close()


def _meta(result):
    """Metadata as a dict from either client (gRPC returns protobuf messages)."""
    if isinstance(result, dict):
        return result
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(result, preserving_proto_field_name=True)


def test_health_and_metadata(api):
    _, client = api
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and not client.is_model_ready("nope")
    server = _meta(client.get_server_metadata())
    assert server["name"] == "triton" and "binary_tensor_data" in server["extensions"]
    model = _meta(client.get_model_metadata("add_sub"))
    assert model["platform"] == "python" and model["versions"] == ["1"]
    assert [i["name"] for i in model["inputs"]] == ["INPUT0", "INPUT1"]


def test_config(api):
    _module, client = api
    config = _meta(client.get_model_config("string_upper"))
    config = config.get("config", config)
    assert config["name"] == "string_upper"
    assert int(config["max_batch_size"]) == 8
    assert config["input"][0]["data_type"] == "TYPE_STRING"


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_identity_every_datatype(api, datatype):
    module, client = api
    dtype = DATATYPES[datatype]
    data = (np.arange(11) % 2 == 0) if dtype is np.bool_ else np.arange(11).astype(dtype)
    inp = module.InferInput(f"IN_{datatype}", [11], datatype)
    inp.set_data_from_numpy(data)
    result = client.infer(
        "identity", [inp], outputs=[module.InferRequestedOutput(f"OUT_{datatype}")]
    )
    np.testing.assert_array_equal(result.as_numpy(f"OUT_{datatype}"), data)


def test_bytes(api):
    module, client = api
    text = np.array([[b"ab", "ü".encode()]], dtype=np.object_)
    inp = module.InferInput("TEXT", [1, 2], "BYTES")
    inp.set_data_from_numpy(text)
    result = client.infer("string_upper", [inp])
    assert [bytes(x) for x in result.as_numpy("UPPER").reshape(-1)] == [b"AB", "Ü".encode()]


def test_errors_carry_tritons_messages(api):
    module, client = api
    a = module.InferInput("INPUT0", [4], "FP32")
    a.set_data_from_numpy(np.ones(4, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="missing required input"):
        client.infer("add_sub", [a])
    with pytest.raises(InferenceServerException, match="unknown model: 'nope'"):
        client.infer("nope", [a])
    assert client.is_server_live()


def test_statistics_add_up(api):
    module, client = api
    before = _meta(client.get_inference_statistics("add_sub"))["model_stats"][0]
    a = module.InferInput("INPUT0", [4], "FP32")
    b = module.InferInput("INPUT1", [4], "FP32")
    for inp in (a, b):
        inp.set_data_from_numpy(np.ones(4, dtype=np.float32))
    for _ in range(3):
        client.infer("add_sub", [a, b])
    after = _meta(client.get_inference_statistics("add_sub"))["model_stats"][0]
    count = lambda s, k: int(s.get(k, 0))  # noqa: E731 - gRPC omits zeros
    assert count(after, "inference_count") - count(before, "inference_count") == 3
    assert count(after, "execution_count") - count(before, "execution_count") == 3
    success = lambda s: int(s["inference_stats"]["success"].get("count", 0))  # noqa: E731
    assert success(after) - success(before) == 3


def test_repository_unload_and_load(api):
    _module, client = api
    client.unload_model("identity")
    assert not client.is_model_ready("identity")
    index = client.get_model_repository_index()
    entries = index if isinstance(index, list) else _meta(index)["models"]
    states = {m["name"]: m.get("state", "") for m in entries}
    assert states["identity"] == "UNAVAILABLE"
    client.load_model("identity")
    assert client.is_model_ready("identity")
