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

A row (:data:`ROW_WORDS` little-endian int64 words): the version at word 0, then two copies of
the :data:`FIELDS` fields (:data:`GENERATION` first). The copy in use is ``version & 1``. The
worker, the row's one writer, keeps the row's totals in a :class:`RowTotals` (native integers;
read from the row at its first count there), adds each request to it, and once per loop turn
writes them into the other copy, then bumps the version (one aligned store): a worker killed in
between leaves the copy in use whole, which its successor starts from. The core reads the
version, the copy it names, and the version again, and reads again if it moved: a read never
shows a request half counted (a success without its duration). The stores are ordered as
written on x86-64 (TSO); a CPU that reorders stores would need fences Python does not issue.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Final

from mypy_extensions import i64

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
    "RowTotals",
    "Tally",
]

#: A request's outcome as a worker counts it: a success, or a failure of Triton's reason
#: BACKEND (the model's error), CANCELED (the client went away) or OTHER.
SUCCESS: Final = 0
BACKEND: Final = 1
CANCELED: Final = 2
OTHER: Final = 3

# The fields of a copy (Final: compiled code reads them as constants): the generation of the
# version the row is bound to; successes with their total, queue and compute (input, infer,
# output) nanoseconds; executions (of one request each) with their compute nanoseconds; the
# failures' total nanoseconds and their counts by reason (``FAILURES + outcome``); the last
# inference (ms since the epoch).
GENERATION: Final = 0
SUCCESSES: Final = 1
SUCCESS_NS: Final = 2
QUEUE_NS: Final = 3
SUCCESS_INPUT_NS: Final = 4
SUCCESS_INFER_NS: Final = 5
SUCCESS_OUTPUT_NS: Final = 6
EXECUTIONS: Final = 7
EXECUTION_INPUT_NS: Final = 8
EXECUTION_INFER_NS: Final = 9
EXECUTION_OUTPUT_NS: Final = 10
FAILURE_NS: Final = 11
#: The count of failures of outcome ``o`` is field ``FAILURES + o`` (o in 1..3).
FAILURES: Final = 11
LAST_INFERENCE_MS: Final = 15
FIELDS: Final = 16

#: Rows per worker: one per model version it routes to (the core reuses the rows of unloaded
#: versions).
ROWS: Final = 1024
#: Words per row (512 bytes: the version, then the copies at words 8 and 32).
ROW_WORDS: Final = 64
_FIRST: Final = 8
_SECOND: Final = 32
COPIES: Final = (_FIRST, _SECOND)
SEGMENT_BYTES: Final = ROWS * ROW_WORDS * 8
_COPY: Final = struct.Struct("<16q")
#: Bound once (Final: a static read, compiled): ``_COPY.pack_into(...)`` looks the method up
#: by name at each call, and a worker calls it once per loop turn.
_PACK_COPY: Final = _COPY.pack_into
#: ``time.time_ns`` bound once, for the same reason (a look-up of ``time_ns`` on the module).
_TIME_NS: Final = time.time_ns
#: Reads of a row before the core takes what it read (a writer publishes once per loop turn:
#: two publishes within one read of 128 bytes do not happen in practice).
_TRIES: Final = 1000


class CounterRows:
    """One worker's segment of rows, mapped."""

    def __init__(self, fd: int) -> None:
        #: The memfd (the core keeps it to hand to a restarted worker).
        self.fd = fd
        self._map = mmap.mmap(fd, SEGMENT_BYTES)
        self._bytes = memoryview(self._map)  # struct packs into a view faster than the map
        self._words = self._bytes.cast("q")

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
            _COPY.pack_into(self._bytes, start, generation, *([0] * (FIELDS - 1)))

    def read(self, row: int) -> tuple[int, ...]:
        """The fields of ``row``, as one write of the worker left them (never half one)."""
        words = self._words
        base = row * ROW_WORDS
        fields: tuple[int, ...] = ()
        for _ in range(_TRIES):
            version = words[base]
            fields = _COPY.unpack_from(self._bytes, (base + COPIES[version & 1]) * 8)
            if words[base] == version:
                break
        return fields

    def write(self, row: int, totals: RowTotals) -> bool:
        """Make ``totals`` the fields of ``row``: the worker's, its one writer. False, and
        nothing written, if the row is bound to another generation now (the core took it back
        from a version that is gone)."""
        words = self._words
        base: i64 = row * ROW_WORDS
        version: i64 = words[base]
        # The copy in use (:data:`COPIES` by the version's low bit) in native arithmetic:
        # indexing the tuple makes a boxed int.
        in_use: i64 = _FIRST + (_SECOND - _FIRST) * (version & 1)
        if words[base + in_use] != totals.generation:
            return False
        totals.pack_into(self._bytes, (base + _FIRST + _SECOND - in_use) * 8)
        words[base] = version + 1
        return True

    def close(self) -> None:
        self._words.release()
        self._bytes.release()
        self._map.close()
        os.close(self.fd)


