"""A frontend worker's input arena, from both sides.

The worker (:class:`StagingArena`) copies a request's large input tensors once, into memfd
segments it owns, and sends the core only their blocks; each segment's fd goes to the core on
its own socket before the first call that names it. The core (:class:`LentArena`) reads the
blocks through its own mapping (it checks them as it checks an HTTP body), hands the segments'
fds to the stubs that need them, and gives each block back to the worker once nothing uses it:
the stub has finished with the request, or the request failed before it was staged.

A large gRPC input can be received straight into a block (:meth:`StagingArena.receive`, from
:mod:`shoal.frontends.grpc.native_split`) as its bytes arrive: ``place`` then hands that block
on as it is, with no copy.

Small tensors stay inline on the link: below :data:`INLINE_MAX` bytes the socket copy costs less
than a block's round trip (allocation, the free message, the stub's mapping); see
docs/decisions.md for the measurement.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import socket
from collections.abc import Callable
from typing import Final

import numpy as np

from shoal.core.api import ArenaRegistry
from shoal.core.types import InferRequest
from shoal.ipc import messages as msg
from shoal.ipc.arena import ArenaExhausted, Block, OwnedArena, Segment
from shoal.ipc.fdpass import PeerGone, send_fds
from shoal.ipc.peer_segments import AnnouncedSegments

__all__ = ["INLINE_MAX", "LentArena", "StagingArena", "give_blocks_back", "take_blocks"]

log = logging.getLogger("shoal")

#: Tensors smaller than this travel inline on the worker's link, not through its arena.
INLINE_MAX: Final = 32 << 10


class StagingArena:
    """The worker's side: its own input arena, announced to the core segment by segment."""

    def __init__(
        self,
        arena_id: int,
        segments: socket.socket,
        *,
        initial_bytes: int,
        growth_bytes: int,
        limit_bytes: int,
        on_retired: Callable[[int], None],
    ) -> None:
        segments.setblocking(True)
        self._segments = segments
        self._on_retired = on_retired
        self.arena = OwnedArena(
            arena_id,
            initial_bytes=initial_bytes,
            growth_bytes=growth_bytes,
            limit_bytes=limit_bytes,
            on_new_segment=self._announce,
            on_retired_segment=lambda segment: on_retired(segment.index),
        )
        #: Blocks received into and neither placed nor discarded yet, by (address, size).
        self._received: dict[tuple[int, int], Block] = {}

    @property
    def arena_id(self) -> int:
        return self.arena.arena_id

    def place(self, data: memoryview) -> Block | None:
        """A block holding a copy of ``data``; None when it should travel inline (small, or
        the arena is full: the link still carries it)."""
        if data.nbytes < INLINE_MAX:
            return None
        return self.stage(data)

    def stage(self, data: memoryview) -> Block | None:
        """A block holding ``data`` whatever its size (a relayed request's input too large to
        travel inside its record); None when the arena is full."""
        if self._received:  # ``data`` may be a block's bytes as received: no copy then
            received = self._received.pop((_address(data), data.nbytes), None)
            if received is not None:
                return received
        block = self._allocate(data.nbytes)
        if block is not None:
            self.arena.view(block)[:] = data
        return block

    def receive(self, nbytes: int) -> tuple[memoryview, object] | None:
        """A writable view of a fresh block to receive a large input into, and the token that
        :meth:`discard` takes; None when the arena is full. The block is the caller's until
        :meth:`place` is given a view of all of it (the core owns it then) or it is
        discarded."""
        block = self._allocate(nbytes)
        if block is None:
            return None
        view = self.arena.view(block)
        key = (_address(view), nbytes)
        self._received[key] = block
        return view, _Received(key, block)

    def discard(self, token: object) -> None:
        """Free a block :meth:`receive` gave, unless :meth:`place` has handed it on. (Its
        address may hold another received block by now: that one is left alone.)"""
        assert isinstance(token, _Received)
        if self._received.get(token.key) is token.block:
            del self._received[token.key]
            self.arena.free(token.block)

    def _allocate(self, nbytes: int) -> Block | None:
        try:
            return self.arena.allocate(nbytes)
        except (ArenaExhausted, OSError) as error:
            log.debug("worker arena full, sending %d bytes inline: %s", nbytes, error)
            return None

    def free(self, flat: list[int]) -> None:
        """The core gave these blocks back: ``[segment, offset, nbytes] * n``."""
        arena_id = self.arena.arena_id
        for at in range(0, len(flat), 3):
            block = Block(arena_id, flat[at], flat[at + 1], flat[at + 2])
            try:
                self.arena.free(block)
            except ValueError as error:
                log.error("frontend worker: the core gave back a block twice: %s", error)

    def view(self, block: Block) -> memoryview:
        """A view of one of its blocks (an input a model answered with as it is)."""
        return self.arena.view(block)

    def free_blocks(self, blocks: list[Block]) -> None:
        """Blocks the worker sent a stub itself (direct dispatch), which the stub is done with."""
        for block in blocks:
            try:
                self.arena.free(block)
            except ValueError as error:
                log.error("frontend worker: an input block freed twice: %s", error)

    def close(self) -> None:
        self.arena.close()
        self._segments.close()

    def _announce(self, segment: Segment) -> None:
        assert segment.fd is not None
        announce = msg.SegmentAnnounce(segment.arena_id, segment.index, segment.size)
        send_fds(self._segments, announce.encode(), [segment.fd])


