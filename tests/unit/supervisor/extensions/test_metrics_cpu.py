"""The host CPU families read from a fake /proc: utilization between readings, memory, caching."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.supervisor.extensions._metrics_cpu import CpuProbe, read_cpu_times, read_memory_bytes

pytestmark = pytest.mark.timeout(10)

_MEMINFO = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n"


def _proc(root: Path, user: int, idle: int, iowait: int = 0) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    (root / "stat").write_text(
        f"cpu  {user} 0 0 {idle} {iowait} 0 0 0 7 0\ncpu0 {user} 0 0 {idle} {iowait} 0 0 0 7 0\n"
    )
    (root / "meminfo").write_text(_MEMINFO)


def _families(probe: CpuProbe) -> dict[str, float]:
    return {family.name: family.samples[0].value for family in probe.families()}


def test_readings(tmp_path: Path) -> None:
    _proc(tmp_path, user=30, idle=60, iowait=10)
    assert read_cpu_times(str(tmp_path)) == (30, 100)  # guest is already inside user
    assert read_memory_bytes(str(tmp_path)) == (1_024_000, 768_000)


def test_utilization_is_the_busy_share_between_two_readings(tmp_path: Path) -> None:
    now = [0.0]
    probe = CpuProbe(2.0, clock=lambda: now[0], proc_root=str(tmp_path))
    _proc(tmp_path, user=100, idle=100)
    first = _families(probe)
    assert first["nv_cpu_utilization"] == 0.0  # one reading: nothing to compare yet
    assert first["nv_cpu_memory_total_bytes"] == 1_024_000
    assert first["nv_cpu_memory_used_bytes"] == 768_000
    _proc(tmp_path, user=175, idle=125)  # +75 busy of +100
    now[0] = 1.0  # within the interval: the old reading stands
    assert _families(probe)["nv_cpu_utilization"] == 0.0
    now[0] = 2.5
    assert _families(probe)["nv_cpu_utilization"] == pytest.approx(0.75)


def test_unreadable_files_give_zero_and_no_memory(tmp_path: Path) -> None:
    probe = CpuProbe(0.0, proc_root=str(tmp_path / "missing"))
    assert _families(probe) == {"nv_cpu_utilization": 0.0}
