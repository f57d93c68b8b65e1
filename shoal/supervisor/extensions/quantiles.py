"""A bounded quantile estimator over a sliding time window, for Triton's latency summaries.

Triton's ``nv_inference_*_summary_us`` families are prometheus-cpp Summaries: CKMS targeted
quantiles over a window of 60 s kept as 5 age buckets, whose memory grows with the number of
observations. Here the observations (whole microseconds, as Triton observes them) are counted in
log-linear buckets instead: every value below 256 has its own bucket, and above it each power of
two is cut into 128 buckets, so a bucket spans at most 1/128 of its lower bound. The bucket
count is bounded by the range of the values (at most 7,296 for 63-bit values, about 4,000 for
latencies from 1 us to a day), never by how many were observed. Observing is O(1): an index from
the value's bit length and a dict update.

Error bound: the value reported for quantile ``q`` is the middle of the bucket holding the
observation of rank ``ceil(q * n)`` among the ``n`` observations of the window, so it is within
1/256 (0.4 %) of that observation's value, and exact below 256 us. This is a bound on the value,
not on the rank as Triton's ``summary_quantiles`` errors are (docs/decisions.md, "Latency
summaries"): it holds for every quantile at once, whatever the ``<error>`` asked.

The window: :data:`AGE_BUCKETS` sub-windows of ``MAX_AGE_S / AGE_BUCKETS`` each; a quantile is
read over the sub-windows younger than ``MAX_AGE_S`` (48 to 60 s of observations, as
prometheus-cpp's rotating buckets give), NaN when none has an observation.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Sequence

__all__ = ["AGE_BUCKETS", "MAX_AGE_S", "SUB_BUCKETS", "WindowedQuantiles", "bucket_bounds"]

#: prometheus-cpp's Summary defaults, which Triton keeps (it sets neither).
MAX_AGE_S = 60.0
AGE_BUCKETS = 5
#: Buckets per power of two above the exact range (values below ``2 * SUB_BUCKETS`` are exact).
SUB_BUCKETS = 128
_SUB_BITS = SUB_BUCKETS.bit_length() - 1
_EXACT = 2 * SUB_BUCKETS
#: A value of bit length ``b`` (above the exact range) is shifted right by ``b - _SHIFT_BASE``.
_SHIFT_BASE = _SUB_BITS + 1


def bucket_index(value: int) -> int:
    """The bucket of a non-negative integer (negative values count as 0)."""
    if value < _EXACT:
        return value if value > 0 else 0
    shift = value.bit_length() - _SHIFT_BASE
    return (shift << _SUB_BITS) + (value >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The smallest and largest value of bucket ``index``."""
    if index < _EXACT:
        return index, index
    shift = index // SUB_BUCKETS - 1
    mantissa = index - SUB_BUCKETS * shift
    return mantissa << shift, ((mantissa + 1) << shift) - 1


def _middle(index: int) -> int:
    low, high = bucket_bounds(index)
    return (low + high) // 2


class WindowedQuantiles:
    """Counts of the values observed in the last ``max_age_s`` seconds, by bucket; ``count``
    and ``total`` of every value observed since it was made (a summary's ``_count`` and
    ``_sum``)."""

    def __init__(
        self,
        max_age_s: float = MAX_AGE_S,
        age_buckets: int = AGE_BUCKETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._span = max_age_s / age_buckets
        #: The sub-windows, oldest first; each a bucket -> count map.
        self._windows: list[dict[int, int]] = [{} for _ in range(age_buckets)]
        self._newest = self._windows[-1]
        #: When the newest sub-window (the last) ends: observations after it rotate.
        self._ends = clock() + self._span
        #: The sub-windows' counts added up, kept as they change: a scrape reads them without
        #: merging (1,000 versions' summaries merged per scrape took seconds of the loop).
        self._merged: dict[int, int] = {}
        #: The buckets of ``_merged`` in order (one is added or removed as it fills or empties).
        self._order: list[int] = []
        self._in_window = 0
        #: The last quantiles read and what was asked, until the next observation or rotation.
        self._answers: tuple[tuple[float, ...], list[float]] | None = None
        self.count = 0
        self.total = 0

    def observe(self, value: int, now: float) -> None:
        """Count ``value`` at ``now`` (the clock's reading: one per request, for all of its
        summaries). Per request and per summary: kept to a few operations, inlined."""
        self.count += 1
        self.total += value
        if now >= self._ends:
            self._rotate(now)
        if value < _EXACT:
            index = value if value > 0 else 0
        else:
            shift = value.bit_length() - _SHIFT_BASE
            index = (shift << _SUB_BITS) + (value >> shift)
        counts = self._newest
        counts[index] = counts.get(index, 0) + 1
        merged = self._merged
        before = merged.get(index, 0)
        if not before:
            bisect.insort(self._order, index)
        merged[index] = before + 1
        self._in_window += 1
        self._answers = None

    def _rotate(self, now: float) -> None:
        """Drop the sub-windows older than the window, and start a new newest one."""
        windows = self._windows
        steps = min(len(windows), int((now - self._ends) // self._span) + 1)
        merged = self._merged
        for _ in range(steps):
            for index, count in windows.pop(0).items():
                left = merged[index] - count
                if left:
                    merged[index] = left
                else:
                    del merged[index]
                    order = self._order
                    del order[bisect.bisect_left(order, index)]
                self._in_window -= count
            windows.append({})
        self._answers = None
        self._newest = windows[-1]
        self._ends += steps * self._span
        if now >= self._ends:  # idle longer than the window: everything was dropped
            self._ends = now + self._span

    def quantiles(self, wanted: Sequence[float]) -> list[float]:
        """The estimate of each quantile in ``wanted`` (NaN for each if nothing was observed
        in the window)."""
        now = self._clock()
        if now >= self._ends:
            self._rotate(now)
        asked = tuple(wanted)
        answers = self._answers
        if answers is not None and answers[0] == asked:
            return list(answers[1])
        computed = self._computed(asked)
        self._answers = (asked, computed)
        return list(computed)

    def _computed(self, wanted: tuple[float, ...]) -> list[float]:
        total = self._in_window
        if total == 0:
            return [math.nan] * len(wanted)
        # Running counts by bucket, in bucket order; each quantile's bucket found by bisection
        # (both in C: a summary holds hundreds of buckets, and a scrape reads thousands).
        indexes = self._order
        running = list(itertools.accumulate(map(self._merged.__getitem__, indexes)))
        answers = []
        for q in wanted:
            rank = max(1, math.ceil(min(max(q, 0.0), 1.0) * total))
            answers.append(float(_middle(indexes[bisect.bisect_left(running, rank)])))
        return answers

    def bucket_count(self) -> int:
        """How many buckets the window holds now (its memory, for the tests)."""
        return sum(len(counts) for counts in self._windows)
