"""Resident set size of stub processes, read from ``/proc/<pid>/statm`` at most once per interval.

Nothing runs in the background: a scrape asks for a pid's RSS and gets the reading cached for that
pid unless it is older than the interval (``--metrics-interval-ms``), in which case the file is
read again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def read_rss_bytes(pid: int, proc_root: str = "/proc") -> int | None:
    """The RSS of ``pid`` in bytes, or None if the process is gone or the file unreadable."""
    try:
        with open(f"{proc_root}/{pid}/statm", "rb") as f:
            fields = f.read().split()
        return int(fields[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


class RssProbe:
    """Caches one reading per pid for ``interval_s`` seconds of ``clock``."""

    def __init__(
        self,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        proc_root: str = "/proc",
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._proc_root = proc_root
        self._readings: dict[int, tuple[float, int | None]] = {}

    def rss_bytes(self, pid: int) -> int | None:
        now = self._clock()
        cached = self._readings.get(pid)
        if cached is not None and now - cached[0] < self._interval_s:
            return cached[1]
        value = read_rss_bytes(pid, self._proc_root)
        self._readings[pid] = (now, value)
        return value

    def keep_only(self, pids: Collection[int]) -> None:
        """Forget the readings of processes that are no longer stubs (exited, restarted)."""
        for pid in [p for p in self._readings if p not in pids]:
            del self._readings[pid]
