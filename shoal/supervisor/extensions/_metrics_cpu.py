"""Triton's host CPU families (``--allow-cpu-metrics``): utilization and memory of the machine.

``nv_cpu_utilization`` is the share of CPU time, over all CPUs, that was not idle between two
readings of ``/proc/stat``; ``nv_cpu_memory_total_bytes`` and ``nv_cpu_memory_used_bytes`` come
from ``/proc/meminfo`` (used = ``MemTotal - MemAvailable``). As for the stubs' RSS, nothing runs
in the background: a scrape reads the files unless the last reading is younger than the
interval (``--metrics-interval-ms``). The first utilization is 0, as in Triton, until there
are two readings to compare.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

#: /proc/stat columns that count as idle: idle and iowait.
_IDLE_COLUMNS = (3, 4)


def _cpu_line(proc_root: str) -> list[bytes] | None:
    """The fields of the all-CPUs line of /proc/stat."""
    try:
        with open(f"{proc_root}/stat", "rb") as f:
            return f.readline().split()
    except OSError:
        return None


def read_cpu_times(proc_root: str = "/proc") -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, or None when unreadable."""
    first = _cpu_line(proc_root)
    if not first or first[0] != b"cpu":
        return None
    # guest and guest_nice are already counted in user and nice.
    values = [int(v) for v in first[1:9]]
    idle = sum(values[i] for i in _IDLE_COLUMNS if i < len(values))
    total = sum(values)
    return total - idle, total


def _utilization(before: tuple[int, int], now: tuple[int, int], previous: float) -> float:
    """The busy share of the CPU time between two readings (``previous`` when none passed)."""
    busy, total = now[0] - before[0], now[1] - before[1]
    return min(1.0, max(0.0, busy / total)) if total > 0 else previous


def read_memory_bytes(proc_root: str = "/proc") -> tuple[int, int] | None:
    """(total, used) bytes of RAM, or None when unreadable."""
    fields: dict[bytes, int] = {}
    try:
        with open(f"{proc_root}/meminfo", "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                if key in (b"MemTotal", b"MemAvailable"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) < 2:
        return None
    return fields[b"MemTotal"], fields[b"MemTotal"] - fields[b"MemAvailable"]


class CpuProbe:
    """The host's CPU utilization and memory, read at most once per ``interval_s``."""

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
        self._read_at: float | None = None
        self._times: tuple[int, int] | None = None
        self._utilization = 0.0
        self._memory: tuple[int, int] | None = None

    def families(self) -> Iterator[Metric]:
        self._refresh()
        yield self._utilization_family()
        if self._memory is not None:
            total, used = self._memory
            yield GaugeMetricFamily(
                "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=total
            )
            yield GaugeMetricFamily(
                "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=used
            )

    def _utilization_family(self) -> Metric:
        family = GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
        family.add_metric([], self._utilization)
        return family

    def _refresh(self) -> None:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._interval_s:
            return
        self._read_at = now
        times = read_cpu_times(self._proc_root)
        if times is not None and self._times is not None:
            self._utilization = _utilization(self._times, times, self._utilization)
        self._times = times
        self._memory = read_memory_bytes(self._proc_root)
