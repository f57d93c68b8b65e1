"""Statistics counters in shared memory (``ipc/stat_counters.py``): a frontend worker's rows,
written by the worker, read by the core."""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.ipc import stat_counters as sc
from shoal.ipc.stat_counters import (
    BACKEND,
    CANCELED,
    COPIES,
    FIELDS,
    OTHER,
    ROW_WORDS,
    SUCCESS,
    CounterRows,
    Tally,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).parents[3]


@pytest.fixture
def core() -> Iterator[CounterRows]:
    rows = CounterRows.create()
    yield rows
    rows.close()


@pytest.fixture
def worker(core: CounterRows) -> Iterator[CounterRows]:
    """The worker's own mapping of the core's segment (it gets the fd at its start)."""
    rows = CounterRows(os.dup(core.fd))
    yield rows
    rows.close()


def test_a_new_segment_is_zero_and_a_bound_row_counts_from_zero(core: CounterRows) -> None:
    assert core.read(5) == (0,) * FIELDS
    core.bind(5, 42)
    assert core.read(5) == (42,) + (0,) * (FIELDS - 1)
    assert core.read(4) == (0,) * FIELDS  # rows are apart: 512 bytes each
    assert ROW_WORDS * 8 == 512 and COPIES[1] - COPIES[0] >= FIELDS


def test_a_turn_s_counts_are_read_by_the_core_once_published(
    core: CounterRows, worker: CounterRows
) -> None:
    core.bind(3, 7)
    tally = Tally(worker)
    tally.count(3, 7, SUCCESS, 1, 1000, 100, (10, 20, 30))
    tally.count(3, 7, SUCCESS, 1, 2000, 200, (1, 2, 3))
    tally.count(3, 7, BACKEND, 1, 500, 0, (4, 5, 6))
    tally.count(3, 7, CANCELED, 0, 300)
    tally.count(3, 7, OTHER, 0, 50)
    assert core.read(3)[sc.SUCCESSES] == 0  # not published yet
    tally.publish()
    fields = core.read(3)
    assert fields[sc.GENERATION] == 7
    assert fields[sc.SUCCESSES : sc.SUCCESS_OUTPUT_NS + 1] == (2, 3000, 300, 11, 22, 33)
    assert fields[sc.EXECUTIONS : sc.EXECUTION_OUTPUT_NS + 1] == (3, 15, 27, 39)
    assert fields[sc.FAILURE_NS] == 850
    assert [fields[sc.FAILURES + o] for o in (BACKEND, CANCELED, OTHER)] == [1, 1, 1]
    assert fields[sc.LAST_INFERENCE_MS] > 0
    tally.count(3, 7, SUCCESS, 1, 1000, 100, (10, 20, 30))
    tally.publish()
    assert core.read(3)[sc.SUCCESSES : sc.SUCCESS_NS + 1] == (3, 4000)


def test_a_rebound_row_drops_the_counts_of_the_generation_it_no_longer_counts(
    core: CounterRows, worker: CounterRows
) -> None:
    core.bind(0, 1)
    tally = Tally(worker)
    tally.count(0, 1, SUCCESS, 1, 10, 1, (1, 1, 1))
    tally.publish()
    core.bind(0, 2)  # the version of generation 1 was unloaded; the row counts 2's now
    tally.count(0, 1, SUCCESS, 1, 10, 1, (1, 1, 1))  # a late request of the old version
    tally.count(0, 2, SUCCESS, 1, 20, 2, (2, 2, 2))  # in the same turn as the new one's
    tally.publish()
    fields = core.read(0)
    assert (fields[sc.GENERATION], fields[sc.SUCCESSES], fields[sc.SUCCESS_NS]) == (2, 1, 20)


def test_a_restarted_worker_adds_to_the_counts_of_the_one_before(core: CounterRows) -> None:
    core.bind(9, 3)
    first = CounterRows(os.dup(core.fd))
    tally = Tally(first)
    tally.count(9, 3, SUCCESS, 1, 10, 1, (1, 1, 1))
    tally.publish()
    first.close()  # the worker died
    second = CounterRows(os.dup(core.fd))
    try:
        tally = Tally(second)
        tally.count(9, 3, OTHER, 0, 5)
        tally.publish()
    finally:
        second.close()
    fields = core.read(9)
    assert (fields[sc.SUCCESSES], fields[sc.FAILURES + OTHER], fields[sc.FAILURE_NS]) == (1, 1, 5)


def test_a_worker_killed_while_it_wrote_leaves_the_copy_in_use_whole(
    core: CounterRows, worker: CounterRows
) -> None:
    core.bind(2, 5)
    tally = Tally(worker)
    tally.count(2, 5, SUCCESS, 1, 100, 10, (1, 2, 3))
    tally.publish()
    before = core.read(2)
    # What a worker killed halfway through its next publish leaves: the other copy partly
    # written, the version not bumped yet.
    with open(f"/proc/self/fd/{core.fd}", "r+b") as file, mmap.mmap(file.fileno(), 0) as raw:
        version = struct.unpack_from("<q", raw, 2 * ROW_WORDS * 8)[0]
        other = (2 * ROW_WORDS + COPIES[(version + 1) & 1]) * 8
        struct.pack_into("<4q", raw, other, 5, 999, 999, 999)
    assert core.read(2) == before
    tally.count(2, 5, SUCCESS, 1, 100, 10, (1, 2, 3))  # its successor's next publish
    tally.publish()
    assert core.read(2)[sc.SUCCESSES : sc.QUEUE_NS + 1] == (2, 200, 20)


_WRITER = """
import os, sys
from shoal.ipc.stat_counters import CounterRows, Tally, SUCCESS
rows = CounterRows(int(sys.argv[1]))
tally = Tally(rows)
for _ in range(int(sys.argv[2])):
    tally.count(1, 11, SUCCESS, 1, 7, 3, (1, 2, 4))
    tally.publish()
"""


def test_a_read_never_shows_a_request_half_counted(core: CounterRows) -> None:
    """A worker process publishes one request at a time while the core reads: every read
    shows whole requests (each success with its durations and its execution)."""
    core.bind(1, 11)
    count = 20_000
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(core.fd), str(count)],
        pass_fds=[core.fd],
        env=env,
    )
    try:
        reads = 0
        while True:
            done = writer.poll() is not None
            fields = core.read(1)
            n = fields[sc.SUCCESSES]
            assert fields[sc.SUCCESS_NS : sc.SUCCESS_OUTPUT_NS + 1] == (
                7 * n,
                3 * n,
                n,
                2 * n,
                4 * n,
            )
            assert fields[sc.EXECUTIONS : sc.EXECUTION_OUTPUT_NS + 1] == (n, n, 2 * n, 4 * n)
            reads += 1
            if done:
                break
    finally:
        writer.wait(30)
    assert writer.returncode == 0
    assert core.read(1)[sc.SUCCESSES] == count
    assert reads > 1
