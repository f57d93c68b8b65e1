"""Per model-version statistics with the exact shape of Triton's statistics extension.

Where each duration starts and stops is defined in docs/statistics.md. The requests frontend
workers send straight to stubs are counted by the workers in shared memory
(``ipc/stat_counters.py``) and added here when a snapshot is taken.
"""

from __future__ import annotations

import time

from shoal.core.types import (
    BatchStatistics,
    InferStatistics,
    MemoryUsage,
    ModelStatistics,
    ResponseStatistics,
    StatDuration,
)
from shoal.ipc import stat_counters as sc
from shoal.supervisor.extensions.latency_families import VersionLatencies

#: (compute_input, compute_infer, compute_output) nanoseconds of one execution.
ComputeNs = tuple[int, int, int]
#: Triton's failure reasons of the outcomes a worker counts (``stat_counters``: 1, 2, 3).
REASONS = ("BACKEND", "CANCELED", "OTHER")


class StatsRecorder:
    """Accumulates one model version's statistics; ``snapshot`` returns a consistent copy."""

    def __init__(self, name: str, version: int) -> None:
        self._stats = ModelStatistics(name=name, version=str(version))
        self._batches: dict[int, BatchStatistics] = {}
        #: ``--trace-overhead``: stage name -> [count, total ns] (None: not traced).
        self.overhead: dict[str, list[int]] | None = None
        #: The workers' rows counting this version's direct requests: (rows, row, generation).
        self._direct: list[tuple[sc.CounterRows, int, int]] = []
        #: ``--metrics-config summary_latencies`` / ``histogram_latencies``: the version's
        #: summaries and histogram, fed the durations recorded here (None: both off). Its
        #: requests then take the core's path, never a worker's direct one, which only counts.
        self.latencies: VersionLatencies | None = None

    def add_direct(self, rows: sc.CounterRows, row: int, generation: int) -> None:
        """A worker counts this version's direct requests in ``row`` of ``rows``."""
        self._direct.append((rows, row, generation))

    def drop_direct(self, rows: sc.CounterRows, row: int) -> None:
        """The core takes ``row`` back: what it counted is kept here."""
        for source in [s for s in self._direct if s[0] is rows and s[1] == row]:
            self._direct.remove(source)
            fields = rows.read(row)
            if fields[sc.GENERATION] == source[2]:
                _fold(self._stats, self._batches, fields)

    def stage(self, name: str, ns: int) -> None:
        """Time one request spent in one stage of shoal's pipeline (docs/perf.md)."""
        if self.overhead is None:
            return
        entry = self.overhead.get(name)
        if entry is None:
            entry = self.overhead[name] = [0, 0]
        entry[0] += 1
        entry[1] += max(0, ns)

    def answered_stages(
        self, queue_ns: int, compute: ComputeNs, complete_ns: int, total_ns: int
    ) -> None:
        """The traced stages of one answered request: its queue time (until the Execute was
        written; the wait in the stub's ring is ipc_in's), the stub's three, from the Result
        read to the response, and the whole."""
        self.stage("queue", queue_ns)
        self.stage("compute_input", compute[0])
        self.stage("compute_infer", compute[1])
        self.stage("compute_output", compute[2])
        self.stage("complete", complete_ns)
        self.stage("core_total", total_ns)

    def execution(self, batch_size: int, compute: ComputeNs) -> None:
        """One call of the model's execute over ``batch_size`` inferences."""
        self._stats.execution_count += 1
        batch = self._batches.get(batch_size)
        if batch is None:
            batch = self._batches[batch_size] = BatchStatistics(batch_size)
        batch.compute_input.add(compute[0])
        batch.compute_infer.add(compute[1])
        batch.compute_output.add(compute[2])

    def success(self, batch_size: int, total_ns: int, queue_ns: int, compute: ComputeNs) -> None:
        """A request answered without error."""
        stats = self._stats
        stats.inference_count += batch_size
        stats.last_inference = time.time_ns() // 1_000_000
        infer = stats.inference_stats
        infer.success.add(total_ns)
        infer.queue.add(queue_ns)
        infer.compute_input.add(compute[0])
        infer.compute_infer.add(compute[1])
        infer.compute_output.add(compute[2])
        latencies = self.latencies
        if latencies is not None:
            latencies.success(total_ns, queue_ns, compute)

    def first_response(self, ns: int) -> None:
        """A request's first response went out ``ns`` after the request arrived (the
        first-response histogram's observation; a response of every request, success or not)."""
        latencies = self.latencies
        if latencies is not None:
            latencies.first_response(ns)

    def cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache: a success with its queue time (until
        the lookup) and the lookup's time; no inference, no execution (Triton's accounting)."""
        infer = self._stats.inference_stats
        infer.success.add(total_ns)
        infer.queue.add(queue_ns)
        infer.cache_hit.add(hit_ns)
        self._stats.last_inference = time.time_ns() // 1_000_000
        latencies = self.latencies
        if latencies is not None:
            latencies.cache_hit(queue_ns, hit_ns)
            latencies.first_response(total_ns)

    def cache_miss(self, miss_ns: int) -> None:
        """A request not in the cache ran and was inserted: the lookup and insertion time
        (inside its request duration, as in Triton)."""
        self._stats.inference_stats.cache_miss.add(miss_ns)
        latencies = self.latencies
        if latencies is not None:
            latencies.cache_miss(miss_ns)

    def response(
        self, index: int, outcome: str, since_previous_ns: int, since_start_ns: int
    ) -> None:
        """One response of a decoupled model: ``outcome`` is "success", "fail" or "empty"."""
        stats = self._stats.response_stats.get(str(index))
        if stats is None:
            stats = self._stats.response_stats[str(index)] = ResponseStatistics()
        if outcome == "fail":
            stats.fail.add(since_start_ns)
            return
        stats.compute_infer.add(since_previous_ns)
        stats.compute_output.add(0)
        if outcome == "empty":
            stats.empty_response.add(since_start_ns)
        else:
            stats.success.add(since_start_ns)

    def failure(self, total_ns: int, reason: str = "OTHER") -> None:
        """A request that reached the model's queue and failed; ``reason`` is Triton's failure
        reason (``REJECTED``, ``CANCELED``, ``BACKEND`` or ``OTHER``)."""
        self._stats.inference_stats.fail.add(total_ns)
        reasons = self._stats.failure_reasons
        reasons[reason] = reasons.get(reason, 0) + 1
        self._stats.last_inference = time.time_ns() // 1_000_000
        latencies = self.latencies
        if latencies is not None and latencies.one_response:  # its error is its response
            latencies.first_response(total_ns)

    def snapshot(self) -> ModelStatistics:
        stats = _copied(self._stats)
        batches = {size: _copied_batch(b) for size, b in self._batches.items()}
        for rows, row, generation in self._direct:
            fields = rows.read(row)
            if fields[sc.GENERATION] == generation:
                _fold(stats, batches, fields)
        stats.batch_stats = [b for _, b in sorted(batches.items())]
        return stats


def _copied(stats: ModelStatistics) -> ModelStatistics:
    """A copy of ``stats`` that later requests do not change. Written out: ``copy.deepcopy``
    took 2.6 ms a version, 2.6 s of the core's loop per scrape of 1,000 versions
    (benchmarks/metrics_scrape.py)."""
    infer = stats.inference_stats
    return ModelStatistics(
        stats.name,
        stats.version,
        stats.last_inference,
        stats.inference_count,
        stats.execution_count,
        InferStatistics(
            _dup(infer.success),
            _dup(infer.fail),
            _dup(infer.queue),
            _dup(infer.compute_input),
            _dup(infer.compute_infer),
            _dup(infer.compute_output),
            _dup(infer.cache_hit),
            _dup(infer.cache_miss),
        ),
        [_copied_batch(b) for b in stats.batch_stats],
        {index: _copied_response(r) for index, r in stats.response_stats.items()},
        [MemoryUsage(m.type, m.id, m.byte_size) for m in stats.memory_usage],
        dict(stats.failure_reasons),
    )


def _copied_batch(batch: BatchStatistics) -> BatchStatistics:
    return BatchStatistics(
        batch.batch_size,
        _dup(batch.compute_input),
        _dup(batch.compute_infer),
        _dup(batch.compute_output),
    )


def _copied_response(response: ResponseStatistics) -> ResponseStatistics:
    return ResponseStatistics(
        _dup(response.compute_infer),
        _dup(response.compute_output),
        _dup(response.success),
        _dup(response.fail),
        _dup(response.empty_response),
        _dup(response.cancel),
    )


def _dup(duration: StatDuration) -> StatDuration:
    return StatDuration(duration.count, duration.ns)


def _fold(
    stats: ModelStatistics, batches: dict[int, BatchStatistics], fields: tuple[int, ...]
) -> None:
    """Add a worker's row (``stat_counters``) to ``stats``: what ``success``, ``failure`` and
    ``execution`` (of one request) would have added for each request it counted."""
    successes = fields[sc.SUCCESSES]
    infer = stats.inference_stats
    stats.inference_count += successes
    _add(infer.success, successes, fields[sc.SUCCESS_NS])
    _add(infer.queue, successes, fields[sc.QUEUE_NS])
    _add(infer.compute_input, successes, fields[sc.SUCCESS_INPUT_NS])
    _add(infer.compute_infer, successes, fields[sc.SUCCESS_INFER_NS])
    _add(infer.compute_output, successes, fields[sc.SUCCESS_OUTPUT_NS])
    failures = 0
    for outcome, reason in enumerate(REASONS, 1):
        count = fields[sc.FAILURES + outcome]
        if count:
            stats.failure_reasons[reason] = stats.failure_reasons.get(reason, 0) + count
            failures += count
    _add(infer.fail, failures, fields[sc.FAILURE_NS])
    executions = fields[sc.EXECUTIONS]
    if executions:
        stats.execution_count += executions
        batch = batches.get(1)
        if batch is None:
            batch = batches[1] = BatchStatistics(1)
        _add(batch.compute_input, executions, fields[sc.EXECUTION_INPUT_NS])
        _add(batch.compute_infer, executions, fields[sc.EXECUTION_INFER_NS])
        _add(batch.compute_output, executions, fields[sc.EXECUTION_OUTPUT_NS])
    stats.last_inference = max(stats.last_inference, fields[sc.LAST_INFERENCE_MS])


def _add(duration: StatDuration, count: int, ns: int) -> None:
    duration.count += count
    duration.ns += ns
