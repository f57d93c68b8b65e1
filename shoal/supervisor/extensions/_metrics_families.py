"""Metric families built from plain samples, and their Prometheus text exposition.

Pure functions: nothing here reads the service or the file system, so the unit tests build the
samples by hand. The names, HELP texts, types and labels of the ``nv_*`` families are Triton's
(``triton-inference-server/core``, ``metrics.cc`` and ``metric_model_reporter.cc``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from shoal.core.types import ModelStatistics, StatDuration

#: Triton's failure reasons (``FailureReason`` in triton-inference-server/core), in the order
#: Triton prints them; every version gets all four series.
FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")


@dataclass(frozen=True)
class ModelSample:
    """One loaded model version: its statistics and the requests waiting in its queue."""

    stats: ModelStatistics
    pending: int = 0
    #: The version uses the response cache: it gets Triton's ``nv_cache_*_per_model`` series.
    cached: bool = False


@dataclass(frozen=True)
class InstanceSample:
    """One model instance; ``rss_bytes`` is None while it has no live stub process."""

    model: str
    version: str
    instance: str
    ready: bool
    restarts: int
    rss_bytes: int | None = None


@dataclass(frozen=True)
class ArenaSample:
    """A shared-memory arena the supervisor owns (``name``: ``input``)."""

    name: str
    used_bytes: int
    capacity_bytes: int


def _us(duration: StatDuration) -> int:
    return duration.ns // 1000


_Reading = Callable[[ModelStatistics], int]

#: (name, HELP, reading) of one of Triton's per-model counters.
_Spec = tuple[str, str, _Reading]

_SUCCESS: _Spec = (
    "nv_inference_request_success",
    "Number of successful inference requests, all batch sizes",
    lambda s: s.inference_stats.success.count,
)
_COUNTS: tuple[_Spec, ...] = (
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
)
_DURATIONS: tuple[_Spec, ...] = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: _us(s.inference_stats.success),
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: _us(s.inference_stats.queue),
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: _us(s.inference_stats.compute_input),
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: _us(s.inference_stats.compute_infer),
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
        lambda s: _us(s.inference_stats.compute_output),
    ),
)
#: Triton's per-model response cache counters (only for versions that use the cache).
_CACHE: tuple[_Spec, ...] = (
    (
        "nv_cache_num_hits_per_model",
        "Number of cache hits per model",
        lambda s: s.inference_stats.cache_hit.count,
    ),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: _us(s.inference_stats.cache_hit),
    ),
    (
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model",
        lambda s: s.inference_stats.cache_miss.count,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: _us(s.inference_stats.cache_miss),
    ),
)
_PENDING_HELP = "Instantaneous number of pending requests awaiting execution per-model."
_FAILURE_HELP = "Number of failed inference requests, all batch sizes"


def _labels(stats: ModelStatistics) -> dict[str, str]:
    return {"model": stats.name, "version": stats.version}


def _counter(spec: _Spec, models: Sequence[ModelSample]) -> Metric:
    name, help_text, reading = spec
    family = Metric(name, help_text, "counter")
    for model in models:
        family.add_sample(name, _labels(model.stats), reading(model.stats))
    return family


def _failures(models: Sequence[ModelSample]) -> Metric:
    name = "nv_inference_request_failure"
    family = Metric(name, _FAILURE_HELP, "counter")
    for model in models:
        _add_failures(family, model)
    return family


def _add_failures(family: Metric, model: ModelSample) -> None:
    """One sample per failure reason of the model version (0 for those it never had)."""
    counts = model.stats.failure_reasons
    for reason in FAILURE_REASONS:
        labels = {**_labels(model.stats), "reason": reason}
        family.add_sample(family.name, labels, counts.get(reason, 0))


def _pending(models: Sequence[ModelSample]) -> Metric:
    name = "nv_inference_pending_request_count"
    family = Metric(name, _PENDING_HELP, "gauge")
    for model in models:
        family.add_sample(name, _labels(model.stats), model.pending)
    return family


def triton_families(models: Sequence[ModelSample], latencies: bool = True) -> Iterator[Metric]:
    """Triton's inference request metrics, in Triton's order, one sample per model version;
    ``latencies`` false (``--metrics-config counter_latencies=false``) leaves out the
    duration counters, as Triton does."""
    yield _counter(_SUCCESS, models)
    yield _failures(models)
    for spec in (*_COUNTS, *(_DURATIONS if latencies else ())):
        yield _counter(spec, models)
    cached = [model for model in models if model.cached]
    for spec in _CACHE:
        yield _counter(spec, cached)
    yield _pending(models)


def _instance_labels(instance: InstanceSample) -> dict[str, str]:
    return {"model": instance.model, "version": instance.version, "instance": instance.instance}


def shoal_families(
    instances: Sequence[InstanceSample], arenas: Sequence[ArenaSample]
) -> Iterator[Metric]:
    """shoal's own metrics: per instance (stub process) and per supervisor-owned arena."""
    restarts = Metric(
        "shoal_instance_restarts_total",
        "Number of restart attempts of the instance's stub process after it died",
        "counter",
    )
    ready = Metric(
        "shoal_instance_ready",
        "Whether the instance's stub is ready for work (1) or not (0)",
        "gauge",
    )
    rss = Metric(
        "shoal_stub_rss_bytes",
        "Resident set size of the instance's stub process, in bytes",
        "gauge",
    )
    for instance in instances:
        labels = _instance_labels(instance)
        restarts.add_sample(restarts.name, labels, instance.restarts)
        ready.add_sample(ready.name, labels, int(instance.ready))
        if instance.rss_bytes is not None:
            rss.add_sample(rss.name, labels, instance.rss_bytes)
    yield from (restarts, ready, rss)
    used = Metric("shoal_arena_used_bytes", "Bytes allocated in a shared-memory arena", "gauge")
    capacity = Metric(
        "shoal_arena_capacity_bytes", "Bytes mapped by a shared-memory arena's segments", "gauge"
    )
    for arena in arenas:
        used.add_sample(used.name, {"arena": arena.name}, arena.used_bytes)
        capacity.add_sample(capacity.name, {"arena": arena.name}, arena.capacity_bytes)
    yield from (used, capacity)


