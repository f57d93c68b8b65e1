"""Segments a peer process announces on a Unix socket, mapped here on first use.

A peer that owns an arena sends each segment's memfd (a ``SegmentAnnounce`` with the fd
attached) before any message that names the segment; messages travel on another channel, so a
reader that meets an unknown segment reads the socket until its announcement is there. A
duplicate of each fd is kept, to hand the segment on to a third process (a stub).
"""

from __future__ import annotations

import os
import socket

from shoal.ipc import messages as msg
from shoal.ipc.arena import ArenaMap, Block, Segment
from shoal.ipc.fdpass import PeerGone, readable_now, recv_fds

__all__ = ["AnnouncedSegments"]


class AnnouncedSegments:
    """The segments one peer announces on ``sock`` (which this object reads, not owns)."""

    def __init__(self, sock: socket.socket, timeout: float = 5.0) -> None:
        self.sock = sock
        self.timeout = timeout
        self.map = ArenaMap()
        self._fds: dict[tuple[int, int], tuple[int, int]] = {}
        #: Direct channels' fds the peer sent (direct dispatch), by key, until taken.
        self._channels: dict[int, list[int]] = {}

    def segment(self, arena_id: int, index: int) -> Segment:
        self._wait_for(arena_id, index)
        return self.map.segment(arena_id, index)

    def fd(self, arena_id: int, index: int) -> tuple[int, int]:
        """(fd, size) of a segment, to send to another process (this object keeps the fd)."""
        self._wait_for(arena_id, index)
        return self._fds[(arena_id, index)]

    def view(self, block: Block) -> memoryview:
        """A read-only view of the block's bytes."""
        self._wait_for(block.arena_id, block.segment)
        return self.map.view(block).toreadonly()

    def has(self, arena_id: int, index: int) -> bool:
        """The segment is mapped here already."""
        return self.map.has(arena_id, index)

    def channel_fds(self, key: int) -> list[int]:
        """The five fds of the direct channel the peer sent as ``key``; the caller owns them."""
        while key not in self._channels:
            self._receive()
        return self._channels.pop(key)

    def announced(self) -> list[tuple[int, int]]:
        """(arena, segment) of every segment announced and not dropped."""
        return list(self._fds)

    def drop(self, arena_id: int, index: int) -> None:
        """The owner retired a segment: unmap it and close its fds (views still alive keep
        their pages until they are collected). What the socket holds is read first: the
        announcement may still be unread."""
        self.read_pending()
        kept = self._fds.pop((arena_id, index), None)
        if kept is not None:
            os.close(kept[0])
        self.map.retire(arena_id, index)

    def read_pending(self) -> None:
        """Read the announcements already in the socket, without waiting."""
        try:
            while readable_now(self.sock):
                self._receive()
        except (PeerGone, OSError, ValueError):
            pass  # the peer has gone (or the socket is closed): what it sent is read

    def close(self) -> None:
        for fd, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for fds in self._channels.values():
            for fd in fds:
                os.close(fd)
        self._channels.clear()
        self.map.close()

    def _wait_for(self, arena_id: int, index: int) -> None:
        while not self.map.has(arena_id, index):
            self._receive()

    def _receive(self) -> None:
        self.sock.settimeout(self.timeout)
        payload, fds = recv_fds(self.sock)
        if not fds:
            raise ValueError("a segment announcement came without its fd")
        announce = msg.decode_socket(payload)
        if isinstance(announce, msg.DirectChannelAnnounce):
            self._channels[announce.key] = fds
            return
        if not isinstance(announce, msg.SegmentAnnounce):
            raise ValueError("a segment socket carries segments and channels only")
        key = (announce.arena_id, announce.segment)
        for extra in fds[1:]:
            os.close(extra)
        try:
            kept = os.dup(fds[0])
        except BaseException:
            os.close(fds[0])
            raise
        old = self._fds.pop(key, None)
        if old is not None:
            os.close(old[0])
        self._fds[key] = (kept, announce.size)
        self.map.add_fd(announce.arena_id, announce.segment, fds[0], announce.size)
