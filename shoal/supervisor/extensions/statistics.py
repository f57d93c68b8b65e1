"""Per model-version statistics with the exact shape of Triton's statistics extension.

Where each duration starts and stops is defined in docs/statistics.md.
"""

from __future__ import annotations

import copy
import time

from shoal.core.types import BatchStatistics, ModelStatistics, ResponseStatistics

#: (compute_input, compute_infer, compute_output) nanoseconds of one execution.
ComputeNs = tuple[int, int, int]


class StatsRecorder:
    """Accumulates one model version's statistics; ``snapshot`` returns a consistent copy."""

    def __init__(self, name: str, version: int) -> None:
        self._stats = ModelStatistics(name=name, version=str(version))
        self._batches: dict[int, BatchStatistics] = {}
        #: ``--trace-overhead``: stage name -> [count, total ns] (None: not traced).
        self.overhead: dict[str, list[int]] | None = None

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

    def cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache: a success with its queue time (until
        the lookup) and the lookup's time; no inference, no execution (Triton's accounting)."""
        infer = self._stats.inference_stats
        infer.success.add(total_ns)
        infer.queue.add(queue_ns)
        infer.cache_hit.add(hit_ns)
        self._stats.last_inference = time.time_ns() // 1_000_000

    def cache_miss(self, miss_ns: int) -> None:
        """A request not in the cache ran and was inserted: the lookup and insertion time
        (inside its request duration, as in Triton)."""
        self._stats.inference_stats.cache_miss.add(miss_ns)

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

    def snapshot(self) -> ModelStatistics:
        stats = copy.deepcopy(self._stats)
        stats.batch_stats = [copy.deepcopy(b) for _, b in sorted(self._batches.items())]
        return stats
