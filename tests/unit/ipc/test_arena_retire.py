"""Retiring empty segments: the limit never blocks an allocation that empty segments could make
room for, idle growth segments go back to the OS, ids are never reused, peers drop retired ones."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ipc import messages as msg
from shoal.ipc._alloc import align_up, cover
from shoal.ipc.arena import (
    ArenaExhausted,
    ArenaMap,
    Block,
    OwnedArena,
    Segment,
    UnknownSegmentError,
)

KIB = 1024
INITIAL, GROWTH, LIMIT = 4 * KIB, 4 * KIB, 32 * KIB
RETIRE_AFTER = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Watched:
    """An arena and what it told its owner: segments created and retired, in order."""

    def __init__(self, **kwargs: object) -> None:
        self.clock = Clock()
        self.created: list[Segment] = []
        self.retired: list[Segment] = []
        options: dict[str, object] = {
            "initial_bytes": INITIAL,
            "growth_bytes": GROWTH,
            "limit_bytes": LIMIT,
            "retire_after": RETIRE_AFTER,
            "clock": self.clock,
            "on_new_segment": self.created.append,
            "on_retired_segment": self.retired.append,
            **kwargs,
        }
        self.arena = OwnedArena(11, **options)  # type: ignore[arg-type]

    def ids(self) -> list[int]:
        return [s.index for s in self.arena.segments]

    def close(self) -> None:
        self.arena.close()


operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, LIMIT + 2 * KIB)),
        st.tuples(st.just("free"), st.integers(0, 1 << 16)),
        st.tuples(st.just("tick"), st.integers(0, 2 * int(RETIRE_AFTER))),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_retirement_properties(ops: list[tuple[str, int]]) -> None:
    watched = Watched()
    arena = watched.arena
    live: list[Block] = []
    try:
        for op, arg in ops:
            if op == "alloc":
                was_empty = arena.used_bytes == 0
                try:
                    block = arena.allocate(arg)
                except ArenaExhausted as exc:
                    assert align_up(arg) > exc.available
                    assert not (was_empty and align_up(arg) <= LIMIT), "an empty arena refused"
                    continue
                arena.view(block)[:] = bytes([block.offset // 64 % 251]) * block.nbytes
                live.append(block)
            elif op == "free" and live:
                block = live.pop(arg % len(live))
                assert arena.view(block) == bytes([block.offset // 64 % 251]) * block.nbytes
                arena.free(block)
            elif op == "tick":
                watched.clock.now += arg
                arena.retire_idle()
            check_invariants(watched, live)
        watched.clock.now += RETIRE_AFTER
        arena.retire_idle()
        for segment in arena.segments:
            # An empty segment outlives an idle period only if it is the base segment.
            assert segment.index == 0 or any(b.segment == segment.index for b in live)
    finally:
        watched.close()


def check_invariants(watched: Watched, live: list[Block]) -> None:
    arena = watched.arena
    created = [s.index for s in watched.created]
    retired = {s.index for s in watched.retired}
    assert created == sorted(set(created)), "a segment id was used twice"
    assert set(watched.ids()) == set(created) - retired
    assert arena.capacity_bytes == sum(s.size for s in arena.segments) <= LIMIT
    for segment in watched.retired:
        assert segment.closed and segment.fd is None
    for block in live:
        assert block.segment not in retired, "a segment was retired under a live block"


def test_fragmented_arena_makes_room_for_a_large_block() -> None:
    """The bug of docs/hardening.md item 5: eight one-segment blocks grow the arena to its limit;
    once they are freed a block of four segments' size must still fit."""
    watched = Watched()
    arena = watched.arena
    try:
        blocks = [arena.allocate(GROWTH) for _ in range(8)]
        assert watched.ids() == list(range(8)) and arena.capacity_bytes == LIMIT
        for block in blocks:
            arena.free(block)
        big = arena.allocate(4 * GROWTH)
        # Four empty growth segments, oldest first, make room; the base stays.
        assert [s.index for s in watched.retired] == [1, 2, 3, 4]
        assert big.segment == 8 and watched.ids() == [0, 5, 6, 7, 8]
        arena.free(big)
        whole = arena.allocate(LIMIT)  # an empty arena takes a block of the whole limit
        assert whole.segment == 9 and watched.ids() == [9]
        assert sorted(s.index for s in watched.retired[4:]) == [0, 5, 6, 7, 8]
        assert arena.capacity_bytes == LIMIT
        with pytest.raises(ArenaExhausted) as info:
            arena.allocate(64)  # nothing is empty now: nothing may be retired
        assert info.value.available == 0
        arena.free(whole)
        assert arena.allocate(64).segment == 9
    finally:
        watched.close()


