"""Triton-compatible Prometheus metrics, computed at scrape time from the service's statistics.

Nothing is added to the inference path: :class:`ServiceCollector` (a ``prometheus_client``
collector on a private registry) reads the per-version statistics, queue lengths, instances and
the input arena when ``/metrics`` is scraped. :meth:`MetricsExporter.render` returns the exposition
text; the composition root hands it to the metrics frontend. See docs/metrics.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from shoal.supervisor.extensions._metrics_cpu import CpuProbe
from shoal.supervisor.extensions._metrics_families import (
    ArenaSample,
    InstanceSample,
    ModelSample,
    render_text,
    shoal_families,
    triton_families,
)
from shoal.supervisor.extensions._metrics_rss import RssProbe
from shoal.supervisor.extensions.latency_families import VersionLatencies, latency_families
from shoal.supervisor.memory.cuda_pools import CudaPools
from shoal.supervisor.models.version import ModelVersion
from shoal.supervisor.service import InferenceService

__all__ = ["MetricsExporter", "ServiceCollector"]


class ServiceCollector:
    """Yields Triton's per-model families and shoal's instance and arena families."""

    def __init__(
        self,
        service: InferenceService,
        rss: RssProbe,
        cpu: CpuProbe | None = None,
        latencies: bool = True,
    ) -> None:
        self._service = service
        self._rss = rss
        self._cpu = cpu
        self._latencies = latencies

    def collect(self) -> Iterator[Metric]:
        versions = self._ready_versions()
        yield from triton_families(self._models(versions), self._latencies)
        yield from latency_families(_latencies(versions))
        yield from shoal_families(self._instances(versions), self._arenas())
        yield from _stage_families(versions)
        yield from _cuda_pool_families(self._service.directory.cuda)
        yield from self._service.custom_metrics.families()
        if self._cpu is not None:
            yield from self._cpu.families()

    def _ready_versions(self) -> dict[tuple[str, str], ModelVersion]:
        versions = self._service.repository.versions()
        return {(mv.name, str(mv.version)): mv for mv in versions if mv.ready}

    def _models(self, versions: dict[tuple[str, str], ModelVersion]) -> list[ModelSample]:
        samples = []
        for stats in self._service.model_statistics():
            mv = versions.get((stats.name, stats.version))
            samples.append(ModelSample(stats, _pending(mv), self._cached(mv)))
        return samples

    def _cached(self, mv: ModelVersion | None) -> bool:
        """Whether the version's responses go through the response cache."""
        return self._service.cache is not None and mv is not None and mv.config.response_cache

    def _arenas(self) -> list[ArenaSample]:
        arena = self._service.input_arena
        return [ArenaSample("input", arena.used_bytes, arena.capacity_bytes)]

    def _instances(self, versions: dict[tuple[str, str], ModelVersion]) -> list[InstanceSample]:
        samples = []
        pids = []
        for (name, version), mv in sorted(versions.items()):
            for instance in mv.instances:
                pid, rss = instance.pid, None
                if pid > 0:
                    pids.append(pid)
                    rss = self._rss.rss_bytes(pid)
                samples.append(
                    InstanceSample(
                        name, version, instance.name, instance.ready, instance.restarts, rss
                    )
                )
        self._rss.keep_only(pids)
        return samples


def _latencies(
    versions: dict[tuple[str, str], ModelVersion],
) -> list[tuple[dict[str, str], VersionLatencies]]:
    """The versions' summaries and histograms (``--metrics-config``), with their labels."""
    return [
        ({"model": name, "version": version}, mv.stats.latencies)
        for (name, version), mv in sorted(versions.items())
        if mv.stats.latencies is not None
    ]


def _pending(mv: ModelVersion | None) -> int:
    """Requests waiting in the version's scheduler."""
    scheduler = mv.scheduler if mv is not None else None
    return scheduler.pending if scheduler is not None else 0


def _cuda_pool_families(pools: CudaPools) -> Iterator[Metric]:
    """The CUDA pools GPU tensors pass through (only once a GPU tensor made one)."""
    devices = pools.devices()
    if not devices:
        return
    used = Metric("shoal_cuda_pool_used_bytes", "Bytes of CUDA pool blocks in use", "gauge")
    held = Metric(
        "shoal_cuda_pool_capacity_bytes", "Device memory the CUDA pool holds now", "gauge"
    )
    blocks = Metric(
        "shoal_cuda_pool_allocations",
        "Blocks handed out by the CUDA pool (one per GPU tensor copied into it)",
        "counter",
    )
    for device, pool in devices.items():
        labels = {"device": str(device)}
        used.add_sample("shoal_cuda_pool_used_bytes", labels, pool.used_bytes)
        held.add_sample("shoal_cuda_pool_capacity_bytes", labels, pool.capacity)
        blocks.add_sample(
            "shoal_cuda_pool_allocations_total", labels, pools.allocations.get(device, 0)
        )
    yield used
    yield held
    yield blocks


def _stage_families(versions: dict[tuple[str, str], ModelVersion]) -> Iterator[Metric]:
    """``--trace-overhead``: time per request in each pipeline stage (docs/perf.md)."""
    traced = [(key, mv.stats.overhead) for key, mv in sorted(versions.items()) if mv.stats.overhead]
    if not traced:
        return
    total = Metric(
        "shoal_request_stage_duration_us",
        "Cumulative time requests spent in each stage of shoal's pipeline (--trace-overhead)",
        "counter",
    )
    count = Metric(
        "shoal_request_stage_count", "Requests timed in each stage (--trace-overhead)", "counter"
    )
    for (name, version), overhead in traced:
        assert overhead is not None
        for stage, (n, ns) in sorted(overhead.items()):
            labels = {"model": name, "version": version, "stage": stage}
            total.add_sample("shoal_request_stage_duration_us", labels, ns // 1000)
            count.add_sample("shoal_request_stage_count", labels, n)
    yield total
    yield count


class MetricsExporter:
    """A private registry holding one :class:`ServiceCollector`.

    ``interval_ms`` (``--metrics-interval-ms``) is how long a stub's RSS reading and the host's
    CPU reading are reused; every other value is read afresh on each scrape. ``cpu_metrics``
    (``--allow-cpu-metrics``) adds Triton's host CPU families; ``counter_latencies``
    (``--metrics-config``) Triton's duration counters.
    """

    def __init__(
        self,
        service: InferenceService,
        *,
        interval_ms: int = 2000,
        cpu_metrics: bool = True,
        counter_latencies: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        interval_s = interval_ms / 1000
        cpu = CpuProbe(interval_s, clock=clock) if cpu_metrics else None
        rss = RssProbe(interval_s, clock=clock)
        self.registry.register(ServiceCollector(service, rss, cpu, counter_latencies))

    def render(self) -> bytes:
        """The ``/metrics`` body (Prometheus text format 0.0.4); call it on the service's loop."""
        return render_text(self.registry.collect())
