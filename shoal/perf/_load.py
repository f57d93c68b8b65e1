"""The closed loop: each worker sends its request, waits for the answer, and sends again.

Only requests that start and finish inside the measured window count; the warm-up before it and
requests still in flight at its end are dropped. The client's CPU time is read at the window's
edges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: How many error messages a cell keeps, to show why requests failed.
ERROR_SAMPLES = 5


class Transport(Protocol):
    """One worker's connection: ``send`` issues the worker's request once and returns the number
    of responses it got (1, or a decoupled stream's count); it raises when the request failed."""

    async def send(self) -> int: ...

    async def close(self) -> None: ...


@dataclass
class Measurements:
    """What the workers recorded inside the window."""

    window_start_ns: int
    window_end_ns: int
    latencies_ns: list[int] = field(default_factory=list)
    errors: int = 0
    responses: int = 0
    error_samples: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0

    def inside(self, start_ns: int, end_ns: int) -> bool:
        return start_ns >= self.window_start_ns and end_ns <= self.window_end_ns

    def ok(self, start_ns: int, end_ns: int, responses: int) -> None:
        if self.inside(start_ns, end_ns):
            self.latencies_ns.append(end_ns - start_ns)
            self.responses += responses

    def failed(self, start_ns: int, end_ns: int, error: BaseException) -> None:
        if self.inside(start_ns, end_ns):
            self.errors += 1
            if len(self.error_samples) < ERROR_SAMPLES:
                self.error_samples.append(f"{type(error).__name__}: {error}"[:300])


async def _worker(transport: Transport, measured: Measurements) -> None:
    clock = time.perf_counter_ns
    while (start := clock()) < measured.window_end_ns:
        try:
            responses = await transport.send()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            measured.failed(start, clock(), error)
        else:
            measured.ok(start, clock(), responses)


async def measure(
    transports: Sequence[Transport], warmup_s: float, duration_s: float, grace_s: float
) -> Measurements:
    """Run one worker per transport for ``warmup_s + duration_s``; wait ``grace_s`` at most for
    the requests still in flight, then cancel them."""
    now = time.perf_counter_ns()
    start = now + int(warmup_s * 1e9)
    measured = Measurements(start, start + int(duration_s * 1e9))
    tasks = [asyncio.create_task(_worker(t, measured)) for t in transports]
    try:
        await _window(measured, warmup_s)
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
    finally:
        await _cancel(tasks)
    if pending:  # stuck past the grace period: timeouts
        measured.errors += len(pending)
        measured.error_samples.append(f"{len(pending)} request(s) still running {grace_s} s late")
    return measured


async def _window(measured: Measurements, warmup_s: float) -> None:
    """Sleep through the warm-up and the measured window, timing the CPU used in the window."""
    await asyncio.sleep(warmup_s)
    cpu_start = time.process_time()
    await asyncio.sleep(max(0.0, (measured.window_end_ns - time.perf_counter_ns()) / 1e9))
    measured.cpu_seconds = time.process_time() - cpu_start


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