class _Received:
    """What :meth:`StagingArena.discard` needs of a block received into."""

    __slots__ = ("block", "key")

    def __init__(self, key: tuple[int, int], block: Block) -> None:
        self.key = key
        self.block = block


def _address(view: memoryview) -> int:
    """Where ``view``'s bytes are in this process's memory. (A ctypes array over a writable
    view, a received block's: a tenth of numpy's ``.ctypes`` cost, called twice per request.)"""
    if view.readonly or not view.c_contiguous:
        address: int = np.frombuffer(view, np.uint8).ctypes.data
        return address
    return ctypes.addressof(_NO_BYTES.from_buffer(view))


_NO_BYTES = ctypes.c_char * 0


class LentArena:
    """The core's side of one worker's arena (a :class:`~shoal.core.api.PeerArena`).

    Counts the blocks the core holds: once the worker has exited and the last block came back,
    the arena is detached, so the stubs unmap its segments and nothing stays mapped.
    """

    def __init__(
        self,
        arena_id: int,
        segments: socket.socket,
        registry: ArenaRegistry,
        send_free: Callable[[list[int]], None],
    ) -> None:
        self._arena_id = arena_id
        self._sock = segments
        self._segments = AnnouncedSegments(segments)
        self._registry = registry
        self._send_free = send_free
        self._freed: list[int] = []
        self.held = 0
        self.gone = False
        self._detached = False
        registry.attach_arena(self)

    @property
    def arena_id(self) -> int:
        return self._arena_id

    def segment(self, index: int) -> Segment:
        return self._segments.segment(self._arena_id, index)

    def segment_fd(self, index: int) -> tuple[int, int]:
        return self._segments.fd(self._arena_id, index)

    def lend(self, segment: int, offset: int, nbytes: int) -> tuple[Block, memoryview]:
        """A block a call names, and a read-only view of it; the core holds it from now on."""
        block = Block(self._arena_id, segment, offset, nbytes)
        view = self._segments.view(block)
        self.held += 1
        return block, view

    def take(self, flat: list[int]) -> list[Block]:
        """The blocks a relayed call names (``[segment, offset, nbytes] * n``), checked against
        the segments the worker announced; the core holds them from now on."""
        blocks = []
        for at in range(0, len(flat), 3):
            segment, offset, nbytes = flat[at], flat[at + 1], flat[at + 2]
            if offset < 0 or nbytes < 0 or offset + nbytes > self.segment(segment).size:
                raise ValueError(f"a block past the end of worker segment {segment}")
            blocks.append(Block(self._arena_id, segment, offset, nbytes))
        self.held += len(blocks)
        return blocks

    def untake(self, count: int) -> None:
        """``count`` blocks :meth:`take` gave stay the worker's after all (not freed: it uses
        them again)."""
        self.held -= count
        if self.gone and self.held <= 0:
            self._detach()

    def free(self, blocks: list[Block]) -> None:
        self.held -= len(blocks)
        if self.gone:
            if self.held <= 0:
                self._detach()
            return
        if not self._freed:
            asyncio.get_running_loop().call_soon(self._flush)
        for block in blocks:
            self._freed += (block.segment, block.offset, block.nbytes)

    def give_back(self, request: InferRequest) -> None:
        """The call is answered: free the blocks that staging did not take (the request failed
        before, or was answered from the cache)."""
        left = []
        for tensor in request.inputs:
            if tensor.placed is not None:
                left.append(tensor.placed)
                tensor.placed = None
        if left:
            self.free(left)

    def retired(self, index: int) -> None:
        """The worker retired an empty segment: we and the stubs drop it."""
        self._segments.drop(self._arena_id, index)
        self._registry.segment_retired(self._arena_id, index)

    def worker_exited(self) -> None:
        if self.gone:
            return
        self.gone = True
        self._freed = []
        if self.held <= 0:
            self._detach()

    def _flush(self) -> None:
        flat, self._freed = self._freed, []
        if flat and not self.gone:
            try:
                self._send_free(flat)
            except (PeerGone, OSError):
                pass  # the worker is gone: worker_exited() comes

    def _detach(self) -> None:
        if self._detached:
            return
        self._detached = True
        self._registry.detach_arena(self._arena_id)
        self._segments.close()
        self._sock.close()


def take_blocks(arena: LentArena | None, flat: list[int]) -> list[Block]:
    """The blocks of ``arena`` a relayed call names (``[segment, offset, nbytes] * n``)."""
    if flat and arena is None:
        raise ValueError("a packed call names blocks of an arena the core lacks")
    return arena.take(flat) if arena is not None and flat else []


def give_blocks_back(arena: LentArena | None, blocks: list[Block], *, freed: bool) -> None:
    """Blocks :func:`take_blocks` gave, no longer the core's: ``freed`` (the worker gets them
    back), or still the worker's (it uses them again)."""
    if arena is None or not blocks:
        return
    if freed:
        arena.free(blocks)
    else:
        arena.untake(len(blocks))
