"""Triton's latency summaries and first-response histogram, fed by hand, as ``/metrics`` prints
them."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.supervisor.extensions._metrics_families import render_text
from shoal.supervisor.extensions.latency_families import (
    DEFAULT_BUCKETS,
    FIRST_RESPONSE,
    LatencySettings,
    VersionLatencies,
    histogram_buckets,
    latency_families,
)
from shoal.supervisor.extensions.statistics import StatsRecorder

pytestmark = pytest.mark.timeout(30)

BOTH = LatencySettings(summaries=True, histograms=True)
LABELS = {"model": "m", "version": "1"}
MS = 1_000_000


def _text(*versions: tuple[dict[str, str], VersionLatencies]) -> str:
    return render_text(latency_families(list(versions))).decode()


def _recorder(settings: LatencySettings, **kwargs: object) -> StatsRecorder:
    recorder = StatsRecorder("m", 1)
    recorder.latencies = VersionLatencies(settings, **kwargs)  # type: ignore[arg-type]
    return recorder


def test_summaries_and_histogram_print_as_triton_does() -> None:
    recorder = _recorder(BOTH, cached=False)
    for infer_us in (100, 200, 300):
        ns = infer_us * 1000
        recorder.success(1, ns + 50_000, 40_000, (1_000, ns, 2_000))
        recorder.first_response(ns + 50_000)
    text = _text((LABELS, recorder.latencies))  # type: ignore[arg-type]
    assert (
        "# HELP nv_inference_compute_infer_summary_us Cumulative compute inference duration in "
        "microseconds (does not include cached requests)\n"
        "# TYPE nv_inference_compute_infer_summary_us summary\n"
        'nv_inference_compute_infer_summary_us_count{model="m",version="1"} 3\n'
        'nv_inference_compute_infer_summary_us_sum{model="m",version="1"} 600\n'
        'nv_inference_compute_infer_summary_us{model="m",version="1",quantile="0.5"} 200\n'
        'nv_inference_compute_infer_summary_us{model="m",version="1",quantile="0.9"} 300\n'
        'nv_inference_compute_infer_summary_us{model="m",version="1",quantile="0.95"} 300\n'
        'nv_inference_compute_infer_summary_us{model="m",version="1",quantile="0.99"} 300\n'
        'nv_inference_compute_infer_summary_us{model="m",version="1",quantile="0.999"} 300\n'
    ) in text
    # Labels in Triton's order (clients match the whole `{model=...,version=...,le=...}`).
    assert (
        "# TYPE nv_inference_first_response_histogram_ms histogram\n"
        'nv_inference_first_response_histogram_ms_count{model="m",version="1"} 3\n'
        'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 0\n'
        'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="100"} 3\n'
    ) in text
    assert 'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="+Inf"} 3' in (
        text
    )
    names = {family.name for family in text_string_to_metric_families(text)}
    assert names == {
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
        FIRST_RESPONSE,
    }


def test_histogram_buckets_count_each_observation_at_or_below_their_bound() -> None:
    latencies = VersionLatencies(LatencySettings(histograms=True), cached=False)
    for ms in (0, 100, 101, 499, 2000, 7000):
        latencies.first_response(ms * MS + MS // 2)  # whole milliseconds, as Triton's
    samples = {
        sample.labels.get("le", sample.name): sample.value
        for family in text_string_to_metric_families(_text((LABELS, latencies)))
        for sample in family.samples
    }
    assert samples == {
        "100": 2,
        "500": 4,
        "2000": 5,
        "5000": 5,
        "+Inf": 6,
        f"{FIRST_RESPONSE}_count": 6,
        f"{FIRST_RESPONSE}_sum": 0 + 100 + 101 + 499 + 2000 + 7000,
    }
    assert "summary" not in _text((LABELS, latencies))


def test_a_cached_version_has_the_cache_summaries_and_no_request_summary() -> None:
    recorder = _recorder(LatencySettings(summaries=True), cached=True)
    recorder.cache_hit(900_000, 300_000, 20_000)
    recorder.cache_miss(7_000)
    text = _text((LABELS, recorder.latencies))  # type: ignore[arg-type]
    assert "nv_inference_request_summary_us" not in text
    assert 'nv_cache_hit_summary_per_model_count{model="m",version="1"} 1' in text
    assert 'nv_cache_hit_summary_per_model_sum{model="m",version="1"} 20' in text
    assert 'nv_cache_miss_summary_per_model_sum{model="m",version="1"} 7' in text
    assert 'nv_inference_queue_summary_us_sum{model="m",version="1"} 300' in text
    assert FIRST_RESPONSE not in text


def test_custom_quantiles_and_no_observation_yet() -> None:
    settings = LatencySettings(summaries=True, quantiles=((0.1, 0.0), (0.75, 0.01)))
    text = _text((LABELS, VersionLatencies(settings, cached=False)))
    assert 'nv_inference_queue_summary_us{model="m",version="1",quantile="0.1"} NaN' in text
    assert 'nv_inference_queue_summary_us{model="m",version="1",quantile="0.75"} NaN' in text
    assert 'nv_inference_queue_summary_us_count{model="m",version="1"} 0' in text


def test_failures_are_first_responses_but_not_summaries() -> None:
    recorder = _recorder(BOTH, cached=False)
    recorder.failure(3 * MS, "BACKEND")
    text = _text((LABELS, recorder.latencies))  # type: ignore[arg-type]
    assert 'nv_inference_request_summary_us_count{model="m",version="1"} 0' in text
    assert f'{FIRST_RESPONSE}_count{{model="m",version="1"}} 1' in text
    # A decoupled model's failure comes after its responses, if any: not its first.
    decoupled = _recorder(BOTH, cached=False, decoupled=True)
    decoupled.failure(3 * MS, "BACKEND")
    assert f'{FIRST_RESPONSE}_count{{model="m",version="1"}} 0' in _text(
        (LABELS, decoupled.latencies)  # type: ignore[arg-type]
    )


def test_a_recorder_without_families_records_statistics_only() -> None:
    recorder = StatsRecorder("m", 1)
    recorder.success(1, 5_000, 1_000, (1, 2, 3))
    recorder.first_response(5_000)
    assert recorder.latencies is None
    assert recorder.snapshot().inference_stats.success.count == 1


def test_the_bucket_override_of_a_model_config(caplog: pytest.LogCaptureFixture) -> None:
    assert histogram_buckets("m", []) == DEFAULT_BUCKETS
    assert histogram_buckets("m", [(FIRST_RESPONSE, (-1, 0.0, 1, 2.5))]) == (-1, 0, 1, 2.5)
    with caplog.at_level(logging.WARNING, logger="shoal"):
        assert histogram_buckets("m", [("nv_inference_count", (1,))]) == DEFAULT_BUCKETS
    assert "'nv_inference_count' in 'metric_identifier' is not a customizable" in caplog.text
    latencies = VersionLatencies(BOTH, cached=False, buckets=(-1, 0, 1, 2.5))
    text = _text((LABELS, latencies))
    les = [line.split(',le="')[1].split('"')[0] for line in text.splitlines() if ',le="' in line]
    assert les == ["-1", "0", "1", "2.5", "+Inf"]
