"""Where every shared-memory segment lives, so blocks can be handed from one stub to another.

Tensors pass between stubs (ensemble steps, BLS) by descriptor. Before a stub receives a
descriptor into a segment it has never seen, the supervisor sends it that segment's fd: from its
own input arena, or from the supervisor's mapping of another stub's output arena. When an owner
retires a segment, the directory tells every stub it gave that segment to (``SegmentRetired``),
so that no process keeps the memory mapped.

GPU tensors live in the supervisor's CUDA pools (``cuda``): a stub receives a chunk's IPC handle
before its first descriptor into that chunk, and is told when a chunk it opened is given back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from shoal.core.api import PeerArena
from shoal.core.errors import Unavailable
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block, OwnedArena, Segment
from shoal.ipc.cuda import CudaChunkAnnounce
from shoal.ipc.queue import PeerGone
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.memory.cuda_pools import CudaPools

if TYPE_CHECKING:
    from shoal.supervisor.instances.channel import StubChannel

INPUT_ARENA_ID = 0
#: A segment index that means every segment of the arena (a stub that exited).
WHOLE_ARENA = -1
#: What the directory tells stubs about memory going away.
_News = msg.SegmentRetired | msg.CudaChunkRetired | msg.CudaRegionClosed | msg.RegionClosed


class SegmentDirectory:
    """Finds the segment behind any block: the input arena's or a live stub's output arena's."""

    def __init__(self, input_arena: OwnedArena, cuda: CudaPools | None = None) -> None:
        self.input_arena = input_arena
        self.cuda = cuda if cuda is not None else CudaPools()
        self._owners: dict[int, StubChannel] = {}
        #: Arenas of frontend workers: they stage requests' inputs there.
        self._peers: dict[int, PeerArena] = {}
        #: Told when a segment goes away (frontend workers that map stubs' outputs).
        self._watchers: dict[int, tuple[object, Callable[[int, int], None]]] = {}
        self._sending: set[asyncio.Task[None]] = set()
        # The directory knows which stub holds which segment, so it passes the news on.
        input_arena.on_retired_segment = self._input_retired
        self.cuda.on_retired_chunk = self._cuda_retired

    def register(self, proc: StubChannel) -> None:
        self._owners[proc.output_arena_id] = proc

    def unregister(self, proc: StubChannel) -> None:
        if self._owners.get(proc.output_arena_id) is proc:
            del self._owners[proc.output_arena_id]
            self._gone(proc.output_arena_id, WHOLE_ARENA)

    def segment(self, arena_id: int, index: int) -> Segment:
        if arena_id == INPUT_ARENA_ID:
            return self.input_arena.segment(index)
        peer = self._peers.get(arena_id)
        if peer is not None:
            return peer.segment(index)
        return self._owner(arena_id).mapped_segment(arena_id, index)

    def fd(self, arena_id: int, index: int) -> tuple[int, int]:
        """(fd, size) of a segment, to send to a stub that must map it."""
        if arena_id == INPUT_ARENA_ID:
            segment = self.input_arena.segment(index)
            assert segment.fd is not None
            return segment.fd, segment.size
        peer = self._peers.get(arena_id)
        if peer is not None:
            return peer.segment_fd(index)
        return self._owner(arena_id).segment_fd(arena_id, index)

    def free_inputs(self, blocks: list[Block]) -> None:
        """Give back the blocks of requests' inputs: to the input arena, or to the frontend
        worker that staged them in its own."""
        for block in blocks:
            if block.arena_id == INPUT_ARENA_ID:
                self.input_arena.free(block)
            else:
                peer = self._peers.get(block.arena_id)
                if peer is not None:
                    peer.free([block])

    # -- frontend workers' arenas (ArenaRegistry) -------------------------------------------

    def attach_arena(self, arena: PeerArena) -> None:
        self._peers[arena.arena_id] = arena

    def detach_arena(self, arena_id: int) -> None:
        if self._peers.pop(arena_id, None) is None:
            return
        self._gone(arena_id, WHOLE_ARENA)
        for proc in self._owners.values():
            gone = [key for key in proc.announced if key[0] == arena_id]
            for key in gone:
                proc.announced.discard(key)
                self._send(proc, msg.SegmentRetired(*key))

    def segment_retired(self, arena_id: int, index: int) -> None:
        self._tell_holders(arena_id, index)

    def segment_fd(self, arena_id: int, index: int) -> tuple[int, int]:
        return self.fd(arena_id, index)

    def cuda_chunk(self, location: CudaLocation) -> CudaChunkAnnounce:
        """The chunk a pool block lies in, to announce to a stub that must open it."""
        return self.cuda.announcement(location)

    def view(self, block: Block | CudaLocation) -> memoryview:
        """A read-only view of any block, for writing it to a client (a host copy of a GPU
        block)."""
        if type(block) is CudaLocation:
            return self.cuda.to_host(block)
        assert isinstance(block, Block)
        if block.nbytes == 0:
            return memoryview(b"")
        segment = self.segment(block.arena_id, block.segment)
        return segment.buf[block.offset : block.offset + block.nbytes].toreadonly()

    def output_retired(self, proc: StubChannel, index: int) -> None:
        """``proc`` retired one of its output segments: we and the stubs we gave it drop it."""
        if self._owners.get(proc.output_arena_id) is not proc:
            return  # it has exited: closing it drops all of its segments
        proc.drop_output_segment(index)
        self._tell_holders(proc.output_arena_id, index)

    def _input_retired(self, segment: Segment) -> None:
        self._tell_holders(segment.arena_id, segment.index)

    def watch_segments(self, owner: object, gone: Callable[[int, int], None]) -> None:
        self._watchers[id(owner)] = (owner, gone)

    def unwatch_segments(self, owner: object) -> None:
        self._watchers.pop(id(owner), None)

    def _gone(self, arena_id: int, index: int) -> None:
        if self._watchers:
            for _, gone in list(self._watchers.values()):
                gone(arena_id, index)

    def broadcast(self, message: msg.CudaRegionClosed | msg.RegionClosed) -> None:
        """Tell every live stub (news that only some may need, and that is rare)."""
        for proc in list(self._owners.values()):
            self._send(proc, message)

    def _cuda_retired(self, device: int, chunk: int) -> None:
        key = (device, chunk)
        for proc in self._owners.values():
            if key in proc.cuda_chunks:
                proc.cuda_chunks.discard(key)
                self._send(proc, msg.CudaChunkRetired(device, chunk))

    def _owner(self, arena_id: int) -> StubChannel:
        owner = self._owners.get(arena_id)
        if owner is None:
            raise Unavailable(
                f"a tensor lives in the arena of a stub process that has exited (arena {arena_id})"
            )
        return owner

    def _tell_holders(self, arena_id: int, index: int) -> None:
        self._gone(arena_id, index)
        key = (arena_id, index)
        for proc in self._owners.values():
            if key in proc.announced:
                proc.announced.discard(key)
                self._send(proc, msg.SegmentRetired(arena_id, index))

    def _send(self, proc: StubChannel, message: _News) -> None:
        if proc.returncode is not None:
            return
        try:
            if proc.send(message):
                return
        except PeerGone:
            return
        # A full ring: the news can wait (nothing will use the segment again).
        task = asyncio.ensure_future(self._send_later(proc, message))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    @staticmethod
    async def _send_later(proc: StubChannel, message: _News) -> None:
        try:
            await proc.send_async(message)
        except PeerGone:
            pass
