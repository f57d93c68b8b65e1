"""Reads straight into place: the payload of a large DATA frame read by the kernel into the
memory its stream keeps it in (a gRPC tensor's block of the frontend worker's arena), instead
of into the connection's read buffer and then copied there.

The connection lends the transport a buffer per read (``BufferedProtocol.get_buffer``), and
it knows, once a DATA frame's header has been read, how many of the next bytes on the socket are
that frame's payload (:meth:`~shoal.frontends.h2.reading.FrameReader.data_due`). When they are
at least :data:`PLACE_FROM` bytes and the stream's handler has a place for them
(``StreamHandler.receive_buffer``), the read goes there, never past the frame's end; the frame
headers between frames still go to the read buffer, and after a frame read into place the next
read takes one header only (:data:`~shoal.frontends.h2.frames.FRAME_HEADER_SIZE` bytes), so
that a stream's next large frame is recognised before its payload is read. Anything else (a
small frame, padding, another stream's frames, a stream closed or reset, a handler with no
place) reads into the buffer, as before.

Worth it for large frames only: each read into place is a system call and a loop callback of
its own, where a 256 KiB read into the buffer takes sixteen 16 KiB frames at once. A frame
cut by a read with less than PLACE_FROM bytes of it left (all of 16 KiB frames, the size most
clients send) is copied from the buffer, as before.
"""

from __future__ import annotations

from typing import Final

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.reading import FrameReader
from shoal.frontends.h2.streams import Stream

#: A DATA frame is read into place when at least this much of its payload is still due and the
#: place takes at least this much: below it, a read of its own costs more than the copy saved.
PLACE_FROM: Final = 64 * 1024


class Placing:
    """Where one connection's next read goes (``get_buffer``): into its read buffer ``reads``,
    its first frame header's worth of it, or a stream's place. ``stream``: the stream whose
    place the last buffer lent was, None for the read buffer."""

    __slots__ = ("_header", "_reader", "_reads", "_streams", "header_next", "stream")

    def __init__(self, reader: FrameReader, streams: dict[int, Stream], reads: memoryview) -> None:
        self._reader = reader
        self._streams = streams
        self._reads = reads
        self._header = reads[: h2.FRAME_HEADER_SIZE]
        self.stream: Stream | None = None
        #: Whether the next read takes a frame header only (set after a frame read into place).
        self.header_next = False

    def buffer(self) -> memoryview:
        """The buffer for the next read; :attr:`stream` says whose it is."""
        self.stream = None
        stream_id, due = self._reader.data_due()
        if due >= PLACE_FROM:
            stream = self._streams.get(stream_id)
            if stream is not None and stream.handler is not None and not stream.remote_closed:
                place = stream.handler.receive_buffer(due)
                if place is not None and len(place) >= PLACE_FROM:
                    self.stream = stream
                    return place
        elif self.header_next:
            self.header_next = False  # for this read only
            if not due:
                return self._header
        return self._reads
