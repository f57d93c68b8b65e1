"""BLS calls between stubs and decoupled (streaming) models."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer
from tests.stream_cancel import stop_stream_cancelling

pytestmark = pytest.mark.timeout(120)

MODELS = ("bls_add_sub", "decoupled_repeat", "bls_decoupled", "bls_self", "add_sub")


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for model in MODELS:
        args += ["--load-model", model]
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args)) as srv:
        yield srv


def _fp32(name, values):
    inp = httpclient.InferInput(name, [len(values)], "FP32")
    inp.set_data_from_numpy(np.asarray(values, dtype=np.float32))
    return inp


def test_bls_chain_forwards_outputs(server):
    client = httpclient.InferenceServerClient(server.url)
    a, b = [1, 2, 3, 4], [10, 20, 30, 40]
    for _ in range(30):  # repeated: blocks of BLS responses are given back and reused
        result = client.infer("bls_add_sub", [_fp32("A", a), _fp32("B", b)])
        total = np.add(a, b).astype(np.float32)
        np.testing.assert_array_equal(result.as_numpy("SUM"), total)
        np.testing.assert_array_equal(result.as_numpy("SUM_TWICE"), total * 2)
    stats = {s["name"]: s for s in client.get_inference_statistics()["model_stats"]}
    assert stats["add_sub"]["inference_stats"]["success"]["count"] >= 60
    client.close()


def test_bls_to_itself_is_an_error_not_a_deadlock(server):
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("bls_self", [_fp32("IN", [1.0])])
    message = result.as_numpy("ERROR")[0].decode()
    assert "would wait for itself" in message, message
    client.close()


def test_decoupled_stream_over_grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([5], dtype=np.int32))
    client.async_stream_infer("decoupled_repeat", [count], request_id="r1")
    got = []
    for _ in range(5):
        result, error = responses.get(timeout=30)
        assert error is None, error
        got.append(int(result.as_numpy("INDEX")[0]))
    client.stop_stream()
    assert got == [0, 1, 2, 3, 4]
    stats = client.get_inference_statistics("decoupled_repeat", as_json=True)["model_stats"][0]
    per_response = stats["response_stats"]
    for index in range(5):  # one entry per response index, as Triton's statistics extension
        assert int(per_response[str(index)]["success"]["count"]) >= 1
    # The model sends FINAL alone after its five responses: an empty response, index 5.
    assert int(per_response["5"]["empty_response"]["count"]) >= 1
    client.close()


def test_decoupled_model_refuses_plain_infer(server):
    client = httpclient.InferenceServerClient(server.url)
    count = httpclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="decoupled"):
        client.infer("decoupled_repeat", [count])
    client.close()


def test_bls_to_a_decoupled_model(server):
    client = httpclient.InferenceServerClient(server.url)
    count = httpclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([6], dtype=np.int32))
    result = client.infer("bls_decoupled", [count])
    assert int(result.as_numpy("TOTAL")[0]) == sum(range(6))
    client.close()


def test_cancelling_a_stream_reaches_the_model():
    args = ("--model-control-mode", "explicit", "--load-model", "decoupled_until_cancel")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        inp = grpcclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([0], dtype=np.int32))
        client.async_stream_infer("decoupled_until_cancel", [inp])
        for _ in range(3):
            _, error = responses.get(timeout=30)
            assert error is None, error
        stop_stream_cancelling(client)
        client.close()
        line = "decoupled_until_cancel: cancelled=True"
        deadline = time.monotonic() + 20
        while line not in server.output and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the server log for the model's own line
        assert line in server.output, server.output


def test_async_bls_fan_out_really_overlaps():
    args = (
        "--model-control-mode",
        "explicit",
        "--load-model",
        "bls_fanout",
        "--load-model",
        "async_peak",
    )
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        inp = httpclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([1], dtype=np.int32))
        peak = int(client.infer("bls_fanout", [inp]).as_numpy("PEAK")[0])
        # One instance of async_peak ran several executes at once: the calls overlapped.
        assert peak >= 2, peak
        client.close()
