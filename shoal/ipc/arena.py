"""Shared-memory arenas: one owner allocates and frees blocks, peers map segments lazily.

See docs/ipc.md for who owns which arena and how released blocks travel back to their owner.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from shoal.ipc._alloc import ALIGN, RunAllocator, align_up, make_key, split_key
from shoal.ipc._segment import (
    Segment,
    create_memfd,
    create_named,
    map_fd,
    map_named,
    page_align,
    remove_stale_segments,
)

__all__ = [
    "ALIGN",
    "DEFAULT_GROWTH_BYTES",
    "DEFAULT_INITIAL_BYTES",
    "DEFAULT_LIMIT_BYTES",
    "ArenaExhausted",
    "ArenaMap",
    "Block",
    "OwnedArena",
    "Segment",
    "UnknownSegmentError",
    "remove_stale_segments",
]

DEFAULT_INITIAL_BYTES = 64 << 20
DEFAULT_GROWTH_BYTES = 64 << 20
DEFAULT_LIMIT_BYTES = 1 << 30

#: Names of the settings that size an arena, quoted in ArenaExhausted messages. The first two are
#: Triton's python-backend settings; the limit is shoal's own.
KNOB_INITIAL = "shm-default-byte-size"
KNOB_GROWTH = "shm-growth-byte-size"
KNOB_LIMIT = "shm-limit-byte-size"

BACKENDS = ("memfd", "posix")


@dataclass(frozen=True, slots=True)
class Block:
    """A byte range inside an arena segment; also the location of a tensor in an arena."""

    arena_id: int
    segment: int
    offset: int
    nbytes: int

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
            f"available (largest free block plus room left to grow) of a {limit}-byte limit; "
            f"raise {KNOB_LIMIT} (or {KNOB_GROWTH} / {KNOB_INITIAL}) to allow larger tensors"
        )


class UnknownSegmentError(KeyError):
    """A block names a segment this process has not been told about (a protocol error)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown segment"


class OwnedArena:
    """The single owner of an arena: allocates, frees and grows it. Not thread-safe."""

    def __init__(
        self,
        arena_id: int,
        *,
        initial_bytes: int = DEFAULT_INITIAL_BYTES,
        growth_bytes: int = DEFAULT_GROWTH_BYTES,
        limit_bytes: int = DEFAULT_LIMIT_BYTES,
        backend: str = "memfd",
        on_new_segment: Callable[[Segment], None] | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"arena backend must be one of {BACKENDS}, got {backend!r}")
        if not 0 <= initial_bytes <= limit_bytes or growth_bytes <= 0:
            raise ValueError(
                f"need 0 <= {KNOB_INITIAL} ({initial_bytes}) <= {KNOB_LIMIT} ({limit_bytes}) "
                f"and {KNOB_GROWTH} ({growth_bytes}) > 0"
            )
        self.arena_id = arena_id
        self.backend = backend
        self.growth_bytes = growth_bytes
        self.limit_bytes = limit_bytes
        self._on_new_segment = on_new_segment
        self._segments: list[Segment] = []
        self._alloc = RunAllocator()
        self._capacity = 0
        self._closed = False
        if initial_bytes:
            self._add_segment(min(page_align(initial_bytes), limit_bytes))

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

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
        return Block(self.arena_id, segment, offset, nbytes)

    def free(self, block: Block) -> None:
        """Return a block; ValueError for a double free or a block this arena did not hand out."""
        key = self._check_allocated(block)
        if key is not None:
            self._alloc.give(key)

    def view(self, block: Block) -> memoryview:
        """A writable view of exactly ``block.nbytes`` bytes."""
        self._check_allocated(block)
        segment = self._segments[block.segment] if block.nbytes else None
        if segment is None:
            return memoryview(bytearray())
        return segment.buf[block.offset : block.offset + block.nbytes]

    def free_runs(self) -> list[tuple[int, int, int]]:
        """(segment, offset, size) of every free run: for tests and diagnostics."""
        return self._alloc.free_runs()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
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
        headroom = self.limit_bytes - self._capacity
        new_size = min(max(self.growth_bytes, page_align(size)), headroom)
        new_size -= new_size % ALIGN
        if new_size < size:
            available = self._alloc.largest_free() + max(headroom, 0)
            raise ArenaExhausted(self.arena_id, requested, available, self.limit_bytes)
        self._add_segment(new_size)

    def _add_segment(self, size: int) -> None:
        index = len(self._segments)
        create = create_memfd if self.backend == "memfd" else create_named
        segment = create(self.arena_id, index, size)
        self._segments.append(segment)
        self._capacity += size
        self._alloc.add_segment(index, size)
        if self._on_new_segment is not None:
            self._on_new_segment(segment)


class ArenaMap:
    """A peer's view of other processes' arenas: segments are mapped on first use and cached."""

    def __init__(self) -> None:
        self._pending: dict[tuple[int, int], tuple[int | str, int]] = {}
        self._mapped: dict[tuple[int, int], Segment] = {}

    def add_fd(self, arena_id: int, segment: int, fd: int, size: int) -> None:
        """Register a memfd segment; the map owns ``fd`` from now on."""
        self._replace((arena_id, segment), (fd, size))

    def add_named(self, arena_id: int, segment: int, name: str, size: int) -> None:
        self._replace((arena_id, segment), (name, size))

    def has(self, arena_id: int, segment: int) -> bool:
        key = (arena_id, segment)
        return key in self._mapped or key in self._pending

    def segment(self, arena_id: int, index: int) -> Segment:
        key = (arena_id, index)
        mapped = self._mapped.get(key)
        if mapped is not None:
            return mapped
        pending = self._pending.pop(key, None)
        if pending is None:
            raise UnknownSegmentError(f"segment {index} of arena {arena_id} was never announced")
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
