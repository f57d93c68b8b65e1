"""An instance's stub lifecycle over loopback stubs: restarts that fail and recover, a stub that
cannot start, and the crash-loop window."""

from __future__ import annotations

import asyncio

import pytest

from shoal.supervisor.instances import lifecycle
from shoal.supervisor.instances.lifecycle import CrashLoop
from tests.unit.supervisor.instances.helpers import Setup, run
from tests.unit.supervisor.schedulers.helpers import WAIT, result

pytestmark = pytest.mark.timeout(10)


def test_failed_restarts_mark_the_instance_down_until_one_succeeds():
    async def scenario():
        failing = False

        def make_stub(launch, arena_id):
            if failing:
                raise OSError(24, "Too many open files")
            return s.kind(launch, arena_id)

        s = Setup(make_stub=make_stub)
        await s.instance.start(s.queue)
        failing = True
        s.stub.kill()
        async with asyncio.timeout(WAIT):
            while not s.health:
                await asyncio.sleep(0.005)
        down = s.health[0] or ""
        assert "instance 'm_0' has no live stub: restart 1 failed" in down
        assert "Too many open files" in down
        assert s.instance.down == s.health[-1]
        assert not s.instance.ready
        failing = False
        await s.restarted(2)
        assert s.health[-1] is None  # told once more: it is back
        assert s.instance.down is None
        assert s.instance.restarts >= 2
        await result(s.submit())
        await s.close()

    run(scenario())


def test_a_stub_that_cannot_start_fails_the_start_and_leaves_nothing_behind():
    async def scenario():
        def make_stub(launch, arena_id):
            raise OSError(24, "Too many open files")

        s = Setup(make_stub=make_stub)
        with pytest.raises(OSError, match="Too many open files"):
            await s.instance.start(s.queue)
        assert not s.instance.ready
        assert s.instance.pid == -1
        await s.close()

    run(scenario())


def test_a_crash_loop_counts_only_the_deaths_within_its_window(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(lifecycle.time, "monotonic", lambda: now[0])
    crashes = CrashLoop(limit=3, window=60.0)
    assert crashes.died() == 1
    now[0] += 30
    assert crashes.died() == 2
    now[0] += 31  # the first death is out of the window
    assert crashes.died() == 2
    now[0] += 61
    assert crashes.died() == 1
