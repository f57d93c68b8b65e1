"""One instance of a model over the loopback kind of stub, for the instance tests: no process."""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

from shoal.ipc.arena import OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.instance import InstanceLinks, InstanceSpec, MakeStub, StubInstance
from shoal.supervisor.instances.loopback import Loopback, LoopbackModel
from shoal.supervisor.instances.process import StubLaunch
from shoal.supervisor.memory.segments import SegmentDirectory
from shoal.supervisor.schedulers import arena_stager
from shoal.supervisor.work import Work
from tests.unit.supervisor.schedulers.helpers import WAIT, settle


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

    def __init__(
        self,
        model: LoopbackModel = double,
        *,
        send_ahead: bool = False,
        make_stub: MakeStub | None = None,
        **spec: object,
    ) -> None:
        self.arena = OwnedArena(0, initial_bytes=1 << 20, growth_bytes=1 << 20, limit_bytes=1 << 24)
        self.directory = SegmentDirectory(self.arena)
        self.kind = Loopback(lambda name: model)
        self.queue = Queue()
        self.failed: list[StubInstance] = []
        #: ``down`` each time the instance said its health changed.
        self.health: list[str | None] = []
        spec.setdefault("restart_backoff", (0.01, 0.05))
        links = InstanceLinks(
            self.directory,
            self._free,
            StatsRecorder("m", 1),
            make_stub or self.kind,
            send_ahead=send_ahead,
            on_failed=self.failed.append,
            on_health=lambda instance: self.health.append(instance.down),
        )
        self.instance = StubInstance(
            InstanceSpec("m", "m_0", {}, "model.py", StubLaunch("m_0"), (1 << 20,) * 3, **spec),
            links,
        )
        self._stage = arena_stager(self.arena)

    def _free(self, blocks: list) -> None:
        for block in blocks:
            self.arena.free(block)

    def submit(self, value: float = 1.0) -> Work:
        work = self.work(value)
        self.queue.put([work])
        return work

    def work(self, value: float = 1.0) -> Work:
        """A request for X = ``value`` (not queued)."""
        desc, block = self._stage("X", "FP32", (1, 2), np.full((1, 2), value, np.float32))
        record = RequestRecord("", 0, 0, {}, [], [desc])
        return Work(record, [block], asyncio.get_running_loop().create_future(), batch_size=1)

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
