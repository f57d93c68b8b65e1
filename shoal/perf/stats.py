"""What one load cell measured, and the statistics computed from its latencies."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: The latency percentiles every cell reports.
PERCENTILES = (50, 90, 99)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``ordered`` (sorted ascending); NaN when empty."""
    if not 0 < q <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {q}")
    if not ordered:
        return math.nan
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


@dataclass(frozen=True)
class LatencySummary:
    """Latencies of the requests that started and finished inside the measured window, in ms."""

    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, latencies_ns: Sequence[int]) -> LatencySummary:
        ordered = sorted(ns / 1e6 for ns in latencies_ns)
        if not ordered:
            return cls(*(math.nan,) * 6)
        p50, p90, p99 = (percentile(ordered, q) for q in PERCENTILES)
        mean = math.fsum(ordered) / len(ordered)
        return cls(p50, p90, p99, mean, ordered[0], ordered[-1])


@dataclass(frozen=True)
class CellResult:
    """One concurrency level against one model: what the load generator prints and writes."""

    model: str
    protocol: str
    client: str
    concurrency: int
    duration_s: float
    requests: int
    errors: int
    responses: int
    latency_ms: LatencySummary
    client_cpu_percent: float
    payload_bytes: int = 0
    error_samples: tuple[str, ...] = field(default=())

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def responses_per_s(self) -> float:
        """Responses per second: more than ``throughput`` for decoupled (streaming) models."""
        return self.responses / self.duration_s if self.duration_s > 0 else 0.0


def summarize(
    *,
    model: str,
    protocol: str,
    client: str,
    concurrency: int,
    duration_s: float,
    latencies_ns: Sequence[int],
    errors: int,
    responses: int | None = None,
    cpu_seconds: float = 0.0,
    payload_bytes: int = 0,
    error_samples: Sequence[str] = (),
) -> CellResult:
    """Fold a cell's raw measurements into a ``CellResult``.

    ``cpu_seconds`` is the client's CPU time over the window; it is reported as a percentage of
    one core. ``responses`` defaults to one per successful request.
    """
    return CellResult(
        model=model,
        protocol=protocol,
        client=client,
        concurrency=concurrency,
        duration_s=duration_s,
        requests=len(latencies_ns),
        errors=errors,
        responses=len(latencies_ns) if responses is None else responses,
        latency_ms=LatencySummary.of(latencies_ns),
        client_cpu_percent=100.0 * cpu_seconds / duration_s if duration_s > 0 else 0.0,
        payload_bytes=payload_bytes,
        error_samples=tuple(error_samples),
    )
