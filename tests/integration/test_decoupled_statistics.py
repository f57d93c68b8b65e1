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
        client = grpcclient.InferenceServerClient(server.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
            client.async_stream_infer("final_first", [tensor])
            _result, error = answers.get(timeout=30)
            assert error is None, error
        finally:
            client.stop_stream()
        deadline = time.monotonic() + 30
        stats = client.get_inference_statistics("final_first", as_json=True)["model_stats"][0]
        while int(stats["inference_stats"]["success"].get("count", 0)) < 1:
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)  # polling the statistics, not waiting on time
            stats = client.get_inference_statistics("final_first", as_json=True)["model_stats"][0]
        client.close()
    infer = stats["inference_stats"]
    assert int(infer["compute_infer"]["ns"]) >= 300_000_000, infer
    # Triton ends such a request with its execution: its success time covers compute_infer.
    assert int(infer["success"]["ns"]) >= int(infer["compute_infer"]["ns"]), infer
