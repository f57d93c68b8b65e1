"""OwnedArena / ArenaMap: allocator properties, growth, the limit, backends and cleanup."""

from __future__ import annotations

import itertools
import os
import re
import subprocess

import numpy as np
import posix_ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ipc._alloc import RunAllocator, align_up
from shoal.ipc.arena import (
    ArenaExhausted,
    ArenaMap,
    Block,
    OwnedArena,
    Segment,
    UnknownSegmentError,
    remove_stale_segments,
)

KIB = 1024
INITIAL, GROWTH, LIMIT = 4 * KIB, 8 * KIB, 40 * KIB

# An operation is ("alloc", nbytes) or ("free", index into the live blocks).
operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 12 * KIB)),
        st.tuples(st.just("free"), st.integers(0, 1 << 16)),
    ),
    max_size=60,
)


def check_layout(arena: OwnedArena, live: list[Block]) -> None:
    sizes = {segment.index: segment.size for segment in arena.segments}
    spans = sorted((b.segment, b.offset, b.offset + align_up(b.nbytes)) for b in live if b.nbytes)
    for block in live:
        if block.nbytes:
            assert block.offset % 64 == 0
            assert block.offset + block.nbytes <= sizes[block.segment]
    for (seg_a, _, end_a), (seg_b, start_b, _) in itertools.pairwise(spans):
        assert seg_a != seg_b or end_a <= start_b, "blocks overlap"
    assert arena.used_bytes == sum(align_up(b.nbytes) for b in live)
    assert arena.capacity_bytes == sum(sizes.values()) <= LIMIT


def expected_available(arena: OwnedArena) -> int:
    """The largest free run, or a new segment in the room under the limit plus every empty
    segment (which the arena would retire to make it)."""
    runs = arena.free_runs()
    whole = {(s.index, 0, s.size) for s in arena.segments}
    empty = sum(run[2] for run in runs if run in whole)
    room = LIMIT - arena.capacity_bytes + empty
    return max(max((size for _, _, size in runs), default=0), room - room % 64)


def fill(view: memoryview, block: Block) -> None:
    view[:] = bytes([block.offset // 64 % 251]) * block.nbytes


@settings(max_examples=150, deadline=None)
@given(operations)
def test_allocator_properties(ops: list[tuple[str, int]]) -> None:
    with OwnedArena(7, initial_bytes=INITIAL, growth_bytes=GROWTH, limit_bytes=LIMIT) as arena:
        live: list[Block] = []
        for op, arg in ops:
            if op == "alloc":
                try:
                    block = arena.allocate(arg)
                except ArenaExhausted as exc:
                    assert (exc.requested, exc.limit) == (arg, LIMIT)
                    assert exc.available == expected_available(arena)
                    assert align_up(arg) > exc.available
                    continue
                fill(arena.view(block), block)
                live.append(block)
            elif live:
                block = live.pop(arg % len(live))
                assert arena.view(block) == bytes([block.offset // 64 % 251]) * block.nbytes
                arena.free(block)
            check_layout(arena, live)
        for block in live:
            arena.free(block)
        assert arena.used_bytes == 0
        assert arena.free_runs() == [(s.index, 0, s.size) for s in arena.segments]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 1 << 20)), max_size=200))
def test_run_allocator_coalesces_back_to_whole_segments(ops: list[tuple[bool, int]]) -> None:
    runs = RunAllocator()
    runs.add_segment(0, 1 << 22)
    runs.add_segment(1, 1 << 21)
    live: list[int] = []
    for allocate, arg in ops:
        if allocate:
            key = runs.take(align_up(arg))
            if key is not None:
                live.append(key)
        elif live:
            runs.give(live.pop(arg % len(live)))
    for key in live:
        runs.give(key)
    assert runs.free_runs() == [(0, 0, 1 << 22), (1, 0, 1 << 21)]
    assert runs.used_bytes == 0


def test_recently_freed_block_is_reused_first() -> None:
    with OwnedArena(1, initial_bytes=64 * KIB, growth_bytes=64 * KIB, limit_bytes=64 * KIB) as a:
        blocks = [a.allocate(1000) for _ in range(8)]
        a.free(blocks[2])
        a.free(blocks[5])
        assert a.allocate(1000) == blocks[5]


def test_grows_by_segments_up_to_the_limit() -> None:
    grown: list[Segment] = []
    with OwnedArena(
        2,
        initial_bytes=INITIAL,
        growth_bytes=GROWTH,
        limit_bytes=LIMIT,
        on_new_segment=grown.append,
    ) as arena:
        first = arena.allocate(INITIAL)
        second = arena.allocate(100)
        assert (first.segment, second.segment) == (0, 1)
        assert [s.size for s in grown] == [INITIAL, GROWTH]
        big = arena.allocate(20 * KIB)  # larger than growth_bytes: its own segment, sized to fit
        assert big.segment == 2 and grown[2].size == 20 * KIB
        with pytest.raises(ArenaExhausted) as info:
            arena.allocate(16 * KIB)  # no segment is empty: none can be retired to make room
        exc = info.value
        assert (exc.requested, exc.limit) == (16 * KIB, LIMIT)
        assert exc.available == LIMIT - arena.capacity_bytes == 8 * KIB
        for text in ("16384", str(exc.available), str(LIMIT), "shm-limit-byte-size"):
            assert text in str(exc)
        last = arena.allocate(LIMIT - arena.capacity_bytes)  # the remaining headroom fits exactly
        assert arena.capacity_bytes == LIMIT and last.segment == 3


