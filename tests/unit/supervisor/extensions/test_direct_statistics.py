"""Direct dispatch's statistics: the rows a worker counts in (``ipc/stat_counters.py``) added
to a version's statistics when read, and bound to versions by the core
(``supervisor/direct_counters.py``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from shoal.core.types import ModelStatistics
from shoal.ipc.stat_counters import (
    BACKEND,
    CANCELED,
    OTHER,
    ROWS,
    SUCCESS,
    CounterRows,
    Tally,
)
from shoal.supervisor.direct_counters import DirectCounters
from shoal.supervisor.extensions.statistics import REASONS, StatsRecorder

pytestmark = pytest.mark.timeout(30)

#: (outcome, executed, total ns, queue ns, compute ns) of the requests counted.
REQUESTS = [
    (SUCCESS, 1, 1_000, 100, (10, 20, 30)),
    (SUCCESS, 1, 2_000, 200, (11, 21, 31)),
    (BACKEND, 1, 700, 70, (5, 6, 7)),
    (CANCELED, 0, 300, 0, (0, 0, 0)),
    (OTHER, 0, 50, 0, (0, 0, 0)),
    (SUCCESS, 1, 3_000, 300, (12, 22, 32)),
]


@pytest.fixture
def rows() -> Iterator[CounterRows]:
    made = CounterRows.create()
    yield made
    made.close()


def _through_the_core(recorder: StatsRecorder) -> None:
    """What the core recorded per request when workers sent it a frame of counts."""
    for outcome, executed, total_ns, queue_ns, compute in REQUESTS:
        if executed:
            recorder.execution(1, compute)
        if outcome:
            recorder.failure(total_ns, REASONS[outcome - 1])
        else:
            recorder.success(1, total_ns, queue_ns, compute)


def _through_a_row(rows: CounterRows, row: int, generation: int) -> None:
    worker = CounterRows(os.dup(rows.fd))
    try:
        tally = Tally(worker)
        for request in REQUESTS:
            tally.count(row, generation, *request)
        tally.publish()
    finally:
        worker.close()


def _without_time(stats: ModelStatistics) -> ModelStatistics:
    assert stats.last_inference > 0
    return dataclasses.replace(stats, last_inference=0)


def test_a_row_adds_what_the_core_recorded_per_request(rows: CounterRows) -> None:
    expected = StatsRecorder("m", 1)
    _through_the_core(expected)
    recorder = StatsRecorder("m", 1)
    rows.bind(4, 17)
    recorder.add_direct(rows, 4, 17)
    _through_a_row(rows, 4, 17)
    assert _without_time(recorder.snapshot()) == _without_time(expected.snapshot())
    # The core's own requests and the row's add up.
    _through_the_core(recorder)
    both = recorder.snapshot()
    assert both.inference_count == 6 and both.execution_count == 8
    assert both.failure_reasons == {"BACKEND": 2, "CANCELED": 2, "OTHER": 2}
    assert [(b.batch_size, b.compute_infer.count) for b in both.batch_stats] == [(1, 8)]


def test_a_row_bound_to_another_generation_adds_nothing(rows: CounterRows) -> None:
    recorder = StatsRecorder("m", 1)
    rows.bind(0, 3)
    recorder.add_direct(rows, 0, 2)  # the row counts generation 3 now
    _through_a_row(rows, 0, 3)
    stats = recorder.snapshot()
    assert (stats.inference_count, stats.execution_count, stats.batch_stats) == (0, 0, [])


def test_a_row_dropped_keeps_its_counts_in_the_recorder(rows: CounterRows) -> None:
    recorder = StatsRecorder("m", 1)
    rows.bind(1, 5)
    recorder.add_direct(rows, 1, 5)
    _through_a_row(rows, 1, 5)
    before = recorder.snapshot()
    recorder.drop_direct(rows, 1)
    rows.bind(1, 6)  # the row counts another version now
    _through_a_row(rows, 1, 6)
    assert recorder.snapshot() == before


class _Loaded:
    """The loaded versions (``LoadedModels.versions``), as ``DirectCounters`` reads them."""

    def __init__(self) -> None:
        self.list: list[SimpleNamespace] = []

    def versions(self) -> Iterator[SimpleNamespace]:
        return iter(self.list)


def _version(generation: int) -> SimpleNamespace:
    return SimpleNamespace(
        summary=SimpleNamespace(generation=generation), stats=StatsRecorder("m", generation)
    )


@pytest.fixture
def counters() -> Iterator[tuple[DirectCounters, _Loaded]]:
    loaded = _Loaded()
    made = DirectCounters(loaded)  # type: ignore[arg-type]
    yield made, loaded
    made.close()


def test_a_worker_keeps_one_row_per_version_and_its_segment_across_starts(counters) -> None:
    direct, loaded = counters
    first, second = _version(1), _version(2)
    loaded.list += [first, second]
    assert direct.row_for(0, first) is None  # no segment: the worker was never started
    fd = direct.fd(0)
    assert direct.fd(0) == fd  # a restarted worker gets the same segment
    row = direct.row_for(0, first)
    assert row is not None
    assert direct.row_for(0, first) == row
    assert direct.row_for(0, second) not in (None, row)
    direct.fd(1)
    assert direct.row_for(1, first) is not None  # another worker: its own segment
    worker = CounterRows(os.dup(fd))
    try:
        tally = Tally(worker)
        tally.count(row, 1, SUCCESS, 1, 10, 1, (1, 1, 1))
        tally.publish()
    finally:
        worker.close()
    assert first.stats.snapshot().inference_count == 1
    assert second.stats.snapshot().inference_count == 0


def test_the_rows_of_unloaded_versions_are_reused_once_none_is_free(counters) -> None:
    direct, loaded = counters
    fd = direct.fd(0)
    versions = [_version(g) for g in range(1, ROWS + 1)]
    loaded.list += versions
    rows = [direct.row_for(0, mv) for mv in versions]
    assert sorted(rows) == list(range(ROWS))  # type: ignore[type-var]
    worker = CounterRows(os.dup(fd))
    try:
        tally = Tally(worker)
        tally.count(rows[0], 1, SUCCESS, 1, 10, 1, (1, 1, 1))
        tally.publish()
        newer = _version(ROWS + 1)
        loaded.list.append(newer)
        assert direct.row_for(0, newer) is None  # every row counts a loaded version
        loaded.list.remove(versions[0])  # unloaded
        assert direct.row_for(0, newer) == rows[0]
        assert versions[0].stats.snapshot().inference_count == 1  # kept where it was
        tally.count(rows[0], ROWS + 1, SUCCESS, 1, 10, 1, (1, 1, 1))
        tally.count(rows[0], 1, SUCCESS, 1, 10, 1, (1, 1, 1))  # late, for the unloaded one
        tally.publish()
    finally:
        worker.close()
    assert newer.stats.snapshot().inference_count == 1
    assert versions[0].stats.snapshot().inference_count == 1
