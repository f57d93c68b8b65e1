"""``/metrics`` of a real ``shoal serve``: Triton's counters add up after known traffic."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

N = 5
ADD_SUB = {"model": "add_sub", "version": "1"}


@pytest.fixture(scope="module")
def server():
    with ShoalServer(BUNDLED, metrics=True) as s:
        yield s


def _scrape(server, path="/metrics"):
    url = f"http://127.0.0.1:{server.metrics_port}{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def _values(text):
    """{(family, frozenset(labels)): value}; the parser's own sample names vary by type."""
    return {
        (family.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(values, family, **labels):
    return values[(family, frozenset(labels.items()))]


def _inputs(a, b):
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.fixture(scope="module")
def after_traffic(server):
    """N successful add_sub inferences and one that fails its input checks, then a scrape."""
    client = httpclient.InferenceServerClient(server.url)
    try:
        a = np.arange(4, dtype=np.float32)
        for _ in range(N):
            result = client.infer("add_sub", _inputs(a, a))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        wrong = np.arange(3, dtype=np.float32)
        with pytest.raises(InferenceServerException):
            client.infer("add_sub", _inputs(wrong, wrong))
    finally:
        client.close()
    return _scrape(server)


def test_the_endpoint_serves_prometheus_text(server, after_traffic):
    content_type, _ = after_traffic
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    with pytest.raises(urllib.error.HTTPError) as info:
        _scrape(server, "/v2/health/live")
    assert info.value.code == 404


def test_request_counts_add_up(after_traffic):
    _, text = after_traffic
    # The exact lines Triton prints: no `_total` suffix, labels model and version.
    assert re.search(
        rf'^nv_inference_request_success{{model="add_sub",version="1"}} {N}$', text, re.M
    )
    assert re.search(rf'^nv_inference_exec_count{{model="add_sub",version="1"}} {N}$', text, re.M)
    values = _values(text)
    assert _value(values, "nv_inference_request_success", **ADD_SUB) == N
    assert _value(values, "nv_inference_count", **ADD_SUB) == N
    assert _value(values, "nv_inference_exec_count", **ADD_SUB) == N
    failures = {
        reason: _value(values, "nv_inference_request_failure", **ADD_SUB, reason=reason)
        for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED")
    }
    assert failures == {"OTHER": 1, "BACKEND": 0, "CANCELED": 0, "REJECTED": 0}
    assert _value(values, "nv_inference_pending_request_count", **ADD_SUB) == 0
    # Models that saw no traffic are reported too, at zero.
    assert _value(values, "nv_inference_request_success", model="identity", version="1") == 0


def test_durations_are_cumulative_microseconds(after_traffic):
    values = _values(after_traffic[1])
    request = _value(values, "nv_inference_request_duration_us", **ADD_SUB)
    infer = _value(values, "nv_inference_compute_infer_duration_us", **ADD_SUB)
    assert request > 0
    assert infer > 0
    assert request >= infer
    for family in (
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_output_duration_us",
    ):
        assert 0 <= _value(values, family, **ADD_SUB) <= request


def test_instance_and_arena_gauges(after_traffic):
    values = _values(after_traffic[1])
    labels = {**ADD_SUB, "instance": _instance_name(values, "add_sub")}
    assert _value(values, "shoal_instance_ready", **labels) == 1
    assert _value(values, "shoal_instance_restarts", **labels) == 0
    assert _value(values, "shoal_stub_rss_bytes", **labels) > 1 << 20  # a Python process
    capacity = _value(values, "shoal_arena_capacity_bytes", arena="input")
    assert capacity > 0
    assert 0 <= _value(values, "shoal_arena_used_bytes", arena="input") <= capacity


def test_host_cpu_families_as_tritons(server, after_traffic):
    values = _values(after_traffic[1])
    total = _value(values, "nv_cpu_memory_total_bytes")
    assert total > 1 << 28
    assert 0 < _value(values, "nv_cpu_memory_used_bytes") < total
    assert 0.0 <= _value(values, "nv_cpu_utilization") <= 1.0


@pytest.mark.timeout(60)
def test_allow_cpu_metrics_false_leaves_out_the_host_families():
    with ShoalServer(BUNDLED, metrics=True, extra_args=("--allow-cpu-metrics", "false")) as s:
        _, text = _scrape(s)
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "nv_inference_count" in names
    assert not {n for n in names if n.startswith("nv_cpu_")}


def _instance_name(values, model):
    (name,) = {
        dict(labels)["instance"]
        for family, labels in values
        if family == "shoal_instance_ready" and dict(labels)["model"] == model
    }
    return name


@pytest.mark.timeout(60)
def test_allow_metrics_false_binds_no_metrics_port():
    with ShoalServer(BUNDLED, extra_args=("--model-control-mode", "explicit")) as s:
        assert s.stop() == 0
        output = s.output
    assert "SHOAL_LISTENING http " in output
    assert "SHOAL_LISTENING metrics" not in output
    assert "metrics endpoint is not implemented" not in output


@pytest.mark.timeout(90)
def test_failures_are_counted_under_tritons_reasons():
    """A model error is BACKEND, a client that gives up is CANCELED, a bad request is OTHER
    (REJECTED: tests/integration/test_batching.py)."""
    args = ("--model-control-mode", "explicit", "--load-model", "raiser", "--load-model", "slow")
    with ShoalServer(TEST_MODELS, extra_args=args, metrics=True) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        raiser = grpcclient.InferInput("IN", [1], "FP32")
        raiser.set_data_from_numpy(np.ones(1, np.float32))
        with pytest.raises(InferenceServerException, match="intentional failure"):
            client.infer("raiser", [raiser])
        seconds = grpcclient.InferInput("SECONDS", [1], "FP32")
        seconds.set_data_from_numpy(np.array([2.0], np.float32))
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("slow", [seconds], client_timeout=0.5)
        wrong = grpcclient.InferInput("SECONDS", [2], "FP32")
        wrong.set_data_from_numpy(np.ones(2, np.float32))
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            client.infer("slow", [wrong])
        client.close()
        expected = {
            ("raiser", "BACKEND"): 1,
            ("slow", "CANCELED"): 1,
            ("slow", "OTHER"): 1,
        }
        deadline = time.monotonic() + 30
        while True:  # the cancelled request is counted when the server sees the RPC end
            values = _values(_scrape(server)[1])
            seen = {
                (model, reason): _value(
                    values,
                    "nv_inference_request_failure",
                    model=model,
                    version="1",
                    reason=reason,
                )
                for model in ("raiser", "slow")
                for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED")
            }
            if all(seen[key] == count for key, count in expected.items()):
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)  # polling the metrics endpoint
        assert sum(seen.values()) == 3, seen


STAGES = ("stage", "queue", "ipc_in", "compute_input", "compute_infer", "compute_output")
STAGES += ("ipc_out", "complete", "core_total")


@pytest.mark.timeout(120)
def test_trace_overhead_times_every_stage_of_every_request():
    """With --trace-overhead each request is timed in each pipeline stage; without it, the
    families are absent. The stages of one request fit in its core total."""
    with ShoalServer(BUNDLED, metrics=True, extra_args=["--trace-overhead"]) as traced:
        client = httpclient.InferenceServerClient(traced.url)
        try:
            a = np.arange(4, dtype=np.float32)
            for _ in range(N):
                client.infer("add_sub", _inputs(a, a))
        finally:
            client.close()
        values = _values(_scrape(traced)[1])
    count = {s: _value(values, "shoal_request_stage_count", **_stage(s)) for s in STAGES}
    total = {s: _value(values, "shoal_request_stage_duration_us", **_stage(s)) for s in STAGES}
    assert count == dict.fromkeys(STAGES, N)
    assert all(us >= 0 for us in total.values())
    # Consecutive legs of one request: their sum cannot exceed the whole (1 µs rounding each).
    legs = ("stage", "queue", "ipc_in", "compute_input", "compute_infer", "compute_output")
    legs += ("ipc_out", "complete")
    assert sum(total[s] for s in legs) <= total["core_total"] + len(legs)
    assert total["compute_infer"] > 0


def test_without_trace_overhead_no_stage_families(after_traffic):
    assert "shoal_request_stage" not in after_traffic[1]


def _stage(stage):
    return {"model": "add_sub", "version": "1", "stage": stage}
