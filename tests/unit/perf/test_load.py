"""The closed loop with in-process transports: no server, tiny windows."""

import asyncio

import pytest

from shoal.perf._load import ERROR_SAMPLES, measure
from shoal.perf.errors import RequestFailed

pytestmark = pytest.mark.timeout(10)


class Instant:
    def __init__(self, responses: int = 1) -> None:
        self.sent, self.closed, self.responses = 0, False, responses

    async def send(self) -> int:
        self.sent += 1
        await asyncio.sleep(0)
        return self.responses

    async def close(self) -> None:
        self.closed = True


class Failing(Instant):
    async def send(self) -> int:
        await asyncio.sleep(0)
        raise RequestFailed("no")


class Stuck(Instant):
    async def send(self) -> int:
        await asyncio.Event().wait()
        return 1


def test_only_the_window_is_counted():
    transports = [Instant(responses=3), Instant(responses=3)]
    measured = asyncio.run(measure(transports, warmup_s=0.05, duration_s=0.05, grace_s=1))
    sent = sum(t.sent for t in transports)
    assert 0 < len(measured.latencies_ns) < sent  # the warm-up's requests are dropped
    assert measured.responses == 3 * len(measured.latencies_ns)
    assert measured.errors == 0
    assert measured.window_end_ns - measured.window_start_ns == 50_000_000
    assert all(ns >= 0 for ns in measured.latencies_ns)


def test_errors_are_counted_and_sampled():
    measured = asyncio.run(measure([Failing()], warmup_s=0, duration_s=0.2, grace_s=1))
    assert measured.errors > 0
    assert not measured.latencies_ns
    assert len(measured.error_samples) == ERROR_SAMPLES
    assert measured.error_samples[0] == "RequestFailed: no"


def test_a_request_stuck_past_the_grace_period_is_cancelled_and_counted():
    measured = asyncio.run(measure([Stuck()], warmup_s=0, duration_s=0.01, grace_s=0.01))
    assert measured.errors == 1
    assert "still running" in measured.error_samples[0]
