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


def _stats(client: grpcclient.InferenceServerClient, model: str) -> dict:
    (stats,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    return stats


def _streamed_stats(
    server: ShoalServer, model: str, tensor: grpcclient.InferInput, requests: int, answers: int
) -> dict:
    """Stream ``requests`` requests of ``tensor``, take ``answers`` responses, and return the
    model's statistics once every request counts as a success."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    try:
        for _ in range(requests):
            client.async_stream_infer(model, [tensor])
        for _ in range(answers):
            _result, error = received.get(timeout=30)
            assert error is None, error
    finally:
        client.stop_stream()
    deadline = time.monotonic() + 30
    while int(_stats(client, model)["inference_stats"]["success"].get("count", 0)) < requests:
        assert time.monotonic() < deadline, _stats(client, model)
        time.sleep(0.05)  # polling the statistics, not waiting on time
    stats = _stats(client, model)
    client.close()
    return stats


def test_streamed_requests_have_compute_times() -> None:
    args = ("--model-control-mode", "explicit", "--load-model", "decoupled_repeat")
    with ShoalServer(TEST_MODELS, extra_args=args) as server:
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([3], dtype=np.int32))
        stats = _streamed_stats(server, "decoupled_repeat", count, requests=2, answers=6)
    infer = stats["inference_stats"]
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert int(infer[stage]["count"]) == 2, (stage, infer)
    assert int(infer["compute_infer"]["ns"]) > 0
    assert int(infer["success"]["ns"]) >= int(infer["compute_infer"]["ns"])


# Sends its final response, then takes 0.3 s more before execute returns.
FINAL_FIRST = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            out = pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))
            sender.send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        time.sleep(0.3)
        return None
"""


def test_a_request_answered_before_execute_returns_lasts_its_execution(tmp_path) -> None:
    model = tmp_path / "final_first"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(FINAL_FIRST)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    with ShoalServer(tmp_path) as server:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        stats = _streamed_stats(server, "final_first", tensor, requests=1, answers=1)
    infer = stats["inference_stats"]
    assert int(infer["compute_infer"]["ns"]) >= 300_000_000, infer
    # Triton ends such a request with its execution: its success time covers compute_infer.
    assert int(infer["success"]["ns"]) >= int(infer["compute_infer"]["ns"]), infer
