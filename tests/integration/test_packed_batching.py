"""The dynamic batcher's requests packed by two frontend workers (``requests/packed.py``):
batched with the requests that go the core's way (JSON data, a priority), priorities and queue
timeouts as before, and a reload while requests flow (stale snapshots sent the core's way)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer
from tests.integration.test_batching import Gate, _gated, _order, _stats, _wait_queued

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit", "--frontend-workers", "2"]
    for name in ("batch_echo", "batch_gate"):
        args += ["--load-model", name]
    with ShoalServer(TEST_MODELS, extra_args=tuple(args), metrics=True) as running:
        yield running
        assert "Traceback" not in running.output, running.output


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=32, network_timeout=60)
    yield c
    c.close()


def _input(array: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput("IN", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_packed_and_json_requests_are_batched_and_answered(client):
    before = _stats(client, "batch_echo")
    # binary data is packed by the worker; JSON data goes the core's way; two shapes, in runs
    # of 12 (a request of another shape ends a batch)
    pending = [
        client.async_infer(
            "batch_echo", [_input(np.full((1, 3 + i // 12 % 2), i, np.float32), i % 3 > 0)]
        )
        for i in range(48)
    ]
    results = [p.get_result(timeout=60) for p in pending]
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.full((1, 3 + i // 12 % 2), i))
    assert max(int(r.as_numpy("BATCH")[0][0]) for r in results) > 1
    after = _stats(client, "batch_echo")
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert inferences == 48 and executions < inferences
    batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    assert sum(size * count for size, count in batches.items()) == int(after["inference_count"])


def test_a_priority_request_still_goes_first(client, server, tmp_path):
    gate = Gate(client, server, tmp_path)
    low = _gated(client)  # packed: the default level
    high = _gated(client, priority=1)  # names a priority: the core's way
    _wait_queued(server, 2)
    gate.open()
    assert _order(high) < _order(low)


def test_a_packed_request_s_queue_timeout_is_rejected(client, server, tmp_path):
    gate = Gate(client, server, tmp_path)
    doomed = _gated(client, timeout=100_000, request_id="late")  # 100 ms: packed with it
    with pytest.raises(InferenceServerException) as info:
        doomed.get_result(timeout=30)
    assert "Request timeout expired" in str(info.value) and info.value.status() == "503"
    gate.open()


def test_a_reload_while_requests_flow_loses_none(client):
    config = client.get_model_config("batch_echo")
    config["dynamic_batching"]["max_queue_delay_microseconds"] = 2000
    pending = []
    for round_ in range(3):
        # in flight while the model reloads (the client's greenlets run as load_model waits):
        # a worker's snapshot goes stale, and its requests go again the core's way
        pending += [
            (values, client.async_infer("batch_echo", [_input(values)]))
            for values in (np.full((1, 2), round_ * 100 + i, np.float32) for i in range(24))
        ]
        if round_ < 2:
            client.load_model("batch_echo", config=json.dumps(config))
    for values, request in pending:
        np.testing.assert_array_equal(request.get_result(timeout=60).as_numpy("OUT"), values)
    delay = client.get_model_config("batch_echo")["dynamic_batching"]
    assert int(delay["max_queue_delay_microseconds"]) == 2000
