"""Responses a frontend worker writes straight from the stubs' output arenas.

The core sends a worker the blocks of a response's large outputs, not their bytes
(:class:`LentOutputs`): each segment's fd goes to the worker once, on the worker's segment
socket, before the first answer that names it, and the core keeps the response (its blocks
stay allocated) until the worker says it has written it (``RELEASE``). The worker
(:class:`MappedOutputs`) maps those segments on first use and keeps them mapped; the core tells
it when a segment goes away (the stub retired it, or exited: a restarted stub has new
segments), and a worker's death releases every response it held.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable
from typing import Final, Protocol

from shoal.core.api import ArenaRegistry
from shoal.core.cycles import collect_soon
from shoal.core.types import InferOutput
from shoal.frontends.workers.arenas import INLINE_MAX, StagingArena
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.fdpass import PeerGone, send_fds
from shoal.ipc.peer_segments import AnnouncedSegments

__all__ = ["LentOutputs", "MappedOutputs"]

#: All segments of an arena (a stub that exited), in a drop notice.
WHOLE_ARENA: Final = -1


class Held(Protocol):
    """What the core keeps until the worker has written it: a response, or the completion
    the core relayed (``relay.py``)."""

    def release(self) -> None: ...


class LentOutputs:
    """The core's side, for one worker: which segments it maps, which responses it holds."""

    def __init__(
        self,
        segments: socket.socket,
        registry: ArenaRegistry,
        own_arena: int,
        send_drop: Callable[[int, int], None],
    ) -> None:
        self._sock = segments
        self._registry = registry
        self._own_arena = own_arena
        self._send_drop = send_drop
        self._known: set[tuple[int, int]] = set()
        self._held: dict[int, Held] = {}
        self._leases = itertools.count(1)
        self._closed = False
        registry.watch_segments(self, self._gone)

    def describe(self, output: InferOutput) -> list[int] | None:
        """``[arena, segment, offset, nbytes]`` of an output the worker may read in place
        (its segment's fd sent first); None: its bytes travel inline."""
        block = output.placed
        return None if block is None else self.describe_block(block)

    def describe_block(self, block: Block) -> list[int] | None:
        """:meth:`describe` of an output block."""
        if block.nbytes < INLINE_MAX or self._closed:
            return None
        key = (block.arena_id, block.segment)
        if key not in self._known and block.arena_id != self._own_arena:
            try:
                fd, size = self._registry.segment_fd(*key)
                announce = msg.SegmentAnnounce(block.arena_id, block.segment, size)
                send_fds(self._sock, announce.encode(), [fd])
            except (PeerGone, OSError):
                return None  # the worker is gone (or the segment is): bytes, then
            self._known.add(key)
        return [block.arena_id, block.segment, block.offset, block.nbytes]

    def lend_segment(self, arena_id: int, index: int) -> None:
        """Send the worker a stub's output segment's fd, if not yet (direct dispatch: the
        worker reads a response's outputs there without the core)."""
        key = (arena_id, index)
        if key in self._known or self._closed or arena_id == self._own_arena:
            return
        fd, size = self._registry.segment_fd(*key)
        send_fds(self._sock, msg.SegmentAnnounce(arena_id, index, size).encode(), [fd])
        self._known.add(key)

    def send_channel(self, pid: int, fds: list[int]) -> None:
        """Send the worker a direct channel to stub ``pid`` (``direct_routes.py``)."""
        send_fds(self._sock, msg.DirectChannelAnnounce(pid).encode(), fds)

    def hold(self, response: Held) -> int:
        """Keep ``response`` (and its blocks) until the worker releases the lease returned."""
        lease = next(self._leases)
        self._held[lease] = response
        return lease

    def release(self, lease: int) -> None:
        response = self._held.pop(lease, None)
        if response is not None:
            response.release()

    def close(self) -> None:
        """The worker is gone: every response it held goes back."""
        self._closed = True
        self._registry.unwatch_segments(self)
        held, self._held = self._held, {}
        for response in held.values():
            response.release()

    def _gone(self, arena_id: int, index: int) -> None:
        if index == WHOLE_ARENA:
            gone = [key for key in self._known if key[0] == arena_id]
        else:
            gone = [(arena_id, index)] if (arena_id, index) in self._known else []
        if not gone:
            return
        self._known.difference_update(gone)
        self._send_drop(arena_id, index)


class MappedOutputs:
    """The worker's side: the segments of other arenas it reads responses from."""

    def __init__(self, segments: socket.socket, own: StagingArena | None) -> None:
        self._segments = AnnouncedSegments(segments)
        self._own = own

    def view(self, where: list[int]) -> memoryview:
        """A read-only view of ``[arena, segment, offset, nbytes]``."""
        block = Block(where[0], where[1], where[2], where[3])
        own = self._own
        if own is not None and block.arena_id == own.arena_id:
            return own.arena.view(block).toreadonly()  # an input returned as it came
        return self._segments.view(block)

    def drop(self, arena_id: int, index: int) -> None:
        if index == WHOLE_ARENA:
            for key in self._segments.announced():
                if key[0] == arena_id:
                    self._segments.drop(*key)
            # (views of it caught in cycles would keep it mapped)
            collect_soon(asyncio.get_running_loop())
        else:
            self._segments.drop(arena_id, index)

    @property
    def segments(self) -> AnnouncedSegments:
        """The segments (and direct channels) the core sent."""
        return self._segments

    def close(self) -> None:
        self._segments.close()
