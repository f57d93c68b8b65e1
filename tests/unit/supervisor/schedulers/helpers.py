"""Test doubles for schedulers: a manual clock, real arenas and a loopback instance.

The loopback instance pulls batches from a scheduler's source exactly like ``StubInstance``
(one batch at a time) and completes them with a Python function instead of a stub process.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

import numpy as np

from shoal.config import load_model_config
from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.records import RequestRecord, ResponseRecord
from shoal.ipc.tensor import TensorDesc, buffer_to_numpy, numpy_to_buffer_size, write_numpy
from shoal.supervisor.schedulers import arena_stager
from shoal.supervisor.work import Completion, Work

WAIT = 2.0  # seconds a test waits for something that must happen at once


class _Timer:
    def __init__(self, when: int, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Time stands still until ``advance``; due timers fire in order, synchronously."""

    def __init__(self) -> None:
        self.now = 1_000_000_000
        self._timers: list[tuple[int, int, _Timer]] = []
        self._seq = itertools.count()

    def now_ns(self) -> int:
        return self.now

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(when_ns, callback)
        heapq.heappush(self._timers, (when_ns, next(self._seq), timer))
        return timer

    def advance_us(self, us: float) -> None:
        target = self.now + int(us * 1000)
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now = max(self.now, when)
                timer.callback()
        self.now = target


class Arenas:
    """A real input arena (id 0) and a stand-in stub output arena (id 1)."""

    def __init__(self) -> None:
        self.inputs = OwnedArena(
            0, initial_bytes=1 << 20, growth_bytes=1 << 20, limit_bytes=1 << 24
        )
        self.outputs = OwnedArena(
            1, initial_bytes=1 << 20, growth_bytes=1 << 20, limit_bytes=1 << 24
        )
        self.stage = arena_stager(self.inputs)

    def arena(self, block: Block) -> OwnedArena:
        return self.inputs if block.arena_id == 0 else self.outputs

    def free_work(self, work: Work) -> None:
        for block in work.input_blocks:
            self.inputs.free(block)

    def read(self, desc: TensorDesc) -> np.ndarray:
        """A copy of a tensor, read the way a stub maps it (any byte range of a segment)."""
        block = desc.location
        if block.nbytes == 0:
            view = memoryview(b"")
        else:
            buf = self.arena(block).segments[block.segment].buf
            view = buf[block.offset : block.offset + block.nbytes]
        return np.array(buffer_to_numpy(desc.datatype, desc.shape, view))

    def output(self, name: str, array: np.ndarray, datatype: str) -> TensorDesc:
        block = self.outputs.allocate(numpy_to_buffer_size(array, datatype))
        write_numpy(array, datatype, self.outputs.view(block))
        return TensorDesc(name, datatype, tuple(array.shape), block)

    @property
    def used(self) -> int:
        return self.inputs.used_bytes + self.outputs.used_bytes

    def close(self) -> None:
        self.inputs.close()
        self.outputs.close()


def make_work(
    arenas: Arenas,
    inputs: dict[str, np.ndarray],
    *,
    rid: str = "",
    corr: int | str = 0,
    flags: int = 0,
    params: dict | None = None,
    timeout_us: int = 0,
    batched: bool = True,
    outputs: tuple[str, ...] = (),
) -> Work:
    descs, blocks = [], []
    for name, array in inputs.items():
        datatype = "BYTES" if array.dtype == object else _V2[array.dtype.str[1:]]
        desc, block = arenas.stage(name, datatype, tuple(array.shape), array)
        descs.append(desc)
        blocks.append(block)
    params = dict(params or {})
    record = RequestRecord(rid, corr, flags, params, list(outputs), descs, timeout_us)
    first = next(iter(inputs.values()))
    size = int(first.shape[0]) if batched and first.ndim else 1
    future = asyncio.get_running_loop().create_future()
    return Work(record, blocks, future, batch_size=size)


_V2 = {"f4": "FP32", "i4": "INT32", "i8": "INT64", "u8": "UINT64", "b1": "BOOL"}


