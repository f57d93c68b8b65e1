"""StubInstance over loopback stubs: batches, a stub's death, execute timeouts, crash loops and
stopping, without starting a process."""

from __future__ import annotations

import asyncio
import re
from collections import deque

import numpy as np
import pytest

from shoal.core.errors import DeadlineExceeded, Unavailable
from shoal.ipc import messages as msg
from shoal.ipc.arena import OwnedArena
from shoal.ipc.messages import RequestRecord
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.instance import InstanceLinks, InstanceSpec, StubInstance
from shoal.supervisor.instances.loopback import Loopback, LoopbackModel
from shoal.supervisor.instances.process import StubLaunch
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.schedulers import arena_stager
from shoal.supervisor.work import Work
from tests.unit.supervisor.schedulers.helpers import WAIT, result, settle

pytestmark = pytest.mark.timeout(10)


def double(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": inputs["X"] * 2}


class Queue:
    """A batch source: what the scheduler would hand the instance."""

    def __init__(self) -> None:
        self._batches: deque[list[Work]] = deque()
        self._more = asyncio.Event()

    def put(self, batch: list[Work]) -> None:
        self._batches.append(batch)
        self._more.set()

    async def next_batch(self) -> list[Work]:
        while not self._batches:
            self._more.clear()
            await self._more.wait()
        return self._batches.popleft()

    def requeue(self, batch: list[Work]) -> None:
        self._batches.appendleft(batch)
        self._more.set()


class Setup:
    """One instance of model "m" over the loopback kind, with a real input arena."""

    def __init__(self, model: LoopbackModel = double, **spec: object) -> None:
        self.arena = OwnedArena(0, initial_bytes=1 << 20, growth_bytes=1 << 20, limit_bytes=1 << 24)
        self.directory = SegmentDirectory(self.arena)
        self.kind = Loopback(lambda name: model)
        self.queue = Queue()
        self.failed: list[StubInstance] = []
        spec.setdefault("restart_backoff", (0.01, 0.05))
        self.instance = StubInstance(
            InstanceSpec("m", "m_0", {}, "model.py", StubLaunch("m_0"), (1 << 20,) * 3, **spec),
            self.directory,
            self._free,
            StatsRecorder("m", 1),
            self.kind,
            InstanceLinks(on_failed=self.failed.append),
        )
        self._stage = arena_stager(self.arena)

    def _free(self, blocks: list) -> None:
        for block in blocks:
            self.arena.free(block)

    def submit(self, value: float = 1.0) -> Work:
        desc, block = self._stage("X", "FP32", (1, 2), np.full((1, 2), value, np.float32))
        record = RequestRecord("", 0, 0, {}, [], [desc])
        work = Work(record, [block], asyncio.get_running_loop().create_future(), batch_size=1)
        self.queue.put([work])
        return work

    @property
    def stub(self):
        return self.kind.latest["m_0"]

    async def restarted(self, stubs: int) -> None:
        """Wait until the instance runs its ``stubs``-th stub and is ready."""
        async with asyncio.timeout(WAIT):
            while len(self.kind.made) < stubs or not self.instance.ready:
                await asyncio.sleep(0.005)

    async def close(self) -> None:
        await self.instance.stop(1.0)
        await settle()
        assert self.arena.used_bytes == 0, "input blocks leaked"
        self.arena.close()


def run(coro) -> None:
    asyncio.run(coro)


def test_a_batch_runs_and_its_outputs_are_given_back():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        outputs = await result(s.submit(3.0))
        np.testing.assert_array_equal(outputs["Y"], np.full((1, 2), 6.0, np.float32))
        await settle()  # releases go to the stub once per loop turn
        assert s.stub.output_bytes_in_use == 0
        assert s.stub.executions == 1
        await s.close()

    run(scenario())


def test_a_dead_stub_fails_what_it_held_and_the_instance_restarts():
    async def scenario():
        hang = True

        def model(inputs):
            return None if hang else double(inputs)

        s = Setup(model)
        await s.instance.start(s.queue)
        held = s.submit()
        await settle()
        s.stub.kill()
        with pytest.raises(Unavailable, match="Stub process 'm_0' is not healthy"):
            await asyncio.wait_for(held.future, WAIT)
        assert "signal 9 (SIGKILL)" in s.instance.last_exit
        hang = False
        await s.restarted(2)
        assert s.instance.restarts == 1
        await result(s.submit())  # the new stub serves
        await s.close()

    run(scenario())


def test_an_execute_over_its_timeout_fails_with_deadline_exceeded_and_restarts():
    async def scenario():
        s = Setup(lambda inputs: None, execute_timeout=0.05)
        await s.instance.start(s.queue)
        work = s.submit()
        timed_out = re.escape("execute did not finish within 0.05s")
        with pytest.raises(DeadlineExceeded, match=timed_out):
            await asyncio.wait_for(work.future, WAIT)
        await s.restarted(2)
        await s.close()

    run(scenario())


def test_a_crash_loop_stops_the_restarts_and_says_why():
    async def scenario():
        s = Setup(crash_limit=2, crash_window=60.0)
        await s.instance.start(s.queue)
        s.stub.kill()
        await s.restarted(2)
        s.stub.kill()
        async with asyncio.timeout(WAIT):
            while not s.failed:
                await asyncio.sleep(0.005)
        assert s.failed == [s.instance]
        assert "died 2 times within 60s" in (s.instance.failed or "")
        await settle()
        assert len(s.kind.made) == 2  # no third start
        await s.close()

    run(scenario())


def test_stop_finalizes_the_stub():
    async def scenario():
        s = Setup()
        await s.instance.start(s.queue)
        stub = s.stub
        await s.close()
        assert any(isinstance(m, msg.Finalize) for m in stub.received)
        assert stub.returncode == 0

    run(scenario())
