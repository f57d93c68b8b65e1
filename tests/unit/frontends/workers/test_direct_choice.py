"""Which stub a frontend worker sends a direct request to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shoal.frontends.workers.direct_stubs import Stub, least_busy
from shoal.ipc.queue import Channel

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def channels() -> Iterator[list[Channel]]:
    made: list[Channel] = []
    yield made
    for channel in made:
        channel.close()


def _stubs(channels: list[Channel], count: int) -> list[Stub]:
    channels.extend(Channel.create(4096) for _ in range(count))
    return [Stub(1000 + n, f"m_{n}", channels[n], None) for n in range(count)]


def test_workers_that_see_idle_stubs_start_on_different_ones(channels: list[Channel]) -> None:
    stubs = _stubs(channels, 8)
    firsts = {least_busy(stubs, worker) for worker in range(7)}
    assert len(firsts) == 7  # seven workers, seven different stubs


def test_the_least_busy_stub_wins_and_equals_are_taken_in_turn(channels: list[Channel]) -> None:
    stubs = _stubs(channels, 3)
    busy = stubs[0].pending
    stubs[0].pending, stubs[1].pending = {1: busy, 2: busy}, {3: busy}  # type: ignore[dict-item]
    assert least_busy(stubs, 0) is stubs[2]
    stubs[2].pending = {4: busy}  # type: ignore[dict-item]
    assert least_busy(stubs, 1) is stubs[1] and least_busy(stubs, 2) is stubs[2]
    stubs[1].dead = stubs[2].dead = True
    assert least_busy(stubs, 1) is stubs[0]
    stubs[0].dead = True
    assert least_busy(stubs, 0) is None
