"""The dynamic batcher through a real server: batching under load, priorities, queue policies,
and the per-instance thread defaults."""

from __future__ import annotations

import os
import re
import time
import urllib.request

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODELS = ("batch_echo", "batch_gate")


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    with ShoalServer(TEST_MODELS, extra_args=tuple(args), metrics=True) as running:
        yield running
        assert "Traceback" not in running.output, running.output


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=32, network_timeout=60)
    yield c
    c.close()


def _input(name: str, array: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def _stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def test_concurrent_requests_are_batched(client):
    before = _stats(client, "batch_echo")
    pending = [
        client.async_infer("batch_echo", [_input("IN", np.full((1, 3), i, np.float32))])
        for i in range(64)
    ]
    results = [p.get_result(timeout=60) for p in pending]
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.full((1, 3), i))
    assert max(int(r.as_numpy("BATCH")[0][0]) for r in results) > 1
    after = _stats(client, "batch_echo")
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert inferences == 64
    assert executions < inferences
    batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    assert max(batches) > 1 and max(batches) <= 8
    assert sum(size * count for size, count in batches.items()) == int(after["inference_count"])
    assert sum(batches.values()) == int(after["execution_count"])


def test_requests_of_different_shapes_run_in_different_executions(client):
    pending = [
        client.async_infer("batch_echo", [_input("IN", np.ones((1, 2 + i % 2), np.float32))])
        for i in range(16)
    ]
    for i, p in enumerate(pending):
        result = p.get_result(timeout=60)
        assert result.as_numpy("OUT").shape == (1, 2 + i % 2)


def test_stub_thread_defaults(client):
    result = client.infer("batch_echo", [_input("IN", np.ones((1, 1), np.float32))])
    omp, mkl, openblas = (v.decode() for v in result.as_numpy("THREADS")[0])
    # Not set behind the model's back (as in Triton): the server's environment, inherited.
    assert omp == os.environ.get("OMP_NUM_THREADS", "")
    assert mkl == "3"  # the model parameter wins
    assert openblas == os.environ.get("OPENBLAS_NUM_THREADS", "")


class Gate:
    """Holds batch_gate's only instance busy until opened."""

    def __init__(self, client, server, tmp_path) -> None:
        self.path = tmp_path / "open"
        marker = f"batch_gate: waiting for {self.path}"
        self.pending = client.async_infer(
            "batch_gate",
            [_input("IN", np.zeros((1, 1), np.float32))],
            parameters={"gate": str(self.path)},
        )
        deadline = time.monotonic() + 30
        while marker not in server.output and time.monotonic() < deadline:
            # Polling the log for the model's own line; gevent's sleep lets the client's
            # request greenlets run meanwhile.
            gevent.sleep(0.01)
        assert marker in server.output, "the gate request did not start executing"

    def open(self) -> None:
        self.path.touch()
        self.pending.get_result(timeout=30)


def _gated(client, **kwargs):
    return client.async_infer("batch_gate", [_input("IN", np.zeros((1, 1), np.float32))], **kwargs)


def _order(pending) -> int:
    return int(pending.get_result(timeout=30).as_numpy("ORDER")[0][0])


def test_higher_priority_runs_first(client, server, tmp_path):
    gate = Gate(client, server, tmp_path)
    low = _gated(client)  # the default level, 2
    high = _gated(client, priority=1)
    _wait_queued(server, 2)
    gate.open()
    assert _order(high) < _order(low)


def test_queue_timeout_rejects_with_tritons_message(client, server, tmp_path):
    before = _stats(client, "batch_gate")["inference_stats"]["fail"]["count"]
    rejected = _rejected(server)
    gate = Gate(client, server, tmp_path)
    doomed = _gated(client, timeout=100_000)  # 100 ms, shorter than the default: applies
    with pytest.raises(InferenceServerException) as info:
        doomed.get_result(timeout=30)
    assert "Request timeout expired" in str(info.value)
    assert info.value.status() == "503"
    gate.open()
    after = _stats(client, "batch_gate")["inference_stats"]["fail"]["count"]
    assert int(after) == int(before) + 1  # a rejected request counts as a failure
    assert _rejected(server) == rejected + 1  # ... under Triton's reason REJECTED


def _rejected(server) -> int:
    return int(_metric(server, "nv_inference_request_failure", 'reason="REJECTED",'))


def test_full_priority_queue_rejects(client, server, tmp_path):
    rejected = _rejected(server)
    gate = Gate(client, server, tmp_path)
    kept = [_gated(client, priority=1) for _ in range(2)]
    _wait_queued(server, 2)
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            "batch_gate", [_input("IN", np.zeros((1, 1), np.float32))], priority=1, request_id="x"
        )
    assert "[request id: x] Exceeds maximum queue size" in str(info.value)
    assert _rejected(server) == rejected + 1
    other_level = _gated(client)  # level 2 has no limit
    gate.open()
    for pending in (*kept, other_level):
        _order(pending)


def _wait_queued(server, count: int) -> None:
    """Poll the server's pending-request gauge until ``count`` requests wait for batch_gate."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _pending(server) >= count:
            return
        gevent.sleep(0.01)  # polling the server (and letting request greenlets run)
    raise AssertionError(f"{count} requests never queued for batch_gate")


def _pending(server) -> int:
    return int(_metric(server, "nv_inference_pending_request_count"))


def _metric(server, family: str, labels: str = "") -> float:
    """batch_gate's sample of ``family``; ``labels``: the labels sorting before ``version``."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    pattern = rf'^{family}\{{model="batch_gate",{labels}version="1"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0