class RowTotals:
    """A row's totals, the worker's copy, one attribute per field (:data:`FIELDS` order). Native
    integers: compiled, adding a request makes no int object (a list of ints made ten per
    request, each add a boxed one)."""

    def __init__(self, fields: tuple[int, ...]) -> None:
        self.generation: i64 = fields[GENERATION]
        self.successes: i64 = fields[SUCCESSES]
        self.success_ns: i64 = fields[SUCCESS_NS]
        self.queue_ns: i64 = fields[QUEUE_NS]
        self.success_input_ns: i64 = fields[SUCCESS_INPUT_NS]
        self.success_infer_ns: i64 = fields[SUCCESS_INFER_NS]
        self.success_output_ns: i64 = fields[SUCCESS_OUTPUT_NS]
        self.executions: i64 = fields[EXECUTIONS]
        self.execution_input_ns: i64 = fields[EXECUTION_INPUT_NS]
        self.execution_infer_ns: i64 = fields[EXECUTION_INFER_NS]
        self.execution_output_ns: i64 = fields[EXECUTION_OUTPUT_NS]
        self.failure_ns: i64 = fields[FAILURE_NS]
        self.backend: i64 = fields[FAILURES + BACKEND]
        self.canceled: i64 = fields[FAILURES + CANCELED]
        self.other: i64 = fields[FAILURES + OTHER]
        self.last_inference_ms: i64 = fields[LAST_INFERENCE_MS]

    def pack_into(self, buffer: memoryview, offset: int) -> None:
        """The fields, in :data:`FIELDS` order, as one copy of a row at ``offset``."""
        _PACK_COPY(
            buffer,
            offset,
            self.generation,
            self.successes,
            self.success_ns,
            self.queue_ns,
            self.success_input_ns,
            self.success_infer_ns,
            self.success_output_ns,
            self.executions,
            self.execution_input_ns,
            self.execution_infer_ns,
            self.execution_output_ns,
            self.failure_ns,
            self.backend,
            self.canceled,
            self.other,
            self.last_inference_ms,
        )


class Tally:
    """A worker's totals of its rows, each request added at once and written to the rows once
    per loop turn (:meth:`publish`, before the turn's responses are written)."""

    def __init__(self, rows: CounterRows) -> None:
        self._rows = rows
        #: The totals of each row counted in (a copy of the row, the worker its one writer).
        self._totals: dict[int, RowTotals] = {}
        #: The rows counted in since the last :meth:`publish`.
        self._changed: dict[int, RowTotals] = {}

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
        totals = self._totals.get(row)
        if totals is None or totals.generation != generation:
            totals = self._start(row, generation)
        input_ns, infer_ns, output_ns = compute
        if outcome == SUCCESS:
            totals.successes += 1
            totals.success_ns += total_ns
            totals.queue_ns += queue_ns
            totals.success_input_ns += input_ns
            totals.success_infer_ns += infer_ns
            totals.success_output_ns += output_ns
        else:
            totals.failure_ns += total_ns
            if outcome == BACKEND:
                totals.backend += 1
            elif outcome == CANCELED:
                totals.canceled += 1
            else:
                totals.other += 1
        if executed:
            totals.executions += 1
            totals.execution_input_ns += input_ns
            totals.execution_infer_ns += infer_ns
            totals.execution_output_ns += output_ns
        self._changed[row] = totals

    def _start(self, row: int, generation: int) -> RowTotals:
        """The totals of ``row`` for ``generation``, from the row (a restarted worker goes on
        from its predecessor's); counts of another generation than the row's go nowhere (a
        request of a version gone, whose row the core reused)."""
        changed = self._changed.pop(row, None)
        if changed is not None:  # another generation's, not yet written: written first
            changed.last_inference_ms = _TIME_NS() // 1_000_000
            self._write(row, changed)
        fields = self._rows.read(row)
        if fields[GENERATION] != generation:
            fields = (generation,) + (0,) * (FIELDS - 1)
        totals = RowTotals(fields)
        self._totals[row] = totals
        return totals

    def publish(self) -> None:
        """Write this turn's totals to the rows (the core may read them from now on)."""
        changed = self._changed
        if not changed:
            return
        now_ms: i64 = _TIME_NS() // 1_000_000
        for row, totals in changed.items():
            totals.last_inference_ms = now_ms
            self._write(row, totals)
        changed.clear()  # emptied, not replaced: no dict made per loop turn

    def _write(self, row: int, totals: RowTotals) -> None:
        if not self._rows.write(row, totals):
            self._totals.pop(row, None)  # rebound since: read anew at its next count