def test_retirement_picks_few_empty_segments() -> None:
    watched = Watched()
    arena = watched.arena
    try:
        sizes = [INITIAL, GROWTH, 2 * GROWTH, GROWTH, 2 * GROWTH]  # segments 0-4: 28 KiB of 32
        blocks = [arena.allocate(size) for size in sizes]
        assert [b.segment for b in blocks] == [0, 1, 2, 3, 4]
        for block in blocks[1:4]:
            arena.free(block)
        arena.allocate(3 * GROWTH)  # 8 KiB short: the 8 KiB segment alone, not two of 4 KiB
        assert [s.index for s in watched.retired] == [2]
        arena.allocate(2 * GROWTH)  # 8 KiB short again: both 4 KiB ones
        assert [s.index for s in watched.retired] == [2, 1, 3]
        assert watched.ids() == [0, 4, 5, 6] and arena.capacity_bytes == LIMIT
    finally:
        watched.close()


def test_idle_growth_segments_are_retired_after_a_while() -> None:
    watched = Watched()
    arena, clock = watched.arena, watched.clock
    try:
        blocks = [arena.allocate(GROWTH) for _ in range(3)]
        for block in blocks:
            arena.free(block)
        assert arena.retire_idle() == 0 and watched.ids() == [0, 1, 2]
        clock.now += RETIRE_AFTER / 2
        reused = arena.allocate(GROWTH)  # most recently freed first: segment 2, busy again
        assert reused.segment == 2
        clock.now += RETIRE_AFTER / 2
        assert arena.retire_idle() == 1 and watched.ids() == [0, 2]
        clock.now += RETIRE_AFTER
        arena.free(reused)  # a free that empties a segment also retires idle ones
        assert watched.ids() == [0, 2]
        clock.now += RETIRE_AFTER
        assert arena.retire_idle() == 1 and watched.ids() == [0]  # the base segment stays
        assert arena.capacity_bytes == INITIAL
        base, growth = arena.allocate(GROWTH), arena.allocate(GROWTH)
        arena.free(growth)
        clock.now += RETIRE_AFTER
        arena.free(base)  # emptying the base segment, too, retires idle ones
        assert watched.ids() == [0]
    finally:
        watched.close()


def test_retired_named_segment_is_unlinked() -> None:
    watched = Watched(backend="posix", retire_after=0.0)
    arena = watched.arena
    try:
        first, second = arena.allocate(GROWTH), arena.allocate(GROWTH)
        name = arena.segment(second.segment).name
        assert name is not None and os.path.exists("/dev/shm" + name)
        arena.free(second)  # retire_after 0: retired as soon as it is empty
        assert not os.path.exists("/dev/shm" + name)
        with pytest.raises(UnknownSegmentError, match="segment 1 of arena 11 was retired"):
            arena.segment(second.segment)
        arena.free(first)
        assert watched.ids() == [0]
    finally:
        watched.close()


def test_peer_drops_retired_segments_mapped_pending_or_announced_late() -> None:
    watched = Watched(retire_after=0.0)
    arena = watched.arena
    try:
        with ArenaMap() as peer:
            blocks = [arena.allocate(GROWTH) for _ in range(3)]
            for segment in arena.segments:
                assert segment.fd is not None
                peer.add_fd(11, segment.index, os.dup(segment.fd), segment.size)
            fd_late = os.dup(arena.segment(2).fd)  # type: ignore[arg-type]
            assert bytes(peer.view(blocks[1])[:4]) == bytes(4)  # segment 1 is mapped
            arena.free(blocks[1])
            arena.free(blocks[2])
            for segment in watched.retired:
                peer.retire(11, segment.index)
            assert [s.index for s in watched.retired] == [1, 2]
            # An announcement that crossed the retirement is closed at once.
            peer.add_fd(11, 2, fd_late, GROWTH)
            with pytest.raises(OSError):
                os.fstat(fd_late)
            assert peer.has(11, 1)  # known: a block naming it fails, it does not wait
            with pytest.raises(UnknownSegmentError, match="segment 1 of arena 11 was retired"):
                peer.view(blocks[1])
            assert bytes(peer.view(blocks[0])[:4]) == bytes(4)
    finally:
        watched.close()


def test_cover_picks_few_segments() -> None:
    sizes = {1: 4, 2: 4, 3: 12, 4: 8}
    assert cover(sizes, 6) == [4]  # the smallest that covers it alone
    assert cover(sizes, 12) == [3]
    assert cover(sizes, 20) == [3, 4]  # else the largest first
    assert cover(sizes, 28) == [3, 4, 1, 2]
    assert cover(sizes, 29) is None
    assert cover({}, 1) is None


def test_segment_retired_message_round_trip() -> None:
    message = msg.SegmentRetired(3, 7)
    assert msg.decode(msg.encode(message)) == message
