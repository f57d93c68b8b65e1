"""Scatter reads: a run of one stream's 16 KiB DATA frames read by the kernel straight into
the stream's place, their headers apart, with one ``readv``.

Most HTTP/2 clients (nghttp2, and so h2load; Go's) send DATA frames of 16 KiB whatever the
server allows. Read into the connection's buffer, each costs the reader a header parsed, a
slice and a copy into the tensor's block (:mod:`shoal.frontends.h2.reading`); read into place
one by one (:mod:`shoal.frontends.h2.placing`) each would cost a system call and a loop
callback. Here, when a read has left a DATA frame of such a size cut (its payload partly due)
and its stream has a place for more, the connection reads the socket itself, at once, with
one ``readv`` of: the rest of that payload into place, then for each of the next
:data:`SCATTER_FRAMES` frames a 9-byte header into a small buffer and a payload of the same
length into place, right after the previous one. The frames that follow are guessed to be
the stream's next DATA frames of that length with no flags; the headers read are checked
afterwards. The payloads behind the headers that were as guessed count as read into place
(one :meth:`~shoal.frontends.h2.streams.StreamHandler.data_placed` for them all); from the
first header that was not (the message's last frame, another stream's frame, padding, a
header cut by the read) the bytes read are copied back into the reader's usual way
(:meth:`~shoal.frontends.h2.reading.FrameReader.feed`), which handles them as if read into its
buffer. The place is never passed: what does not fit in it is left on the socket.

The socket is read in the protocol's own callback, between two reads of the transport: its
bytes come in order whoever reads them. A read that finds nothing, the end of the stream or an
error just stops: the transport's next read finds the same and reports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.placing import PLACE_FROM, SCATTER_FROM
from shoal.frontends.h2.reading import FrameReader
from shoal.frontends.h2.streams import Stream, StreamHandler

#: Frames guessed per ``readv``: 1 MiB of 16 KiB frames (the kernel takes 1024 buffers at most).
#: Frames of SCATTER_FROM bytes or more (and smaller than PLACE_FROM, which are placed one by
#: one) are read by runs.
SCATTER_FRAMES: Final = 64

#: What counts DATA against the windows: (stream, END_STREAM, length) -> its handler, if any.
Counter = Callable[[int, bool, int], StreamHandler | None]


class Scatter:
    """Scatter reads of one connection's socket ``fd`` (see the module)."""

    __slots__ = ("_count", "_fd", "_headers", "_reader", "_scratch", "_streams")

    def __init__(
        self, fd: int, reader: FrameReader, streams: dict[int, Stream], count: Counter
    ) -> None:
        self._fd = fd
        self._reader = reader
        self._streams = streams
        self._count = count
        self._scratch = bytearray(h2.FRAME_HEADER_SIZE * SCATTER_FRAMES)
        view = memoryview(self._scratch)
        size = h2.FRAME_HEADER_SIZE
        self._headers = [view[at : at + size] for at in range(0, len(view), size)]

    def read(self) -> int:
        """Read runs of the frame in progress' stream into place while the socket has them;
        the payload bytes read into place."""
        stream_id, flags, length, due = self._reader.data_frame()
        if not due or flags or not SCATTER_FROM <= length < PLACE_FROM:
            return 0
        taken = 0
        while due >= 0:
            due, more = self._run(stream_id, length, due)
            taken += more
        return taken

    def _run(self, stream_id: int, length: int, due: int) -> tuple[int, int]:
        """One ``readv``: ``due`` bytes of the frame in progress, then frames of ``length``
        guessed. Returns what is due of the frame in progress when all was as guessed and
        read (the socket may hold more), else -1 (stop); and the payload bytes in place."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.handler is None or stream.remote_closed:
            return -1, 0
        handler = stream.handler
        place = handler.receive_buffer(due + SCATTER_FRAMES * length)
        if place is None or len(place) <= due:
            return -1, 0
        buffers = [place[:due]] if due else []
        frames = (len(place) - due + length - 1) // length
        headers = self._headers
        for index in range(frames):
            at = due + index * length
            buffers.append(headers[index])
            buffers.append(place[at : at + length])
        try:
            got = os.readv(self._fd, buffers)
        except OSError:  # nothing to read (or an error the transport's next read reports)
            return -1, 0
        taken, checked, last, rest = self._check(stream_id, length, due, got, len(place))
        if taken:
            handler.data_placed(taken, False)
        if checked:  # the last frame whose header was as guessed is the one in progress now
            self._reader.data_begun(stream_id, length, length - last)
        if rest:  # from the first header not as guessed on: the reader's usual way
            first = (1 if due else 0) + 2 * checked
            self._reader.feed(_gather(buffers, first, rest))
            return -1, taken
        if got < len(place) + h2.FRAME_HEADER_SIZE * frames:
            return -1, taken  # the socket had no more
        return length - last, taken

    def _check(
        self, stream_id: int, length: int, due: int, got: int, room: int
    ) -> tuple[int, int, int, int]:
        """What ``got`` bytes read hold: (payload bytes in place, headers as guessed, the last
        such frame's payload bytes read, bytes read from the first header not as guessed on).
        What is in place is counted against the windows, the frame in progress told of its
        ``due`` bytes."""
        taken = min(got, due)
        if taken:
            self._reader.placed(taken)
        expected = h2.frame_header(h2.DATA, 0, stream_id, length)
        headers = self._headers
        size = h2.FRAME_HEADER_SIZE
        rest, checked, last, at = got - taken, 0, 0, due
        while rest >= size and at < room and headers[checked] == expected:
            slot = min(length, room - at)
            last = min(rest - size, slot)
            taken += last
            rest -= size + last
            checked += 1
            at += length
            if last < slot:
                break
        if taken:
            self._count(stream_id, False, taken)
        return taken, checked, last, rest


def _gather(buffers: list[memoryview], first: int, size: int) -> bytes:
    """The first ``size`` bytes of ``buffers[first:]``, in one piece."""
    pieces = []
    for buffer in buffers[first:]:
        if size <= 0:
            break
        pieces.append(buffer[:size])
        size -= len(buffer)
    return b"".join(pieces)


def scatter_for(
    fd: int, reader: FrameReader, streams: dict[int, Stream], count: Counter
) -> Scatter | None:
    """The scatter reads of a connection on socket ``fd``; None if it has none (-1)."""
    return None if fd < 0 else Scatter(fd, reader, streams, count)
