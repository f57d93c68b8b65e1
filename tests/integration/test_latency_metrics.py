"""``--metrics-config summary_latencies=true`` and ``histogram_latencies=true`` on a real
``shoal serve``: Triton's latency summaries and first-response histogram after requests of known
latencies, through ``tritonclient`` (and with ``SHOAL_TEST_FRONTEND_WORKERS=2``, through the
workers, whose requests the core must still observe one by one)."""

from __future__ import annotations

import queue
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.server import ShoalServer

pytestmark = pytest.mark.timeout(180)

#: Sleeps the milliseconds it is given, then answers them.
SLEEPY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(int(ms[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return responses
"""

#: Decoupled: three responses, each after sleeping the milliseconds it is given.
CHATTY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            sender = request.get_response_sender()
            for _ in range(3):
                time.sleep(int(ms[0]) / 1000)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

#: The chatty model's own first-response buckets (Triton's ``model_metrics`` override).
CHATTY_CONFIG = (
    CONFIG
    + """
model_transaction_policy { decoupled: true }
model_metrics {
  metric_control: [ {
    metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
    histogram_options: { buckets: [ 100, 500 ] }
  } ]
}
"""
)

SLOW_MS, FAST_MS, FAST_COUNT = 600, 1, 9
CHATTY_MS = 200
HISTOGRAM = "nv_inference_first_response_histogram_ms"
SUMMARIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("latency-models")
    for name, model, config in (("sleepy", SLEEPY, CONFIG), ("chatty", CHATTY, CHATTY_CONFIG)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(model)
        (root / name / "config.pbtxt").write_text(config)
    return root


def _scrape(server: ShoalServer) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _samples(text: str, family: str, model: str) -> dict[str, float]:
    """The family's samples of ``model``, by sample name (and ``le`` or ``quantile``)."""
    samples = {}
    for parsed in text_string_to_metric_families(text):
        if parsed.name != family:
            continue
        for sample in parsed.samples:
            if sample.labels["model"] == model:
                extra = sample.labels.get("le") or sample.labels.get("quantile")
                samples[sample.name + (f"@{extra}" if extra else "")] = sample.value
    return samples


def _ms(value: int) -> httpclient.InferInput:
    tensor = httpclient.InferInput("MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return tensor


@pytest.fixture(scope="module")
def after_traffic(repo: Path) -> str:
    """Nine fast requests and a slow one to ``sleepy`` over HTTP, one request to ``chatty``
    over a gRPC stream, then a scrape."""
    flags = ("--metrics-config", "summary_latencies=true")
    flags += ("--metrics-config", "histogram_latencies=true")
    with ShoalServer(repo, metrics=True, extra_args=flags) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            for ms in [FAST_MS] * FAST_COUNT + [SLOW_MS]:
                assert client.infer("sleepy", [_ms(ms)]).as_numpy("OUT")[0] == ms
        finally:
            client.close()
        answers: queue.Queue[object] = queue.Queue()
        stream = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            stream.start_stream(callback=lambda result, error: answers.put(error or result))
            tensor = grpcclient.InferInput("MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([CHATTY_MS], dtype=np.int32))
            stream.async_stream_infer("chatty", [tensor])
            for _ in range(3):
                assert isinstance(answers.get(timeout=30), grpcclient.InferResult)
            stream.stop_stream()
        finally:
            stream.close()
        return _scrape(server)


def test_summaries_have_triton_names_labels_and_counts(after_traffic: str) -> None:
    requests = FAST_COUNT + 1
    for family in SUMMARIES:
        samples = _samples(after_traffic, family, "sleepy")
        assert samples[f"{family}_count"] == requests, family
        quantiles = sorted(k.split("@")[1] for k in samples if "@" in k)
        assert quantiles == ["0.5", "0.9", "0.95", "0.99", "0.999"], family
    # As in Triton, the quantile label comes after the version's labels.
    assert re.search(
        r'^nv_inference_compute_infer_summary_us\{model="sleepy",version="1",quantile="0\.5"\} ',
        after_traffic,
        re.M,
    )
    assert "# TYPE nv_inference_queue_summary_us summary" in after_traffic
    # The summaries' sums are the counters', each observation rounded down to a microsecond.
    line = re.search(
        r'^nv_inference_compute_infer_duration_us\{model="sleepy",version="1"\} (\d+)$',
        after_traffic,
        re.M,
    )
    assert line is not None
    total = int(line.group(1))
    summed = _samples(after_traffic, SUMMARIES[3], "sleepy")[f"{SUMMARIES[3]}_sum"]
    assert total - requests <= summed <= total


def test_quantiles_are_within_bounds_of_the_known_latencies(after_traffic: str) -> None:
    family = "nv_inference_compute_infer_summary_us"
    samples = _samples(after_traffic, family, "sleepy")
    # Nine requests slept 1 ms, one 600 ms: the median and 0.9 are fast ones, 0.99 the slow.
    for q in ("0.5", "0.9"):
        assert FAST_MS * 1000 <= samples[f"{family}@{q}"] < 100_000, q
    for q in ("0.99", "0.999"):
        assert SLOW_MS * 1000 <= samples[f"{family}@{q}"] < SLOW_MS * 1500, q
    request = _samples(after_traffic, "nv_inference_request_summary_us", "sleepy")
    assert request["nv_inference_request_summary_us@0.999"] >= SLOW_MS * 1000


def test_first_response_histogram_of_a_plain_model(after_traffic: str) -> None:
    samples = _samples(after_traffic, HISTOGRAM, "sleepy")
    assert samples[f"{HISTOGRAM}_count"] == FAST_COUNT + 1
    assert samples[f"{HISTOGRAM}_sum"] >= SLOW_MS
    # Triton's default buckets: the fast requests at or below 500 ms, the slow one above.
    assert samples[f"{HISTOGRAM}_bucket@100"] <= samples[f"{HISTOGRAM}_bucket@500"] == FAST_COUNT
    assert samples[f"{HISTOGRAM}_bucket@2000"] == FAST_COUNT + 1
    assert samples[f"{HISTOGRAM}_bucket@+Inf"] == FAST_COUNT + 1


def test_first_response_of_a_decoupled_model_is_its_first_not_its_last(
    after_traffic: str,
) -> None:
    samples = _samples(after_traffic, HISTOGRAM, "chatty")
    # One request, first answered after ~200 ms; its last response came after ~600 ms.
    assert samples[f"{HISTOGRAM}_count"] == 1
    assert CHATTY_MS <= samples[f"{HISTOGRAM}_sum"] < 3 * CHATTY_MS
    assert samples[f"{HISTOGRAM}_bucket@100"] == 0  # the model's own buckets: 100, 500
    assert samples[f"{HISTOGRAM}_bucket@500"] == 1
    assert set(samples) == {
        f"{HISTOGRAM}_count",
        f"{HISTOGRAM}_sum",
        f"{HISTOGRAM}_bucket@100",
        f"{HISTOGRAM}_bucket@500",
        f"{HISTOGRAM}_bucket@+Inf",
    }
    assert re.search(
        rf'^{HISTOGRAM}_bucket\{{model="chatty",version="1",le="500"\}} 1$', after_traffic, re.M
    )


def test_summaries_and_histograms_are_off_by_default(repo: Path) -> None:
    with ShoalServer(repo, metrics=True) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            client.infer("sleepy", [_ms(FAST_MS)])
        finally:
            client.close()
        text = _scrape(server)
    assert 'nv_inference_request_success{model="sleepy",version="1"} 1' in text
    assert "_summary" not in text
    assert HISTOGRAM not in text
