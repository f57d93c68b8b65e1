"""A frontend worker's input arena: the worker places inputs, the core lends and gives back."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from shoal.core.errors import Unavailable
from shoal.core.types import InferInput, InferRequest
from shoal.frontends.workers.arenas import INLINE_MAX, LentArena, StagingArena
from shoal.ipc.arena import OwnedArena
from shoal.supervisor.memory.segments import SegmentDirectory

pytestmark = pytest.mark.timeout(30)

ARENA = 1 << 32


def _staging(sock: socket.socket, retired: list[int]) -> StagingArena:
    return StagingArena(
        ARENA,
        sock,
        initial_bytes=1 << 20,
        growth_bytes=1 << 20,
        limit_bytes=4 << 20,
        on_retired=retired.append,
    )


def test_placed_blocks_reach_the_core_by_descriptor_and_come_back():
    worker_sock, core_sock = socket.socketpair()
    staging = _staging(worker_sock, [])
    directory = SegmentDirectory(OwnedArena(0, initial_bytes=1 << 16))
    sent: list[list[int]] = []

    async def run() -> None:
        lent = LentArena(ARENA, core_sock, directory, sent.append)
        assert staging.place(memoryview(b"x" * (INLINE_MAX - 1))) is None  # small: inline
        data = os.urandom(INLINE_MAX * 2)
        block = staging.place(memoryview(data))
        assert block is not None and block.arena_id == ARENA
        lent_block, view = lent.lend(block.segment, block.offset, block.nbytes)
        assert lent_block == block and bytes(view) == data and view.readonly
        assert bytes(directory.view(block)) == data  # the core finds it by arena id
        fd, size = directory.fd(ARENA, block.segment)  # what a stub will be sent
        assert size >= block.nbytes and fd >= 0
        directory.free_inputs([block])  # the stub is done with it: back to the worker
        await asyncio.sleep(0)
        assert sent == [[block.segment, block.offset, block.nbytes]]
        staging.free(sent[0])
        assert staging.arena.used_bytes == 0 and lent.held == 0
        lent.worker_exited()  # nothing held: detached at once
        with pytest.raises(Unavailable):
            directory.segment(ARENA, block.segment)

    asyncio.run(run())
    staging.close()
    directory.input_arena.close()


def test_a_dead_workers_arena_stays_until_the_core_gives_its_last_block_back():
    worker_sock, core_sock = socket.socketpair()
    staging = _staging(worker_sock, [])
    directory = SegmentDirectory(OwnedArena(0, initial_bytes=1 << 16))
    sent: list[list[int]] = []

    async def run() -> None:
        lent = LentArena(ARENA, core_sock, directory, sent.append)
        first = staging.place(memoryview(bytes(INLINE_MAX)))
        second = staging.place(memoryview(bytes(INLINE_MAX)))
        assert first is not None and second is not None
        _, view = lent.lend(first.segment, first.offset, first.nbytes)
        lent.lend(second.segment, second.offset, second.nbytes)
        staging.close()  # the worker dies...
        lent.worker_exited()
        directory.free_inputs([first])  # a stub finished with one request
        assert bytes(directory.view(second)) == bytes(INLINE_MAX)  # still mapped
        # ... and the other request was never staged: its maker gives its block back.
        request = InferRequest("m", inputs=[InferInput("A", "FP32", (1,), view, placed=second)])
        lent.give_back(request)
        assert request.inputs[0].placed is None and lent.held == 0
        with pytest.raises(Unavailable):
            directory.segment(ARENA, second.segment)
        await asyncio.sleep(0)
        assert sent == []  # nothing is sent to a dead worker

    asyncio.run(run())
    directory.input_arena.close()


def test_a_retired_worker_segment_is_dropped_by_the_core():
    worker_sock, core_sock = socket.socketpair()
    retired: list[int] = []
    staging = StagingArena(
        ARENA,
        worker_sock,
        initial_bytes=0,
        growth_bytes=1 << 20,
        limit_bytes=4 << 20,
        on_retired=retired.append,
    )
    staging.arena.retire_after = 0.0
    directory = SegmentDirectory(OwnedArena(0, initial_bytes=1 << 16))

    async def run() -> None:
        lent = LentArena(ARENA, core_sock, directory, lambda flat: None)
        block = staging.place(memoryview(bytes(INLINE_MAX)))
        assert block is not None
        lent.lend(block.segment, block.offset, block.nbytes)
        staging.free([block.segment, block.offset, block.nbytes])  # empty: retired at once
        assert retired == [block.segment]
        lent.retired(block.segment)
        with pytest.raises(Exception, match="retired"):
            directory.segment(ARENA, block.segment)
        lent.worker_exited()
        lent.give_back(InferRequest("m"))
        lent.free([block])

    asyncio.run(run())
    staging.close()
    directory.input_arena.close()


def test_a_block_received_into_is_placed_as_it_is():
    worker_sock, core_sock = socket.socketpair()
    staging = _staging(worker_sock, [])
    received = staging.receive(INLINE_MAX * 2)
    assert received is not None
    view, token = received
    view[:] = os.urandom(view.nbytes)
    block = staging.place(view.toreadonly())  # a view of all of it, as decoding makes
    assert block is not None and bytes(staging.arena.view(block)) == bytes(view)
    assert staging.arena.used_bytes == block.nbytes  # no second block: no copy
    staging.discard(token)  # handed on: the core owns it, nothing is freed
    assert staging.arena.used_bytes == block.nbytes
    staging.free([block.segment, block.offset, block.nbytes])
    assert staging.arena.used_bytes == 0
    staging.close()
    core_sock.close()


def test_a_block_received_into_and_not_placed_is_discarded():
    worker_sock, core_sock = socket.socketpair()
    staging = _staging(worker_sock, [])
    received = staging.receive(INLINE_MAX * 2)
    assert received is not None
    view, token = received
    part = staging.place(view[: INLINE_MAX + 1].toreadonly())  # not the whole block: a copy
    assert part is not None and staging.arena.used_bytes > INLINE_MAX * 2
    staging.free([part.segment, part.offset, part.nbytes])
    staging.discard(token)
    assert staging.arena.used_bytes == 0
    staging.discard(token)  # twice: nothing more happens
    assert staging.arena.used_bytes == 0
    staging.close()
    core_sock.close()


def test_discarding_a_placed_block_leaves_a_new_one_at_its_address_alone():
    worker_sock, core_sock = socket.socketpair()
    staging = _staging(worker_sock, [])
    first = staging.receive(INLINE_MAX * 2)
    assert first is not None
    block = staging.place(first[0].toreadonly())
    assert block is not None
    staging.free([block.segment, block.offset, block.nbytes])  # the core is done with it
    second = staging.receive(INLINE_MAX * 2)  # the same place again
    assert second is not None
    staging.discard(first[1])  # the first call ends late
    assert staging.arena.used_bytes > 0  # the second call's block is still there
    assert staging.place(second[0].toreadonly()) is not None
    staging.close()
    core_sock.close()


def test_receive_gives_none_when_the_arena_is_full():
    worker_sock, core_sock = socket.socketpair()
    staging = _staging(worker_sock, [])
    assert staging.receive(8 << 20) is None  # over the 4 MiB limit
    staging.close()
    core_sock.close()
