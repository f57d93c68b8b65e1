"""A large request body read from the socket straight into one buffer of its length.

Read the usual way, each piece of a 4 MiB body is copied three times in user space before the
request is parsed: the event loop reads it into its own buffer and copies it into a new
``bytes``, httptools copies its body part into another ``bytes`` for ``on_body``, and the
protocol appends that to the body gathered so far. Once a fast request's head is parsed and
its ``Content-Length`` is :data:`DIRECT_BODY` or more, the rest of its body is read by a
:class:`BodyReader` instead (the transport's protocol for that time: asyncio's and uvloop's
transports both switch to ``get_buffer``/``buffer_updated`` reads on ``set_protocol``), and the
kernel copies it into the :class:`BodyBuffer` directly: no copy in user space at all.

The buffer is an anonymous memory map: the kernel gives it a page only when a byte is written
there, so a client that announces a large body and sends a little costs what it sent, as
before (docs/hardening.md, "Bodies"). Only the body's own bytes are asked for, never more, so
the next request's bytes (pipelined) stay in the socket for the HTTP protocol to read. Faulting
a fresh map's pages in costs more than the copies saved (10-13 ms per 4 MiB on a loaded VM), so
the maps are reused (:class:`MapPool`).
"""

from __future__ import annotations

import asyncio
import mmap
from typing import Final, Protocol

#: A fast request's body this long or longer is read into a :class:`BodyBuffer`. Below it the
#: protocol switches (``epoll_ctl`` calls) and the fresh memory map cost more than the copies save.
DIRECT_BODY: Final = 1 << 18


class MapPool:
    """Body maps kept for reuse, as the gRPC server keeps its buffers
    (``native_messages.BufferPool``): a map comes back only once no view of it is left (a map
    with views cannot be resized, which is what :meth:`give_back` tries)."""

    MAX_SIZE: Final = 16 * 1024 * 1024  # with KEEP, at most 64 MiB kept
    KEEP: Final = 4

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []

    def take(self, size: int) -> mmap.mmap:
        """A kept map of at least ``size`` bytes, or a new one."""
        fitting = [m for m in self._free if len(m) >= size]
        if not fitting:
            # Private: a shared anonymous map is shmem (slower faults).
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        kept = min(fitting, key=len)
        self._free.remove(kept)
        return kept

    def give_back(self, kept: mmap.mmap) -> None:
        """``kept`` is done with (its request answered): reuse it once nothing views it."""
        if len(kept) > self.MAX_SIZE:
            return
        try:
            kept.resize(len(kept))
        except BufferError:
            return  # something still reads it: leave it to the garbage collector
        if len(self._free) >= self.KEEP:
            self._free.remove(min(self._free, key=len))
        self._free.append(kept)


#: One per process: a frontend worker (or the core at N = 1) serves HTTP on one event loop.
POOL = MapPool()


class BodyBuffer:
    """One request body's memory, of its announced length, filled in order."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.filled = 0
        self.map = POOL.take(length)
        self._view = memoryview(self.map)[:length]

    def add(self, chunk: bytes) -> None:
        """Append ``chunk`` (the HTTP parser never gives more than the announced length)."""
        end = self.filled + len(chunk)
        self._view[self.filled : end] = chunk
        self.filled = end

    def space(self) -> memoryview:
        """Where the next bytes go."""
        return self._view[self.filled :]

    @property
    def complete(self) -> bool:
        return self.filled == self.length

    def body(self) -> memoryview:
        """The whole body, read-only; this buffer's own view of it is let go, so that the map
        is free for :meth:`MapPool.give_back` once the body's views are gone."""
        body = self._view.toreadonly()
        self._view.release()
        return body


class BodyOwner(Protocol):
    """What a :class:`BodyReader` reports to: the HTTP protocol it stands in for."""

    def body_read(self) -> None:
        """More of the body arrived (the buffer says how much in all)."""

    def connection_lost(self, exc: Exception | None) -> None: ...

    def eof_received(self) -> bool | None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class BodyReader(asyncio.BufferedProtocol):
    """The transport's protocol while a large body is read; what is not reading goes to the
    HTTP protocol (a previous response may still be written meanwhile, and paused)."""

    def __init__(self, owner: BodyOwner, buffer: BodyBuffer) -> None:
        self._owner = owner
        self._buffer = buffer

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer.space()

    def buffer_updated(self, nbytes: int) -> None:
        self._buffer.filled += nbytes
        self._owner.body_read()

    def eof_received(self) -> bool | None:
        return self._owner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._owner.pause_writing()

    def resume_writing(self) -> None:
        self._owner.resume_writing()
