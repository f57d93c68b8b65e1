"""Responses a worker reads in place: the core lends their blocks, the worker releases them."""

from __future__ import annotations

import os
import socket

import pytest

from shoal.core.types import InferOutput, InferResponse
from shoal.frontends.workers.arenas import INLINE_MAX
from shoal.frontends.workers.outputs import LentOutputs, MappedOutputs
from shoal.ipc.arena import OwnedArena, UnknownSegmentError
from shoal.supervisor.memory.segments import SegmentDirectory

pytestmark = pytest.mark.timeout(30)


def test_a_worker_reads_outputs_in_place_until_it_releases_them():
    core_sock, worker_sock = socket.socketpair()
    arena = OwnedArena(0, initial_bytes=1 << 20)
    directory = SegmentDirectory(arena)
    drops: list[tuple[int, int]] = []
    lent = LentOutputs(core_sock, directory, 1 << 32, lambda a, i: drops.append((a, i)))
    mapped = MappedOutputs(worker_sock, None)
    released: list[str] = []

    data = os.urandom(INLINE_MAX)
    block = arena.allocate(len(data))
    arena.view(block)[:] = data
    big = InferOutput("BIG", "UINT8", (len(data),), arena.view(block), placed=block)
    small = InferOutput("SMALL", "UINT8", (3,), memoryview(b"abc"), placed=arena.allocate(3))
    assert lent.describe(small) is None  # small: its bytes go inline
    where = lent.describe(big)
    assert where == [0, block.segment, block.offset, block.nbytes]
    view = mapped.view(where)
    assert bytes(view) == data and view.readonly
    assert lent.describe(big) == where  # the fd went once

    first = lent.hold(InferResponse("m", "1", _release=lambda: released.append("first")))
    lent.hold(InferResponse("m", "1", _release=lambda: released.append("second")))
    lent.release(first)
    lent.release(first)  # once only
    assert released == ["first"]

    directory.segment_retired(0, block.segment)  # the segment goes: the worker is told
    assert drops == [(0, block.segment)]
    del view
    mapped.drop(0, block.segment)
    with pytest.raises(UnknownSegmentError):
        mapped.view(where)

    lent.close()  # the worker died: what it held goes back
    assert released == ["first", "second"]
    directory.segment_retired(0, block.segment)
    assert len(drops) == 1  # a closed link hears nothing more
    mapped.close()
    core_sock.close()
    worker_sock.close()
    del big, small  # views of the arena: its mapping goes with the last
    arena.close()