def test_zero_byte_blocks_and_bad_frees() -> None:
    with OwnedArena(3, initial_bytes=INITIAL, growth_bytes=GROWTH, limit_bytes=LIMIT) as arena:
        empty = arena.allocate(0)
        assert empty.nbytes == 0 and len(arena.view(empty)) == 0
        arena.free(empty)
        block = arena.allocate(10)
        with pytest.raises(ValueError, match="does not belong"):
            arena.free(Block(4, block.segment, block.offset, block.nbytes))
        with pytest.raises(ValueError, match="not allocated"):
            arena.free(Block(3, block.segment, block.offset + 64, 10))
        arena.free(block)
        with pytest.raises(ValueError, match="double free"):
            arena.free(block)
        with pytest.raises(ValueError):
            arena.allocate(-1)


def test_block_wire_round_trip() -> None:
    block = Block(1, 2, 128, 77)
    assert Block.from_wire(block.to_wire()) == block
    with pytest.raises(ValueError):
        Block.from_wire([1, 2, 3])


@pytest.mark.parametrize("backend", ["memfd", "posix"])
def test_peer_map_sees_owner_writes(backend: str) -> None:
    with (
        OwnedArena(
            5, initial_bytes=INITIAL, growth_bytes=GROWTH, limit_bytes=LIMIT, backend=backend
        ) as arena,
        ArenaMap() as peer,
    ):
        for segment in arena.segments:
            if backend == "memfd":
                assert segment.fd is not None and segment.name is None
                peer.add_fd(5, segment.index, os.dup(segment.fd), segment.size)
            else:
                assert re.fullmatch(
                    rf"/shoal-{os.getpid()}-[0-9a-f]{{16}}-5-{segment.index}", segment.name
                )
                assert os.path.exists("/dev/shm" + segment.name)
                peer.add_named(5, segment.index, segment.name, segment.size)
        block = arena.allocate(1000)
        arena.view(block)[:] = bytes(range(200)) * 5
        assert peer.has(5, 0) and not peer.has(5, 1)
        assert bytes(peer.view(block)) == bytes(range(200)) * 5
        peer.view(block)[:4] = b"peer"
        assert bytes(arena.view(block)[:4]) == b"peer"
        with pytest.raises(UnknownSegmentError, match="segment 1 of arena 5"):
            peer.view(Block(5, 1, 0, 10))
        with pytest.raises(ValueError, match="outside"):
            peer.view(Block(5, 0, INITIAL - 64, 128))
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"shoal-{os.getpid()}")]


def test_close_with_live_numpy_views_is_safe() -> None:
    arena = OwnedArena(6, initial_bytes=INITIAL, growth_bytes=GROWTH, limit_bytes=LIMIT)
    block = arena.allocate(64)
    array = np.frombuffer(arena.view(block), dtype=np.uint8)
    array[:] = 1
    arena.close()
    arena.close()
    assert array.sum() == 64  # the mapping outlives close() while a view holds it
    del array


def test_invalid_configuration() -> None:
    with pytest.raises(ValueError, match="backend"):
        OwnedArena(1, initial_bytes=0, growth_bytes=1, limit_bytes=1, backend="tmpfs")
    with pytest.raises(ValueError, match="shm-default-byte-size"):
        OwnedArena(1, initial_bytes=2 * LIMIT, growth_bytes=GROWTH, limit_bytes=LIMIT)


def test_stale_named_segments_of_dead_owners_are_removed() -> None:
    dead_pid = _dead_pid()
    stale = posix_ipc.SharedMemory(f"/shoal-{dead_pid}-1-0", posix_ipc.O_CREX, size=4096)
    stale.close_fd()
    with OwnedArena(
        8, initial_bytes=INITIAL, growth_bytes=GROWTH, limit_bytes=LIMIT, backend="posix"
    ) as live:
        assert f"/shoal-{dead_pid}-1-0" in remove_stale_segments()
        assert not os.path.exists(f"/dev/shm/shoal-{dead_pid}-1-0")
        assert os.path.exists("/dev/shm" + live.segments[0].name)  # type: ignore[operator]


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid  # reaped: no process has this pid until it is reused


def test_a_private_view_reads_the_block_and_keeps_its_writes_to_itself():
    with OwnedArena(1, initial_bytes=64 * KIB, limit_bytes=64 * KIB) as arena:
        block = arena.allocate(3 * 4096 + 100)  # more than a page, not page-aligned at the end
        other = arena.allocate(4096)
        shared = np.frombuffer(arena.view(block), dtype=np.uint8)
        shared[:] = 7
        private_bytes = arena.private_view(block)
        assert private_bytes is not None and private_bytes.nbytes == block.nbytes
        private = np.frombuffer(private_bytes, dtype=np.uint8)
        assert (private == 7).all()
        private[: 4096 + 1] = 9  # two pages copied on write
        assert (shared == 7).all(), "the owner's bytes changed"
        shared[-1] = 5  # a page the private view never wrote still shows the owner's bytes
        assert private[-1] == 5 and private[4096] == 9
        assert arena.private_view(Block(1, 0, 0, 0)) is None
        with ArenaMap() as peer:
            segment = arena.segment(block.segment)
            assert segment.fd is not None
            peer.add_fd(1, block.segment, os.dup(segment.fd), segment.size)
            arena.view(other)[0] = 3
            seen = peer.private_view(other)
            assert seen is not None and seen.nbytes == 4096 and seen[0] == 3
            seen[0] = 1
            assert arena.view(other)[0] == 3


def test_a_named_segment_has_no_private_view():
    arena = OwnedArena(2, initial_bytes=8 * KIB, limit_bytes=8 * KIB, backend="posix")
    try:
        assert arena.private_view(arena.allocate(100)) is None
    finally:
        arena.close()
