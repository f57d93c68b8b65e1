"""The core's side of a relayed call, over a worker's link to a real service and loopback stub:
the answer, the worker's blocks given back after the result or a cancellation, and a stale
snapshot's call handed back with its blocks still the worker's."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import numpy as np
import pytest

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.core import InferInput, InferRequest
from shoal.core.packed import frame
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.arenas import LentArena, StagingArena
from shoal.frontends.workers.host import _Link
from shoal.frontends.workers.packing import Snapshot, prepare
from shoal.frontends.workers.pool import WorkerPool
from shoal.supervisor.compose import build_service
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.requests import packed
from shoal.supervisor.service import InferenceService

pytestmark = pytest.mark.timeout(20)

ARENA = (1 << 32) + 77

CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _twice(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": inputs["X"] * 2}


class _Frames(asyncio.Transport):
    """The link's socket, seen from the worker: every frame the core writes, decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[list[Any], list[bytes]]] = []
        self.reader = wire.FrameReader(self._got, lambda: None)

    def _got(self, header: list[Any], payloads: list[memoryview]) -> None:
        self.frames.append((header, [bytes(p) for p in payloads]))

    def is_closing(self) -> bool:
        return False

    def write(self, data: Any) -> None:
        self.reader.data_received(bytes(data))

    def writelines(self, pieces: Any) -> None:
        self.write(b"".join(bytes(p) for p in pieces))

    def of_kind(self, kind: int) -> list[list[Any]]:
        return [header for header, _ in self.frames if header[0] == kind]


@pytest.fixture
def service(tmp_path) -> InferenceService:
    model = tmp_path / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    args = build_parser().parse_args(["serve", "--model-repository", str(tmp_path)])
    return build_service(options_from_args(args), make_stub=Loopback(lambda name: _twice))


async def _linked(service: InferenceService, worker: socket.socket, core: socket.socket):
    await service.load_repository()
    pool = WorkerPool(service, 0, [], {}, b"")
    link = _Link(service, 0, pool)
    frames = _Frames()
    link.outbox = wire.Outbox(frames)
    link.arena = LentArena(ARENA, core, service.directory, link.send_free)
    staging = StagingArena(
        ARENA,
        worker,
        initial_bytes=1 << 20,
        growth_bytes=1 << 20,
        limit_bytes=4 << 20,
        on_retired=lambda index: None,
    )
    return link, frames, staging


def _call(
    link: _Link,
    staging: StagingArena,
    call_id: int,
    values: np.ndarray,
    stale: bool = False,
    slot: int | None = None,
):
    """Relay a request for ``echo`` as a worker would (``slot``: another one than the core's);
    the blocks it staged."""
    request = InferRequest("echo", inputs=[InferInput("X", "FP32", values.shape, values.tobytes())])
    plain = link.core.packing_summary("echo", "")  # type: ignore[attr-defined]
    assert plain is not None
    if stale:
        plain[0] -= 1  # a snapshot of the version before
    if slot is not None:
        plain[-1] = slot
    prepared = prepare(request, Snapshot(plain), staging.stage)
    assert prepared is not None and prepared.fields is not None
    # through the link's reader, as the worker's frame arrives
    reader = wire.FrameReader(link.on_call, link.cancel_all, link.on_packed)
    reader.data_received(b"".join(frame(call_id, prepared.fields, prepared.head)))
    return prepared.blocks()


async def _close(service: InferenceService, link: _Link, staging: StagingArena) -> None:
    await service.shutdown(5.0)
    assert link.arena is not None
    link.arena.worker_exited()  # nothing held: its segments and socket close
    staging.close()


async def _until(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)  # polling the loop's callbacks, which answer
    raise AssertionError(what)


def _freed(frames: _Frames) -> list[int]:
    return [n for header in frames.of_kind(wire.FREE) for n in header[2]]


def test_a_relayed_call_is_answered_and_its_block_comes_back(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        try:
            values = np.arange(2000, dtype=np.float32)  # 8,000 bytes: a worker block
            (block,) = _call(link, staging, 5, values)
            await _until(lambda: frames.of_kind(wire.OK), "no answer")
            (answer,) = frames.of_kind(wire.OK)
            payloads = next(p for h, p in frames.frames if h[0] == wire.OK)
            (output,) = response_wire.response_from_wire(answer[2:], payloads).outputs
            assert answer[1] == 5 and output.name == "Y" and output.datatype == "FP32"
            np.testing.assert_array_equal(np.frombuffer(output.data, np.float32), values * 2)
            del output
            await _until(lambda: _freed(frames), "the block never came back")
            assert _freed(frames) == [block.segment, block.offset, block.nbytes]
            assert link.arena is not None and link.arena.held == 0 and not link.calls
            stats = service.model_statistics("echo")[0]
            assert stats.inference_stats.success.count == 1
            # the empty containers its record and request shared are empty still
            shared = [getattr(packed, name) for name in dir(packed) if name.startswith("_EMPTY")]
            assert len(shared) == 6 and not any(shared) and not packed._NO_PARAMS
        finally:
            await _close(service, link, staging)

    asyncio.run(run())


def test_a_stale_snapshot_hands_the_call_back_with_its_blocks(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        try:
            (block,) = _call(link, staging, 9, np.ones(3000, np.float32), stale=True)
            await asyncio.sleep(0.01)
            (refused,) = frames.of_kind(wire.STALE)
            assert refused[1:] == [9, True, [block.segment, block.offset, block.nbytes]]
            assert not frames.of_kind(wire.OK) and not _freed(frames)  # still the worker's
            assert link.arena is not None and link.arena.held == 0 and not link.calls
            stats = service.model_statistics("echo")[0]
            assert stats.inference_stats.success.count == 0
            assert stats.inference_stats.fail.count == 0  # the core's own path answers it
        finally:
            await _close(service, link, staging)

    asyncio.run(run())


def test_a_slot_the_core_never_numbered_hands_the_call_back_as_stale(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        try:
            (block,) = _call(link, staging, 4, np.ones(3000, np.float32), slot=1000)
            await _until(lambda: frames.of_kind(wire.STALE), "not handed back")
            (refused,) = frames.of_kind(wire.STALE)
            assert refused[1:] == [4, True, [block.segment, block.offset, block.nbytes]]
            assert link.arena is not None and link.arena.held == 0 and not link.calls
            # the slot the core gave the snapshot still takes the next one
            _call(link, staging, 5, np.ones(3000, np.float32))
            await _until(lambda: frames.of_kind(wire.OK), "no answer")
            assert [h[1] for h in frames.of_kind(wire.OK)] == [5]
        finally:
            await _close(service, link, staging)

    asyncio.run(run())


def test_a_cancelled_relayed_call_gives_its_block_back(service):
    worker, core = socket.socketpair()

    async def run() -> None:
        link, frames, staging = await _linked(service, worker, core)
        try:
            # the first goes to the instance, the others wait (queued, or sent ahead)
            blocks = [_call(link, staging, i, np.ones(3000, np.float32))[0] for i in (1, 2, 3)]
            link.on_call([wire.CANCEL, 3], [])
            link.on_call([wire.CANCEL, 2], [])
            flat = [n for b in blocks for n in (b.segment, b.offset, b.nbytes)]
            await _until(lambda: sorted(_freed(frames)) == sorted(flat), "blocks not back")
            assert [h[1] for h in frames.of_kind(wire.OK)] == [1]  # no answer to a cancelled
            assert link.arena is not None and link.arena.held == 0 and not link.calls
        finally:
            await _close(service, link, staging)

    asyncio.run(run())
