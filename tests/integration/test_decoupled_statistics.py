"""A decoupled model's requests fill compute_input/infer/output in the statistics, as Triton's
(perf_analyzer --streaming shows them), once execute returned and the final response came."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)


def _stats(client: grpcclient.InferenceServerClient) -> dict:
    (model,) = client.get_inference_statistics("decoupled_repeat", as_json=True)["model_stats"]
    return model


def test_streamed_requests_have_compute_times() -> None:
    args = ("--model-control-mode", "explicit", "--load-model", "decoupled_repeat")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            count = grpcclient.InferInput("COUNT", [1], "INT32")
            count.set_data_from_numpy(np.array([3], dtype=np.int32))
            for _ in range(2):
                client.async_stream_infer("decoupled_repeat", [count])
            for _ in range(6):
                _result, error = answers.get(timeout=30)
                assert error is None, error
        finally:
            client.stop_stream()
        deadline = time.monotonic() + 30
        while int(_stats(client)["inference_stats"]["success"].get("count", 0)) < 2:
            assert time.monotonic() < deadline, _stats(client)
            time.sleep(0.05)  # polling the statistics, not waiting on time
        stats = _stats(client)
        client.close()
    infer = stats["inference_stats"]
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert int(infer[stage]["count"]) == 2, (stage, infer)
    assert int(infer["compute_infer"]["ns"]) > 0
    assert int(infer["success"]["ns"]) >= int(infer["compute_infer"]["ns"])
