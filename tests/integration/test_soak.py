"""The 60-second soak of issue #9 item 8: benchmarks/soak.py's mixed traffic must leave no growth.

It runs every model kind at once (identity, dynamic batching, sequence with implicit state,
decoupled streaming, ensemble, BLS) over HTTP and gRPC for 60 s, after a 15 s warm-up that the
bounds do not judge, and asserts the verdict: supervisor and stub RSS, open fds and /dev/shm
within ``benchmarks.soak.BOUNDS`` (each bound's ``why`` says how it was chosen), the input arena
empty once the traffic stops, no failed request, no stub restarted, a clean exit. The 10-minute
run is in benchmarks/results/soak.md. This is the slowest test of the suite (about 75 s).
"""

from __future__ import annotations

import pytest

from benchmarks.soak import soak

DURATION_S = 60.0
INTERVAL_S = 5.0
WARMUP_S = 15.0


@pytest.mark.timeout(240)
def test_soak_without_growth():
    lines: list[str] = []
    report = soak(DURATION_S, INTERVAL_S, WARMUP_S, out=lines.append)
    print("\n".join(lines))
    assert report.passed, "\n".join([*report.failures, *lines])
    assert len(report.samples) >= DURATION_S / INTERVAL_S
