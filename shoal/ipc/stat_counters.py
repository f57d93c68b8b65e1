"""Statistics counters in shared memory: a frontend worker counts what it sends straight to
stubs, the core adds the counts up only when statistics are read.

With direct dispatch (docs/architecture.md) a worker sends a plain request to a stub and
answers it without the core; the core must still report it in the statistics extension and
``/metrics``. Each worker has one memfd segment of :data:`ROWS` rows, made by the core and
kept across the worker's restarts (a restarted worker gets the same segment, so its counts
stay). The core binds a row to one model version (its summary's generation) when it grants
the worker a route (the worker is then blocked in that synchronous call: nothing else writes
its rows meanwhile); the worker adds its counts into that row, the core reads every row bound
to a version when its statistics are asked for.

A row (:data:`ROW_WORDS` little-endian int64 words): the version at word 0, then two copies
of the :data:`FIELDS` fields (:data:`GENERATION` first). The copy in use is ``version & 1``.
The worker, the row's one writer, writes the sum of the copy in use and its new counts into
the other copy, then bumps the version (one aligned store): a worker killed in between leaves
the copy in use whole, which its successor adds to. The core reads the version, the copy it
names, and the version again, and reads again if it moved: a read never shows a request half
counted (a success without its duration). The stores are ordered as written on x86-64 (TSO);
a CPU that reorders stores would need fences Python does not issue.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

__all__ = [
    "BACKEND",
    "CANCELED",
    "COPIES",
    "FIELDS",
    "OTHER",
    "ROWS",
    "ROW_WORDS",
    "SUCCESS",
    "CounterRows",
    "Tally",
]

#: A request's outcome as a worker counts it: a success, or a failure of Triton's reason
#: BACKEND (the model's error), CANCELED (the client went away) or OTHER.
SUCCESS, BACKEND, CANCELED, OTHER = 0, 1, 2, 3

#: The fields of a copy: the generation of the version the row is bound to; successes with
#: their total, queue and compute (input, infer, output) nanoseconds; executions (of one
#: request each) with their compute nanoseconds; the failures' total nanoseconds and their
#: counts by reason (``FAILURES + outcome``); the last inference (ms since the epoch).
(
    GENERATION,
    SUCCESSES,
    SUCCESS_NS,
    QUEUE_NS,
    SUCCESS_INPUT_NS,
    SUCCESS_INFER_NS,
    SUCCESS_OUTPUT_NS,
    EXECUTIONS,
    EXECUTION_INPUT_NS,
    EXECUTION_INFER_NS,
    EXECUTION_OUTPUT_NS,
    FAILURE_NS,
) = range(12)
#: The count of failures of outcome ``o`` is field ``FAILURES + o`` (o in 1..3).
FAILURES = FAILURE_NS
LAST_INFERENCE_MS = FAILURES + OTHER + 1
FIELDS = LAST_INFERENCE_MS + 1

#: Rows per worker: one per model version it routes to (the core reuses the rows of unloaded
#: versions).
ROWS = 1024
#: Words per row (512 bytes: the version, then the copies at words 8 and 32).
ROW_WORDS = 64
COPIES = (8, 32)
SEGMENT_BYTES = ROWS * ROW_WORDS * 8
_COPY = struct.Struct(f"<{FIELDS}q")
#: Reads of a row before the core takes what it read (a writer publishes once per loop turn:
#: two publishes within one read of 128 bytes do not happen in practice).
_TRIES = 1000


class CounterRows:
    """One worker's segment of rows, mapped."""

    def __init__(self, fd: int) -> None:
        #: The memfd (the core keeps it to hand to a restarted worker).
        self.fd = fd
        self._map = mmap.mmap(fd, SEGMENT_BYTES)
        self._words = memoryview(self._map).cast("q")

    @classmethod
    def create(cls) -> CounterRows:
        """A new segment, all zero (the core's)."""
        fd = os.memfd_create("shoal-stat-counters", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, SEGMENT_BYTES)
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def bind(self, row: int, generation: int) -> None:
        """Row ``row`` counts for the version of ``generation`` from now on, from zero. The
        core's, while the worker cannot write (it waits for the core's answer)."""
        base = row * ROW_WORDS
        for copy in COPIES:
            start = (base + copy) * 8
            _COPY.pack_into(self._map, start, generation, *([0] * (FIELDS - 1)))

    def read(self, row: int) -> tuple[int, ...]:
        """The fields of ``row``, as one publish of the worker left them (never half one)."""
        words = self._words
        base = row * ROW_WORDS
        fields: tuple[int, ...] = ()
        for _ in range(_TRIES):
            version = words[base]
            fields = _COPY.unpack_from(self._map, (base + COPIES[version & 1]) * 8)
            if words[base] == version:
                break
        return fields

    def add(self, row: int, counts: list[int], now_ms: int) -> None:
        """Add ``counts`` (fields, their generation first) to ``row``: the worker's, its one
        writer. Dropped if the row is bound to another generation now (the core took it back
        from a version that is gone: nobody reads that version's statistics any more)."""
        words = self._words
        base = row * ROW_WORDS
        version = words[base]
        current = _COPY.unpack_from(self._map, (base + COPIES[version & 1]) * 8)
        if current[GENERATION] != counts[GENERATION]:
            return
        total = [current[i] + counts[i] for i in range(FIELDS)]
        total[GENERATION] = counts[GENERATION]
        total[LAST_INFERENCE_MS] = now_ms
        _COPY.pack_into(self._map, (base + COPIES[(version + 1) & 1]) * 8, *total)
        words[base] = version + 1

    def close(self) -> None:
        self._words.release()
        self._map.close()
        os.close(self.fd)


class Tally:
    """A worker's counts of one loop turn, by row, written to its rows at once
    (:meth:`publish`, before the turn's responses are written)."""

    def __init__(self, rows: CounterRows) -> None:
        self._rows = rows
        self._pending: dict[int, list[int]] = {}

    def count(
        self,
        row: int,
        generation: int,
        outcome: int,
        executed: int,
        total_ns: int,
        queue_ns: int = 0,
        compute: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """One request: a success or a failure (``outcome``), run by the model or not."""
        counts = self._pending.get(row)
        if counts is None or counts[GENERATION] != generation:
            if counts is not None:  # a request of a version gone, whose row the core reused
                self._rows.add(row, counts, _now_ms())  # (the one not the row's is dropped)
            counts = self._pending[row] = [0] * FIELDS
            counts[GENERATION] = generation
        if outcome == SUCCESS:
            counts[SUCCESSES] += 1
            counts[SUCCESS_NS] += total_ns
            counts[QUEUE_NS] += queue_ns
            counts[SUCCESS_INPUT_NS] += compute[0]
            counts[SUCCESS_INFER_NS] += compute[1]
            counts[SUCCESS_OUTPUT_NS] += compute[2]
        else:
            counts[FAILURE_NS] += total_ns
            counts[FAILURES + outcome] += 1
        if executed:
            counts[EXECUTIONS] += 1
            counts[EXECUTION_INPUT_NS] += compute[0]
            counts[EXECUTION_INFER_NS] += compute[1]
            counts[EXECUTION_OUTPUT_NS] += compute[2]

    def publish(self) -> None:
        """Write the counts of this turn to the rows (the core may read them from now on)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        now_ms = _now_ms()
        for row, counts in pending.items():
            self._rows.add(row, counts, now_ms)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
