"""Triton's latency summaries and first-response histogram (``--metrics-config
summary_latencies=true``, ``histogram_latencies=true``), one :class:`VersionLatencies` per model
version.

The version's statistics recorder (``statistics.py``) hands each request's durations here as it
records them, so the families see the same observations as the counters; with both settings
off (the default) no version has one and the recorder skips them on one ``None`` test. Which
families a version has, their names, HELP texts, labels and default buckets and quantiles are
Triton's (``triton-inference-server/core``: ``metric_model_reporter.{h,cc}``, ``metrics.cc``,
``infer_stats.cc``, ``infer_response.cc``). See docs/metrics.md.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from shoal.config.model_config import ModelConfig
from shoal.supervisor.extensions.quantiles import WindowedQuantiles

__all__ = [
    "DEFAULT_BUCKETS",
    "DEFAULT_QUANTILES",
    "FIRST_RESPONSE",
    "LatencySettings",
    "VersionLatencies",
    "for_version",
    "histogram_buckets",
    "latency_families",
]

log = logging.getLogger("shoal")

#: Triton's default ``summary_quantiles``: (quantile, error) pairs.
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
#: The first-response histogram's family, and its default bucket bounds (milliseconds).
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
DEFAULT_BUCKETS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)
_FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"

#: (key, family, HELP) of each summary, in Triton's order.
_SUMMARIES = (
    (
        "request",
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "queue",
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "compute_input",
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "compute_infer",
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "compute_output",
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
    ),
    (
        "cache_hit",
        "nv_cache_hit_summary_per_model",
        "Summary of cache hit counts/durations per model, in microseconds.",
    ),
    (
        "cache_miss",
        "nv_cache_miss_summary_per_model",
        "Summary of cache miss counts/durations per model, in microseconds.",
    ),
)


@dataclass(frozen=True)
class LatencySettings:
    """What ``--metrics-config`` turned on, for every version."""

    summaries: bool = False
    histograms: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES

    @property
    def enabled(self) -> bool:
        return self.summaries or self.histograms


class _Histogram:
    """Counts of the observations at or below each bound (the last, +Inf, implied)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0

    def observe(self, ms: int) -> None:
        self.counts[bisect.bisect_left(self.bounds, ms)] += 1
        self.count += 1
        self.total += ms


