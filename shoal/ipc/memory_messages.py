"""Messages about shared memory: blocks given back, segments and CUDA chunks retired, client
CUDA regions closed, and what travels on a stub's Unix socket beside the rings.

File descriptors of new arena segments travel on the instance's Unix socket
(:class:`SegmentAnnounce` is the payload sent with the fd), and so do the IPC handles of CUDA
pool chunks (:class:`~shoal.ipc.cuda.CudaChunkAnnounce`, no fd): a stub reads the socket when a
descriptor names a segment or chunk it does not know yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from shoal.ipc.arena import Block
from shoal.ipc.cuda import CudaChunkAnnounce
from shoal.ipc.direct_messages import DirectChannelAnnounce


@dataclass(slots=True)
class Release:
    """The supervisor is done with these output blocks: the stub's arena may reuse them."""

    blocks: list[Block]

    def __init__(self, blocks: list[Block]) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.blocks = blocks

    def fields(self) -> list[Any]:
        return [[b.to_wire() for b in self.blocks]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Release:
        return Release([Block.from_wire(b) for b in f[0]])


@dataclass(slots=True)
class SegmentRetired:
    """The owner of arena ``arena_id`` retired segment ``segment`` (it held no block): unmap it.

    Up: a stub retired one of its output segments. Down: the supervisor retired an input
    segment, or passes on a stub's retirement to the other stubs it gave that segment to. Ids
    are never reused, so the message can never name a newer segment.
    """

    arena_id: int
    segment: int

    def fields(self) -> list[Any]:
        return [self.arena_id, self.segment]

    @classmethod
    def from_fields(cls, f: list[Any]) -> SegmentRetired:
        return cls(f[0], f[1])


@dataclass(slots=True)
class CudaChunkRetired:
    """The supervisor gave chunk ``chunk`` of device ``device``'s CUDA pool back (it held no
    block): close its IPC handle. Chunk ids are never reused."""

    device: int
    chunk: int

    def fields(self) -> list[Any]:
        return [self.device, self.chunk]

    @classmethod
    def from_fields(cls, f: list[Any]) -> CudaChunkRetired:
        return cls(f[0], f[1])


@dataclass(slots=True)
class CudaRegionClosed:
    """A client unregistered the CUDA region of allocation ``handle`` on ``device``: a stub
    that opened it closes it, so that the client's freed memory is not kept alive."""

    device: int
    handle: bytes

    def fields(self) -> list[Any]:
        return [self.device, self.handle]

    @classmethod
    def from_fields(cls, f: list[Any]) -> CudaRegionClosed:
        return cls(f[0], f[1])


@dataclass(slots=True)
class RegionClosed:
    """A client's system shared-memory registration ``region`` (``"<generation>:<key>"``, as
    locations name it) is gone and no request holds it: a stub that opened the object closes
    it, so that the object the client unlinks is not kept alive."""

    region: str

    def fields(self) -> list[Any]:
        return [self.region]

    @classmethod
    def from_fields(cls, f: list[Any]) -> RegionClosed:
        return cls(f[0])


@dataclass(slots=True)
class SegmentAnnounce:
    """Sent on the Unix socket together with one segment fd (not through the rings)."""

    arena_id: int
    segment: int
    size: int

    def encode(self) -> bytes:
        return msgpack.packb([self.arena_id, self.segment, self.size])  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, payload: bytes) -> SegmentAnnounce:
        a, s, n = msgpack.unpackb(payload)
        return cls(a, s, n)


def decode_socket(
    payload: bytes,
) -> SegmentAnnounce | CudaChunkAnnounce | DirectChannelAnnounce:
    """What came on a stub's Unix socket: a segment (with its fd), a CUDA pool chunk (its
    IPC handle inside the payload, no fd) or a worker's direct channel (five fds)."""
    fields = msgpack.unpackb(payload)
    if len(fields) == 3:
        return SegmentAnnounce(*fields)
    if len(fields) == 2 and fields[0] == "direct":
        return DirectChannelAnnounce(fields[1])
    return CudaChunkAnnounce.from_wire(fields)
