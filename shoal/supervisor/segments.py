"""Where every shared-memory segment lives, so blocks can be handed from one stub to another.

Tensors pass between stubs (ensemble steps, BLS) by descriptor. Before a stub receives a
descriptor into a segment it has never seen, the supervisor sends it that segment's fd: from its
own input arena, or from the supervisor's mapping of another stub's output arena.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.ipc.arena import Block, OwnedArena, Segment
from shoal.supervisor.errors import Unavailable

if TYPE_CHECKING:
    from shoal.supervisor.stub_process import StubProcess

INPUT_ARENA_ID = 0


class SegmentDirectory:
    """Finds the segment behind any block: the input arena's or a live stub's output arena's."""

    def __init__(self, input_arena: OwnedArena) -> None:
        self.input_arena = input_arena
        self._owners: dict[int, StubProcess] = {}

    def register(self, proc: StubProcess) -> None:
        self._owners[proc.output_arena_id] = proc

    def unregister(self, proc: StubProcess) -> None:
        if self._owners.get(proc.output_arena_id) is proc:
            del self._owners[proc.output_arena_id]

    def segment(self, arena_id: int, index: int) -> Segment:
        if arena_id == INPUT_ARENA_ID:
            return self.input_arena.segments[index]
        owner = self._owners.get(arena_id)
        if owner is None:
            raise Unavailable(
                f"a tensor lives in the arena of a stub process that has exited (arena {arena_id})"
            )
        return owner.mapped_segment(arena_id, index)

    def fd(self, arena_id: int, index: int) -> tuple[int, int]:
        """(fd, size) of a segment, to send to a stub that must map it."""
        if arena_id == INPUT_ARENA_ID:
            segment = self.input_arena.segments[index]
            assert segment.fd is not None
            return segment.fd, segment.size
        owner = self._owners.get(arena_id)
        if owner is None:
            raise Unavailable(
                f"a tensor lives in the arena of a stub process that has exited (arena {arena_id})"
            )
        return owner.segment_fd(arena_id, index)

    def view(self, block: Block) -> memoryview:
        """A read-only view of any block, for writing it to a client."""
        if block.nbytes == 0:
            return memoryview(b"")
        segment = self.segment(block.arena_id, block.segment)
        return segment.buf[block.offset : block.offset + block.nbytes].toreadonly()