def echo(arenas: Arenas, record: RequestRecord) -> ResponseRecord:
    """Every input copied back as an output of the same name."""
    return ResponseRecord(
        [arenas.output(d.name, arenas.read(d), d.datatype) for d in record.inputs]
    )


Model = Callable[[Arenas, RequestRecord], ResponseRecord]


class Loopback:
    """An instance double: pulls one batch at a time from ``source``; the test finishes it."""

    def __init__(self, source, arenas: Arenas, model: Model = echo) -> None:
        self.source = source
        self.arenas = arenas
        self.model = model
        self.executions: list[list[Work]] = []
        self._pulled: asyncio.Queue[tuple[list[Work], asyncio.Future[None]]] = asyncio.Queue()
        self._current: tuple[list[Work], asyncio.Future[None]] | None = None
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self.source.next_batch()
            done = loop.create_future()
            await self._pulled.put((batch, done))
            await done

    async def take(self) -> list[Work]:
        """The batch the instance pulled next (waits for it)."""
        self._current = await asyncio.wait_for(self._pulled.get(), WAIT)
        return self._current[0]

    async def nothing_pulled(self) -> bool:
        """True if no batch is pulled after the loop settles."""
        for _ in range(20):
            await asyncio.sleep(0)
        return self._pulled.empty()

    def finish(self) -> list[Work]:
        """Complete the current batch as StubInstance does; returns it."""
        assert self._current is not None
        batch, done = self._current
        self._current = None
        self.executions.append(batch)
        for work in batch:
            self._complete(work, self.model(self.arenas, work.record))
        done.set_result(None)
        return batch

    def reschedule(self) -> list[Work]:
        """The model released every request of the current batch with RESCHEDULE, as
        StubInstance handles it: each goes back to its scheduler, inputs kept."""
        assert self._current is not None
        batch, done = self._current
        self._current = None
        self.executions.append(batch)
        for work in batch:
            assert work.reschedule is not None, "the scheduler does not take requests back"
            work.reschedule(work, True)
        done.set_result(None)
        return batch

    def give_back(self) -> None:
        """The instance could not send the current batch (its stub died): requeue it."""
        assert self._current is not None
        batch, done = self._current
        self._current = None
        self.source.requeue(batch)
        done.set_result(None)

    def _complete(self, work: Work, response: ResponseRecord) -> None:
        if work.reschedule is not None:  # done for good (an iterative sequence ends)
            work.reschedule(work, False)
        outputs = [o.location for o in response.outputs]
        passed = [b for b in work.input_blocks if b in outputs]
        for block in work.input_blocks:
            if block not in passed:
                self.arenas.inputs.free(block)
        owned = list({b: None for b in outputs if b.arena_id == 1}) + passed
        if work.future.done():
            self.release_outputs(None, owned)
            return
        completion = Completion(response, self, None, owned)
        if work.on_complete is not None:
            work.on_complete(completion)
        work.future.set_result(completion)

    # what Completion calls on its instance
    def output_view(self, proc, block: Block) -> memoryview:
        return self.arenas.arena(block).view(block).toreadonly()

    def release_outputs(self, proc, blocks: list[Block]) -> None:
        for block in blocks:
            self.arenas.arena(block).free(block)

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


async def result(work: Work | asyncio.Future) -> dict[str, np.ndarray]:
    """The outputs of a finished request (its completion released)."""
    future = work.future if isinstance(work, Work) else work
    completion: Completion = await asyncio.wait_for(future, WAIT)
    outputs = {}
    for desc in completion.response.outputs:
        view = completion.view(desc.location)
        outputs[desc.name] = np.array(buffer_to_numpy(desc.datatype, desc.shape, view))
    completion.release()
    return outputs


async def settle() -> None:
    """Let callbacks and woken tasks run (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


def load_config(tmp_path, text: str, files: dict[str, bytes] | None = None):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.py").write_text("")
    (model / "config.pbtxt").write_text(text)
    for name, data in (files or {}).items():
        path = model / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return load_model_config(model)
