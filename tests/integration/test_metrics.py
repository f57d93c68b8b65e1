"""``/metrics`` of a real ``shoal serve``: Triton's counters add up after known traffic."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, ShoalServer

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
