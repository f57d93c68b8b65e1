"""The latency summaries' quantile estimator: its error bound, its bounded memory and its
sliding window."""

from __future__ import annotations

import math
import random

import pytest

from shoal.supervisor.extensions.quantiles import (
    AGE_BUCKETS,
    MAX_AGE_S,
    WindowedQuantiles,
    bucket_bounds,
    bucket_index,
)

pytestmark = pytest.mark.timeout(120)

TRITON_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _exact(values: list[int], q: float) -> int:
    """The observation of rank ceil(q * n)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_buckets_tile_the_integers_with_a_relative_width_under_1_128() -> None:
    previous_high = -1
    for index in range(bucket_index(2**40) + 1):
        low, high = bucket_bounds(index)
        assert low == previous_high + 1  # no gap, no overlap
        assert high - low + 1 <= max(1, low / 128)
        assert bucket_index(low) == index and bucket_index(high) == index
        previous_high = high


def test_values_below_256_are_exact() -> None:
    clock = FakeClock()
    window = WindowedQuantiles(clock=clock)
    for value in range(1, 201):
        window.observe(value, clock.now)
    assert window.quantiles([0.5, 0.9, 0.99, 1.0]) == [100.0, 180.0, 198.0, 200.0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_quantile_is_within_0_4_percent_of_the_exact_one(seed: int) -> None:
    rng = random.Random(seed)
    # Latencies over six decades, heavy-tailed as real ones are.
    values = [int(rng.lognormvariate(8, 2.5)) for _ in range(50_000)]
    clock = FakeClock()
    window = WindowedQuantiles(clock=clock)
    for value in values:
        window.observe(value, clock.now)
    for q, estimate in zip(TRITON_QUANTILES, window.quantiles(TRITON_QUANTILES), strict=True):
        exact = _exact(values, q)
        assert abs(estimate - exact) <= exact / 256, (q, estimate, exact)


def test_memory_does_not_grow_with_the_number_of_observations() -> None:
    rng = random.Random(7)
    clock = FakeClock()
    window = WindowedQuantiles(clock=clock)
    for _ in range(200_000):
        window.observe(rng.randrange(1, 10**9), clock.now)  # 1 us to 16 minutes
    held = window.bucket_count()
    for _ in range(200_000):
        window.observe(rng.randrange(1, 10**9), clock.now)
    # Bounded by the value range (30 powers of two of 128 buckets), not the count.
    assert held <= 30 * 128 + 256
    assert window.bucket_count() <= 30 * 128 + 256


def test_the_window_forgets_what_is_older_than_a_minute() -> None:
    clock = FakeClock()
    window = WindowedQuantiles(clock=clock)
    assert all(math.isnan(v) for v in window.quantiles([0.5, 0.99]))  # nothing yet
    for _ in range(100):
        window.observe(5000, clock.now)
    clock.now += MAX_AGE_S / AGE_BUCKETS  # the next sub-window
    for _ in range(100):
        window.observe(100, clock.now)
    assert window.quantiles([0.25, 0.75]) == [100.0, pytest.approx(5000, rel=1 / 256)]
    # The first sub-window leaves the window a minute after it began; the second stays.
    clock.now += MAX_AGE_S - MAX_AGE_S / AGE_BUCKETS
    assert window.quantiles([0.25, 0.75]) == [100.0, 100.0]
    clock.now += 10 * MAX_AGE_S  # idle: everything leaves
    assert all(math.isnan(v) for v in window.quantiles([0.5]))
    window.observe(42, clock.now)
    assert window.quantiles([0.5]) == [42.0]


def test_negative_values_count_as_zero() -> None:
    clock = FakeClock()
    window = WindowedQuantiles(clock=clock)
    window.observe(-5, clock.now)
    assert window.quantiles([0.5]) == [0.0]


def _reported(value: int) -> float:
    low, high = bucket_bounds(bucket_index(value))
    return float((low + high) // 2)


@pytest.mark.parametrize("seed", [3, 4])
def test_counts_kept_across_rotations_and_reads_match_the_window(seed: int) -> None:
    """The window's counts are kept as observations come and sub-windows leave, and a read is
    reused until the next change: each read equals one computed from the observations still
    in the window, whatever the order of the quantiles asked."""
    rng = random.Random(seed)
    clock = FakeClock()
    window = WindowedQuantiles(clock=clock)
    span = MAX_AGE_S / AGE_BUCKETS
    seen: list[tuple[float, int]] = []
    wanted = (0.99, 0.5, 0.0, 0.9, 1.0, 0.25)
    for _ in range(40):
        for _ in range(rng.randrange(0, 60)):
            value = int(rng.lognormvariate(7, 2))
            window.observe(value, clock.now)
            seen.append((clock.now, value))
        for _ in range(2):  # the second read is the first one kept
            got = window.quantiles(wanted)
            # A sub-window starting at `start` is read while now < start + MAX_AGE_S.
            starts = 1000.0 + span * ((clock.now - 1000.0) // span) - MAX_AGE_S + span
            values = [v for at, v in seen if at >= starts]
            if not values:
                assert all(math.isnan(v) for v in got)
            else:
                assert got == [_reported(_exact(values, q)) for q in wanted]
        clock.now += rng.choice([0.5, span / 2, span, 2 * span, 4 * span])
