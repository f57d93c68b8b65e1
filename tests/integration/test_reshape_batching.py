"""A reshape with a -1 under the dynamic batcher, through a real server: the model sees the
request's real shape, and requests whose shapes differ there never share a batch (Triton keys
its batches by the shape after the reshape, the -1 resolved from the request)."""

from __future__ import annotations

import re
import time
import urllib.request

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODEL = "batch_reshape"


@pytest.fixture(scope="module")
def server():
    args = ("--model-control-mode", "explicit", "--load-model", MODEL)
    with ShoalServer(TEST_MODELS, extra_args=args, metrics=True) as running:
        yield running
        assert "Traceback" not in running.output, running.output


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=16, network_timeout=60)
    yield c
    c.close()


def _send(client, width: int, **kwargs):
    values = np.arange(width, dtype=np.float32).reshape(1, width)
    tensor = httpclient.InferInput("V", [1, width], "FP32")
    tensor.set_data_from_numpy(values)
    return client.async_infer(MODEL, [tensor], **kwargs)


def test_the_model_sees_the_reshape_with_its_minus_one_resolved(client):
    for width in (1, 3):
        values = np.ones((2, width), np.float32)
        tensor = httpclient.InferInput("V", [2, width], "FP32")
        tensor.set_data_from_numpy(values)
        result = client.infer(MODEL, [tensor])
        assert result.as_numpy("SHAPE").tolist() == [[2, width, 1]] * 2


def test_requests_whose_reshaped_shapes_differ_do_not_share_a_batch(client, server, tmp_path):
    gate = tmp_path / "open"
    marker = f"batch_reshape: waiting for {gate}"
    held = _send(client, 2, parameters={"gate": str(gate)})  # holds the only instance
    _wait_for(lambda: marker in server.output, "the gate request did not start executing")
    queued = []
    for count, width in enumerate((1, 1, 3, 3), start=1):  # queued in this order
        queued.append((width, _send(client, width)))
        _wait_for(lambda n=count: _pending(server) >= n, f"{count} requests never queued")
    gate.touch()
    held.get_result(timeout=30)
    for width, pending in queued:
        result = pending.get_result(timeout=30)
        assert result.as_numpy("SHAPE").tolist() == [[1, width, 1]]
        # two batches of two: [1, 1] and [1, 3] as the model sees them are apart
        assert result.as_numpy("BATCH").tolist() == [[2]]


def _wait_for(condition, message: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, message
        # polling the server; gevent's sleep lets the client's request greenlets run meanwhile
        gevent.sleep(0.01)


def _pending(server) -> int:
    """The server's pending-request gauge for the model."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    pattern = rf'^nv_inference_pending_request_count\{{model="{MODEL}",version="1"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0
