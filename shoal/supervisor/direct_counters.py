"""Direct dispatch's statistics, the core's side: each worker's rows of counters, bound to
the model versions it routes to (``ipc/stat_counters.py`` has the layout and why).

The core makes one segment per worker number and keeps it for the server's life, so a worker
that is restarted gets the same one and its counts stay. A row is bound to one version (by
its summary's generation, which a reload changes) when the worker is first granted a route to
it, and registered with the version's ``StatsRecorder``, which adds the row in every snapshot:
the core does nothing per request. A version's rows are bound until it is no longer loaded;
a row is taken back only when a worker needs one and none is free, and only while that
worker waits for its grant (it writes nothing then). The worker drops counts of a row that
was rebound since (a request of an unloaded version, whose statistics nobody reads).
"""

from __future__ import annotations

from shoal.ipc.stat_counters import ROWS, CounterRows
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.models.loaded import LoadedModels
from shoal.supervisor.models.version import ModelVersion

__all__ = ["DirectCounters"]


class _WorkerRows:
    """One worker's segment and what each of its rows is bound to."""

    def __init__(self) -> None:
        self.rows = CounterRows.create()
        #: The row of each version's generation.
        self.bound: dict[int, int] = {}
        #: What each bound row counts for: (generation, the version's recorder).
        self.owners: dict[int, tuple[int, StatsRecorder]] = {}
        self.free = list(range(ROWS - 1, -1, -1))


class DirectCounters:
    """Every worker's rows of counters."""

    def __init__(self, loaded: LoadedModels) -> None:
        self._loaded = loaded
        self._workers: dict[int, _WorkerRows] = {}

    def fd(self, worker: int) -> int:
        """The segment of worker ``worker`` (made at its first start), to pass to it."""
        rows = self._workers.get(worker)
        if rows is None:
            rows = self._workers[worker] = _WorkerRows()
        return rows.rows.fd

    def row_for(self, worker: int, mv: ModelVersion) -> int | None:
        """The row worker ``worker`` counts ``mv``'s direct requests in, bound now if new;
        None: no row is left (its requests then take the core's way). Called only while the
        worker waits for its grant."""
        rows = self._workers.get(worker)
        if rows is None:
            return None
        generation = mv.summary.generation
        row = rows.bound.get(generation)
        if row is not None:
            return row
        if not rows.free:
            self._reclaim(rows)
            if not rows.free:
                return None
        row = rows.free.pop()
        rows.rows.bind(row, generation)
        rows.bound[generation] = row
        rows.owners[row] = (generation, mv.stats)
        mv.stats.add_direct(rows.rows, row, generation)
        return row

    def _reclaim(self, rows: _WorkerRows) -> None:
        """Free the rows of versions no longer loaded (their statistics are read no more)."""
        live = {id(mv.stats) for mv in self._loaded.versions()}
        for row, (generation, stats) in list(rows.owners.items()):
            if id(stats) not in live:
                stats.drop_direct(rows.rows, row)
                del rows.owners[row]
                del rows.bound[generation]
                rows.free.append(row)

    def close(self) -> None:
        """Unmap every segment (a test's end: a server's go with its process, since its
        statistics may be read until then)."""
        for rows in self._workers.values():
            rows.rows.close()
        self._workers.clear()
