import math

import pytest

from shoal.perf.stats import LatencySummary, percentile, summarize

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("q", "expected"),
    [(50, 5), (90, 9), (99, 10), (100, 10), (10, 1), (1, 1)],
)
def test_percentile_is_nearest_rank(q, expected):
    assert percentile(list(range(1, 11)), q) == expected


def test_percentile_of_one_value_is_that_value():
    assert percentile([3.5], 50) == percentile([3.5], 99) == 3.5


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize("q", [0, -1, 101])
def test_percentile_outside_its_range_is_refused(q):
    with pytest.raises(ValueError):
        percentile([1.0], q)


def test_latency_summary_in_milliseconds():
    summary = LatencySummary.of([4_000_000, 1_000_000, 2_000_000, 3_000_000])
    assert (summary.p50, summary.p90, summary.p99) == (2.0, 4.0, 4.0)
    assert (summary.min, summary.max, summary.mean) == (1.0, 4.0, 2.5)


def test_summarize_throughput_errors_and_cpu():
    result = summarize(
        model="m",
        protocol="http",
        client="python",
        concurrency=8,
        duration_s=2.0,
        latencies_ns=[1_000_000] * 100,
        errors=3,
        cpu_seconds=0.5,
        payload_bytes=64,
    )
    assert result.requests == 100
    assert result.throughput == 50.0
    assert result.responses_per_s == 50.0  # one response per request by default
    assert result.errors == 3
    assert result.client_cpu_percent == 25.0
    assert result.latency_ms.p99 == 1.0


def test_summarize_counts_streamed_responses_apart():
    result = summarize(
        model="m",
        protocol="grpc",
        client="python",
        concurrency=1,
        duration_s=1.0,
        latencies_ns=[5_000_000] * 10,
        errors=0,
        responses=320,
    )
    assert result.throughput == 10.0
    assert result.responses_per_s == 320.0


def test_a_cell_without_requests_has_nan_latencies_and_zero_throughput():
    result = summarize(
        model="m",
        protocol="http",
        client="python",
        concurrency=1,
        duration_s=1.0,
        latencies_ns=[],
        errors=7,
    )
    assert result.throughput == 0.0
    assert math.isnan(result.latency_ms.p50)