# --- text exposition -----------------------------------------------------------------------------

_TYPE_NAMES = {"unknown": "untyped"}


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


#: A histogram's and a summary's own labels, printed after the others (as Triton does:
#: clients match ``{model="m",version="1",le="100"}``).
_LAST_LABELS = ("le", "quantile")


def _label_order(item: tuple[str, str]) -> tuple[bool, str]:
    return item[0] in _LAST_LABELS, item[0]


#: Label sets already formatted: the same ones come back at every scrape (each version's, with
#: each quantile and bound), and formatting them anew was most of a scrape of many versions.
_FORMATTED: dict[tuple[tuple[str, str], ...], str] = {}
#: Past this many, the cache starts over (versions come and go; labels can be anything).
_FORMATTED_MAX = 200_000


def _format_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    key = tuple(labels.items())
    text = _FORMATTED.get(key)
    if text is None:
        ordered = sorted(key, key=_label_order)
        text = "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in ordered) + "}"
        if len(_FORMATTED) >= _FORMATTED_MAX:
            _FORMATTED.clear()
        _FORMATTED[key] = text
    return text


def _format_value(value: float) -> str:
    if type(value) is int:  # (most samples: counts and sums)
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render_text(families: Iterable[Metric]) -> bytes:
    """The Prometheus text format (0.0.4), with every name exactly as the family gives it.

    ``prometheus_client.generate_latest`` would print ``# TYPE nv_inference_request_success_total
    counter`` for a counter family, which is not what Triton prints; this renderer writes the
    family and sample names verbatim. Families without samples are left out. Labels are sorted,
    integral values are printed without a decimal point, both as Triton does.
    """
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        lines.append(f"# HELP {family.name} {_escape_help(family.documentation)}")
        lines.append(f"# TYPE {family.name} {_TYPE_NAMES.get(family.type, family.type)}")
        for sample in family.samples:
            labels = _format_labels(sample.labels)
            lines.append(f"{sample.name}{labels} {_format_value(sample.value)}")
    return "".join(line + "\n" for line in lines).encode("utf-8")
