"""Both gRPC servers through ``tritonclient.grpc``: the native one (the default) and grpc.aio's
(``shoal serve --grpc-server grpcio``, the fallback), which must keep working alike: unary and
streaming inference, errors, deadlines."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.h2client import H2Client, grpc_frame, identity_request, output_array
from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(90)

MODELS = ("identity", "decoupled_repeat", "slow")


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(request):
    args = ["--model-control-mode", "explicit", "--grpc-server", request.param]
    for model in MODELS:
        args += ["--load-model", model]
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args)) as srv:
        srv.kind = request.param
        yield srv


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def test_the_selected_server_answers(server):
    """The flag picks the server: grpc-core's HTTP/2 settings and headers are not shoal's."""
    with H2Client(server.grpc_port) as h2:
        data = np.arange(8, dtype=np.int32)
        response = h2.call(grpc_frame(identity_request(data)))
        assert response.status == "0"
        (message,) = response.messages()
        np.testing.assert_array_equal(output_array(message, np.int32), data)
        native = h2.conn.remote_settings.max_frame_size == 1 << 20
        assert native == (server.kind == "native"), h2.conn.remote_settings
        assert ("grpc-accept-encoding" not in response.headers) == native, response.headers


def test_infer(client):
    data = np.arange(16, dtype=np.float32) / 3
    text = np.array([b"shoal", "grüße".encode()], dtype=np.object_)
    inputs = [grpcclient.InferInput("IN_FP32", [16], "FP32")]
    inputs.append(grpcclient.InferInput("IN_STRING", [2], "BYTES"))
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(text)
    result = client.infer("identity", inputs, request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), data)
    assert [bytes(x) for x in result.as_numpy("OUT_STRING")] == list(text)
    assert result.get_response().id == "r-1"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_infer_compressed(client, algorithm):
    data = np.arange(4096, dtype=np.int32) % 7  # compressible
    inp = grpcclient.InferInput("IN_INT32", [4096], "INT32")
    inp.set_data_from_numpy(data)
    result = client.infer("identity", [inp], compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUT_INT32"), data)


def test_stream_infer_decoupled(client):
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([4], dtype=np.int32))
        client.async_stream_infer("decoupled_repeat", [count], request_id="s1")
        got = []
        for _ in range(4):
            result, error = responses.get(timeout=30)
            assert error is None, error
            got.append(int(result.as_numpy("INDEX")[0]))
        assert got == [0, 1, 2, 3]
        # A failed request is reported on the stream, which goes on.
        client.async_stream_infer("nope", [count], request_id="s2")
        result, error = responses.get(timeout=30)
        assert result is None and "unknown model: 'nope'" in str(error)
        count.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.async_stream_infer("decoupled_repeat", [count], request_id="s3")
        result, error = responses.get(timeout=30)
        assert error is None and int(result.as_numpy("INDEX")[0]) == 0
    finally:
        client.stop_stream()


def test_errors(client):
    data = grpcclient.InferInput("IN_INT32", [2], "INT32")
    data.set_data_from_numpy(np.arange(2, dtype=np.int32))
    with pytest.raises(InferenceServerException, match="unknown model: 'nope'") as info:
        client.infer("nope", [data])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    seconds = grpcclient.InferInput("SECONDS", [2], "FP32")
    seconds.set_data_from_numpy(np.ones(2, np.float32))
    with pytest.raises(InferenceServerException, match="unexpected shape") as info:
        client.infer("slow", [seconds])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_live()


@pytest.mark.timeout(30)
def test_deadline(client):
    seconds = grpcclient.InferInput("SECONDS", [1], "FP32")
    seconds.set_data_from_numpy(np.array([2.0], np.float32))
    with pytest.raises(InferenceServerException, match="Deadline") as info:
        client.infer("slow", [seconds], client_timeout=0.3)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    seconds.set_data_from_numpy(np.array([0.0], np.float32))
    result = client.infer("slow", [seconds], client_timeout=20)
    assert result.as_numpy("SECONDS_OUT").tolist() == [0.0]


@pytest.mark.parametrize("method", ["metadata", "infer"])
def test_an_error_quoting_a_long_name_keeps_its_status(client, method):
    """An error whose message quotes a 100,000-character model name: the client gets NOT_FOUND
    and the message's head with a note of the cut (grpcio refuses metadata past 8-16 KiB, and
    would report that instead); the server serves on."""
    name = "n" * 100_000
    with pytest.raises(InferenceServerException) as raised:
        if method == "metadata":
            client.get_model_metadata(name)
        else:
            inp = grpcclient.InferInput("IN_INT32", [2], "INT32")
            inp.set_data_from_numpy(np.arange(2, dtype=np.int32))
            client.infer(name, [inp])
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    message = raised.value.message()
    assert "nnnn" in message
    assert message.endswith("more characters cut: a gRPC status message is limited to 4 KiB)")
    assert len(message) <= 4096
    assert client.is_server_live()