class VersionLatencies:
    """The summaries and histogram of one model version.

    As in Triton: summaries are observed for successes only, in whole microseconds; a version
    that uses the response cache has no request summary (its request times leave out the
    cache insertion) and has the cache hit and miss summaries; the first-response histogram
    is observed once per request, in whole milliseconds from the request's arrival to its
    first response (a decoupled model's first response, not its last).
    """

    def __init__(
        self,
        settings: LatencySettings,
        cached: bool,
        buckets: tuple[float, ...] = DEFAULT_BUCKETS,
        decoupled: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: Each request has one response (not a decoupled model): a failure's error is its
        #: first response.
        self.one_response = not decoupled
        self.quantiles = tuple(q for q, _ in settings.quantiles)
        wanted = set()
        if settings.summaries:
            wanted = {"queue", "compute_input", "compute_infer", "compute_output"}
            wanted |= {"cache_hit", "cache_miss"} if cached else {"request"}
        self._clock = clock
        self.summaries = {
            key: WindowedQuantiles(clock=clock) for key, _, _ in _SUMMARIES if key in wanted
        }
        self._request = self.summaries.get("request")
        self._queue = self.summaries.get("queue")
        self._compute = None
        if settings.summaries:  # input, infer and output: all three or none
            summaries = self.summaries
            stages = (summaries["compute_input"], summaries["compute_infer"])
            self._compute = (*stages, summaries["compute_output"])
        self.histogram = _Histogram(buckets) if settings.histograms else None

    def success(self, total_ns: int, queue_ns: int, compute: tuple[int, int, int]) -> None:
        """A request answered without error, after running the model."""
        queue = self._queue
        if queue is None:
            return
        now = self._clock()
        if self._request is not None:
            self._request.observe(total_ns // 1000, now)
        queue.observe(queue_ns // 1000, now)
        if self._compute is not None:
            stage_input, stage_infer, stage_output = self._compute
            stage_input.observe(compute[0] // 1000, now)
            stage_infer.observe(compute[1] // 1000, now)
            stage_output.observe(compute[2] // 1000, now)

    def cache_hit(self, queue_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache."""
        now = self._clock()
        if self._queue is not None:
            self._queue.observe(queue_ns // 1000, now)
        if (summary := self.summaries.get("cache_hit")) is not None:
            summary.observe(hit_ns // 1000, now)

    def cache_miss(self, miss_ns: int) -> None:
        """A request's lookup and insertion in the response cache after a miss."""
        if (summary := self.summaries.get("cache_miss")) is not None:
            summary.observe(miss_ns // 1000, self._clock())

    def first_response(self, ns: int) -> None:
        """The request's first response was sent ``ns`` after it arrived."""
        if self.histogram is not None:
            self.histogram.observe(ns // 1_000_000)


def for_version(settings: LatencySettings, config: ModelConfig, cache: bool) -> VersionLatencies:
    """The families of a version of ``config`` (``cache``: the server has a response cache)."""
    controls = [
        (control.metric_identifier.family, tuple(control.histogram_options.buckets))
        for control in config.proto.model_metrics.metric_control
    ]
    buckets = histogram_buckets(config.name, controls)
    cached = cache and config.response_cache
    return VersionLatencies(settings, cached, buckets, config.decoupled)


def histogram_buckets(
    model: str, metric_controls: Iterable[tuple[str, Sequence[float]]]
) -> tuple[float, ...]:
    """The first-response buckets of a model whose configuration's ``model_metrics`` has
    ``metric_controls`` ((family, buckets) pairs): Triton's defaults unless it names the
    family. Another family is warned about, as Triton does."""
    buckets = DEFAULT_BUCKETS
    for family, bounds in metric_controls:
        if family == FIRST_RESPONSE:
            buckets = tuple(sorted(set(bounds)))
        else:
            log.warning(
                "Metric family '%s' in 'metric_identifier' is not a customizable metric in "
                "Triton core (model '%s'; only '%s' is)",
                family,
                model,
                FIRST_RESPONSE,
            )
    return buckets


def latency_families(
    versions: Sequence[tuple[dict[str, str], VersionLatencies]],
) -> Iterator[Metric]:
    """The summary and histogram families of the versions that have them (``labels``: the
    version's ``model`` and ``version``)."""
    for key, name, help_text in _SUMMARIES:
        family = Metric(name, help_text, "summary")
        for labels, latencies in versions:
            summary = latencies.summaries.get(key)
            if summary is not None:
                _add_summary(family, labels, summary, latencies.quantiles)
        yield family
    histogram = Metric(FIRST_RESPONSE, _FIRST_RESPONSE_HELP, "histogram")
    for labels, latencies in versions:
        if latencies.histogram is not None:
            _add_histogram(histogram, labels, latencies.histogram)
    yield histogram


def _add_summary(
    family: Metric,
    labels: dict[str, str],
    summary: WindowedQuantiles,
    quantiles: tuple[float, ...],
) -> None:
    name = family.name
    family.add_sample(f"{name}_count", labels, summary.count)
    family.add_sample(f"{name}_sum", labels, summary.total)
    for q, value in zip(quantiles, summary.quantiles(quantiles), strict=True):
        family.add_sample(name, {**labels, "quantile": _bound_text(q)}, value)


def _add_histogram(family: Metric, labels: dict[str, str], histogram: _Histogram) -> None:
    name = family.name
    family.add_sample(f"{name}_count", labels, histogram.count)
    family.add_sample(f"{name}_sum", labels, histogram.total)
    cumulative = 0
    for bound, count in zip((*histogram.bounds, None), histogram.counts, strict=True):
        cumulative += count
        le = "+Inf" if bound is None else _bound_text(bound)
        family.add_sample(f"{name}_bucket", {**labels, "le": le}, cumulative)


def _bound_text(value: float) -> str:
    """A bucket bound or quantile as Prometheus clients print it: ``0.5``, ``100``, ``-1``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
