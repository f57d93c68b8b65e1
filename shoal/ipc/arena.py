"""Shared-memory arenas: one owner allocates and frees blocks, peers map segments lazily.

See docs/ipc.md for who owns which arena and how released blocks travel back to their owner.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shoal.ipc._alloc import ALIGN, RunAllocator, align_up, cover, make_key, split_key
from shoal.ipc._errors import UnknownSegmentError
from shoal.ipc._segment import (
    Segment,
    create_memfd,
    create_named,
    map_fd,
    map_named,
    page_align,
    private_view,
    remove_stale_segments,
)

__all__ = [
    "ALIGN",
    "DEFAULT_GROWTH_BYTES",
    "DEFAULT_INITIAL_BYTES",
    "DEFAULT_LIMIT_BYTES",
    "DEFAULT_RETIRE_AFTER_S",
    "ArenaExhausted",
    "ArenaMap",
    "Block",
    "OwnedArena",
    "Segment",
    "UnknownSegmentError",
    "private_block_view",
    "private_view",
    "remove_stale_segments",
]

DEFAULT_INITIAL_BYTES = 64 << 20
DEFAULT_GROWTH_BYTES = 64 << 20
DEFAULT_LIMIT_BYTES = 1 << 30
#: A growth segment that stays empty this long is retired: long enough that a steady load does
#: not unmap and re-create segments, short enough that a burst's memory goes back to the OS.
DEFAULT_RETIRE_AFTER_S = 30.0

#: Names of the settings that size an arena, quoted in ArenaExhausted messages. The first two are
#: Triton's python-backend settings; the limit is shoal's own.
KNOB_INITIAL = "shm-default-byte-size"
KNOB_GROWTH = "shm-growth-byte-size"
KNOB_LIMIT = "shm-limit-byte-size"

BACKENDS = ("memfd", "posix")


@dataclass(slots=True)
class Block:
    """A byte range inside an arena segment; also the location of a tensor in an arena.

    Immutable (``Final`` fields) and hashable. ``__init__``, ``__eq__`` and ``__hash__`` are
    written out: ``dataclass``'s generated ones stay interpreted in the compiled hot path (a
    frozen one sets each field through ``object.__setattr__``), and a request makes several.
    """

    arena_id: Final[int]
    segment: Final[int]
    offset: Final[int]
    nbytes: Final[int]

    def __init__(self, arena_id: int, segment: int, offset: int, nbytes: int) -> None:
        self.arena_id = arena_id
        self.segment = segment
        self.offset = offset
        self.nbytes = nbytes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Block):
            return NotImplemented
        return (
            self.offset == other.offset
            and self.segment == other.segment
            and self.arena_id == other.arena_id
            and self.nbytes == other.nbytes
        )

    def __hash__(self) -> int:
        return hash((self.arena_id, self.segment, self.offset, self.nbytes))

    def to_wire(self) -> list[int]:
        return [self.arena_id, self.segment, self.offset, self.nbytes]

    @staticmethod
    def from_wire(obj: list[int]) -> Block:
        if len(obj) != 4:
            raise ValueError(f"a block on the wire has 4 integers, got {obj!r}")
        arena_id, segment, offset, nbytes = (int(value) for value in obj)
        return Block(arena_id, segment, offset, nbytes)


class ArenaExhausted(Exception):
    """An allocation does not fit even after growing the arena to its limit.

    Recoverable: the request that needed the block fails (RESOURCE_EXHAUSTED); others go on.
    """

    def __init__(self, arena_id: int, requested: int, available: int, limit: int) -> None:
        self.arena_id = arena_id
        self.requested = requested
        self.available = available
        self.limit = limit
        super().__init__(
            f"shared-memory arena {arena_id} cannot allocate {requested} bytes: {available} bytes "
            f"available (the largest block it can hold now) of a {limit}-byte limit; "
            f"raise {KNOB_LIMIT} (or {KNOB_GROWTH} / {KNOB_INITIAL}) to allow larger tensors"
        )


class OwnedArena:
    """The single owner of an arena: allocates, frees, grows and retires it. Not thread-safe.

    Segment ids only ever increase: a retired segment's id is never given to a new one, so a
    peer that still knows the id cannot mistake a new segment for the one it mapped.
    """

    def __init__(
        self,
        arena_id: int,
        *,
        initial_bytes: int = DEFAULT_INITIAL_BYTES,
        growth_bytes: int = DEFAULT_GROWTH_BYTES,
        limit_bytes: int = DEFAULT_LIMIT_BYTES,
        backend: str = "memfd",
        on_new_segment: Callable[[Segment], None] | None = None,
        on_retired_segment: Callable[[Segment], None] | None = None,
        retire_after: float = DEFAULT_RETIRE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"arena backend must be one of {BACKENDS}, got {backend!r}")
        if not 0 <= initial_bytes <= limit_bytes or growth_bytes <= 0 or retire_after < 0:
            raise ValueError(
                f"need 0 <= {KNOB_INITIAL} ({initial_bytes}) <= {KNOB_LIMIT} ({limit_bytes}), "
                f"{KNOB_GROWTH} ({growth_bytes}) > 0 and retire_after ({retire_after}) >= 0"
            )
        self.arena_id = arena_id
        self.backend = backend
        self.growth_bytes = growth_bytes
        self.limit_bytes = limit_bytes
        self.retire_after = retire_after
        self._on_new_segment = on_new_segment
        #: Told after a segment was retired (closed here), so that peers can drop it too.
        self.on_retired_segment = on_retired_segment
        self._clock = clock
        self._segments: dict[int, Segment] = {}
        self._next_index = 0
        self._alloc = RunAllocator()
        self._capacity = 0
        self._closed = False
        # Empty growth segments and since when, oldest first (re-inserted when emptied again).
        self._idle: dict[int, float] = {}
        self._base: int | None = None
        if initial_bytes:
            self._base = self._add_segment(min(page_align(initial_bytes), limit_bytes))

    @property
    def segments(self) -> list[Segment]:
        """The live segments, oldest first (retired ones are gone)."""
        return list(self._segments.values())

    def segment(self, index: int) -> Segment:
        """The live segment ``index``; UnknownSegmentError if it was retired or never existed."""
        segment = self._segments.get(index)
        if segment is None:
            raise UnknownSegmentError(
                f"segment {index} of arena {self.arena_id} was retired or never existed"
            )
        return segment

    @property
    def used_bytes(self) -> int:
        return self._alloc.used_bytes

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    def allocate(self, nbytes: int) -> Block:
        """A 64-byte aligned block of ``nbytes``; grows the arena or raises ArenaExhausted.

        Zero-byte blocks take no space; ``free()`` accepts them and does nothing.
        """
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self._check_open()
        if nbytes == 0:
            return Block(self.arena_id, 0, 0, 0)
        size = align_up(nbytes)
        key = self._alloc.take(size)
        if key is None:
            self._grow(size, nbytes)
            key = self._alloc.take(size)
            assert key is not None, "a fresh segment always fits the request"
        segment, offset = split_key(key)
        if self._idle:
            self._idle.pop(segment, None)
        return Block(self.arena_id, segment, offset, nbytes)

    def free(self, block: Block) -> None:
        """Return a block; ValueError for a double free or a block this arena did not hand out."""
        key = self._check_allocated(block)
        if not (key is not None and self._alloc.give(key)):
            return
        # A segment became empty: a moment to look at the idle ones (no clock call otherwise).
        if block.segment != self._base:
            self._idle[block.segment] = self._clock()
        if self._idle:
            self._retire_idle(self._clock())

    def retire_idle(self) -> int:
        """Retire growth segments that have been empty for ``retire_after`` seconds; how many.

        ``free()`` does this whenever it empties a segment, so an owner with traffic need not.
        """
        self._check_open()
        return self._retire_idle(self._clock())

    def view(self, block: Block) -> memoryview:
        """A writable view of exactly ``block.nbytes`` bytes."""
        self._check_allocated(block)
        if not block.nbytes:
            return memoryview(bytearray())
        return self._segments[block.segment].buf[block.offset : block.offset + block.nbytes]

    def private_view(self, block: Block) -> memoryview | None:
        """A copy-on-write view of the block (see :func:`private_block_view`)."""
        self._check_allocated(block)
        return private_block_view(self._segments[block.segment], block)

    def free_runs(self) -> list[tuple[int, int, int]]:
        """(segment, offset, size) of every free run: for tests and diagnostics."""
        return self._alloc.free_runs()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for segment in self._segments.values():
            segment.close()

    def __enter__(self) -> OwnedArena:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"arena {self.arena_id} is closed")

    def _check_allocated(self, block: Block) -> int | None:
        """Key of an allocated block (None for an empty one); ValueError otherwise."""
        if block.arena_id != self.arena_id:
            raise ValueError(f"{block} does not belong to arena {self.arena_id}")
        self._check_open()
        if block.nbytes == 0:
            return None
        key = make_key(block.segment, block.offset)
        size = self._alloc.allocated_size(key)
        if size is None or size != align_up(block.nbytes):
            raise ValueError(f"{block} is not allocated in arena {self.arena_id} (double free?)")
        return key

    def _grow(self, size: int, requested: int) -> None:
        """Add a segment that fits ``size``, retiring empty ones first if the limit is near."""
        headroom = self.limit_bytes - self._capacity
        if headroom < size and not self._retire_for(size - headroom):
            raise ArenaExhausted(self.arena_id, requested, self._available(), self.limit_bytes)
        headroom = self.limit_bytes - self._capacity
        new_size = min(max(self.growth_bytes, page_align(size)), headroom)
        self._add_segment(new_size - new_size % ALIGN)

    def _available(self) -> int:
        """The largest block that fits now: in a free run, or in a segment grown in the room
        left under the limit plus what retiring every empty segment would give back."""
        empty = sum(s.size for s in self._segments.values() if self._alloc.is_empty(s.index))
        room = self.limit_bytes - self._capacity + empty
        return max(self._alloc.largest_free(), room - room % ALIGN)

    def _retire_for(self, deficit: int) -> bool:
        """Retire empty segments worth ``deficit`` bytes; False (retiring none) if too few are.

        Growth segments go first; the base segment only when nothing else makes room.
        """
        empty = {i: s.size for i, s in self._segments.items() if self._alloc.is_empty(i)}
        growth = {i: size for i, size in empty.items() if i != self._base}
        chosen = cover(growth, deficit)
        if chosen is None:
            chosen = cover(empty, deficit)
        if chosen is None:
            return False
        for index in chosen:
            self._retire(self._segments[index])
        return True

    def _retire_idle(self, now: float) -> int:
        retired = 0
        while self._idle:
            index, since = next(iter(self._idle.items()))
            if now - since < self.retire_after:
                break
            self._retire(self._segments[index])
            retired += 1
        return retired

    def _retire(self, segment: Segment) -> None:
        index = segment.index
        self._alloc.remove_segment(index)
        del self._segments[index]
        self._idle.pop(index, None)
        self._capacity -= segment.size
        if index == self._base:
            self._base = None
        segment.close()
        if self.on_retired_segment is not None:
            self.on_retired_segment(segment)

    def _add_segment(self, size: int) -> int:
        index = self._next_index
        create = create_memfd if self.backend == "memfd" else create_named
        segment = create(self.arena_id, index, size)
        self._next_index += 1
        self._segments[index] = segment
        self._capacity += size
        self._alloc.add_segment(index, size)
        if self._on_new_segment is not None:
            self._on_new_segment(segment)
        return index


class ArenaMap:
    """A peer's view of other processes' arenas: segments are mapped on first use and cached.

    Not thread-safe: a process whose threads share one map serializes its calls.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[int, int], tuple[int | str, int]] = {}
        self._mapped: dict[tuple[int, int], Segment] = {}
        # Owners never reuse a segment id, so a retired one stays retired: an announcement
        # that arrives after the retirement (it crossed the other channel) is dropped.
        self._retired: set[tuple[int, int]] = set()

    def add_fd(self, arena_id: int, segment: int, fd: int, size: int) -> None:
        """Register a memfd segment; the map owns ``fd`` from now on."""
        if (arena_id, segment) in self._retired:
            os.close(fd)
            return
        self._replace((arena_id, segment), (fd, size))

    def add_named(self, arena_id: int, segment: int, name: str, size: int) -> None:
        if (arena_id, segment) not in self._retired:
            self._replace((arena_id, segment), (name, size))

    def has(self, arena_id: int, segment: int) -> bool:
        """The segment was announced (it may have been retired since: then view() raises)."""
        key = (arena_id, segment)
        return key in self._mapped or key in self._pending or key in self._retired

    def retire(self, arena_id: int, segment: int) -> None:
        """The owner retired this segment: unmap it and close its fd now.

        Views still alive keep their pages mapped until they are collected (see Segment.close).
        """
        key = (arena_id, segment)
        self._retired.add(key)
        pending = self._pending.pop(key, None)
        if pending is not None and isinstance(pending[0], int):
            os.close(pending[0])
        mapped = self._mapped.pop(key, None)
        if mapped is not None:
            mapped.close()

    def segment(self, arena_id: int, index: int) -> Segment:
        key = (arena_id, index)
        mapped = self._mapped.get(key)
        if mapped is not None:
            return mapped
        pending = self._pending.pop(key, None)
        if pending is None:
            how = "was retired by its owner" if key in self._retired else "was never announced"
            raise UnknownSegmentError(f"segment {index} of arena {arena_id} {how}")
        source, size = pending
        if isinstance(source, int):
            mapped = map_fd(arena_id, index, source, size)
        else:
            mapped = map_named(arena_id, index, source, size)
        self._mapped[key] = mapped
        return mapped

    def view(self, block: Block) -> memoryview:
        """A writable view of the block's bytes in the peer's segment."""
        if block.nbytes == 0:
            return memoryview(bytearray())
        segment = self.segment(block.arena_id, block.segment)
        if block.offset < 0 or block.offset + block.nbytes > segment.size:
            raise ValueError(f"{block} lies outside its {segment.size}-byte segment")
        return segment.buf[block.offset : block.offset + block.nbytes]

    def private_view(self, block: Block) -> memoryview | None:
        """A copy-on-write view of the block (see :func:`private_block_view`)."""
        return private_block_view(self.segment(block.arena_id, block.segment), block)

    def close(self) -> None:
        for source, _ in self._pending.values():
            if isinstance(source, int):
                os.close(source)
        self._pending.clear()
        for segment in self._mapped.values():
            segment.close()
        self._mapped.clear()

    def __enter__(self) -> ArenaMap:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _replace(self, key: tuple[int, int], entry: tuple[int | str, int]) -> None:
        # A re-announced segment (e.g. an arena re-created after a stub restart) replaces the old.
        old = self._pending.pop(key, None)
        if old is not None and isinstance(old[0], int):
            os.close(old[0])
        mapped = self._mapped.pop(key, None)
        if mapped is not None:
            mapped.close()
        self._pending[key] = entry


def private_block_view(segment: Segment, block: Block) -> memoryview | None:
    """A writable copy-on-write view of ``block``: its writes stay in this process. None for a
    named segment (no fd is kept for those) or an empty block."""
    if segment.fd is None or not block.nbytes:
        return None
    if block.offset < 0 or block.offset + block.nbytes > segment.size:
        raise ValueError(f"{block} lies outside its {segment.size}-byte segment")
    return private_view(segment.fd, block.offset, block.nbytes)
