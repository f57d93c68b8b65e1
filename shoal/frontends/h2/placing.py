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
its own, where a 256 KiB read into the buffer takes sixteen 16 KiB frames at once. Smaller
frames (16 KiB, the size most clients send) are read by runs instead
(:mod:`shoal.frontends.h2.scatter`, after a read that left one cut); when such a run stops
because the socket had no more (the client is slower than the server), the next read must not
go to the buffer, or it would copy sixteen of the stream's frames from there: the rest of a
frame cut is read into place, and at a frame's end the next read takes one header, on which
the run goes on (:attr:`Placing.runs`: only on a connection that reads runs), while the place
has room for PLACE_FROM bytes more (nearer the message's end, such as all of a 64 KiB one,
one read into the buffer takes the rest at once).

A large message's first frames come in the read that finds its HEADERS: on a connection that
has had one (:attr:`Placing.large`: a frame of PLACE_FROM bytes or more read into place, or a
run of as much), the reads that start a frame take :data:`FIRST_READ` bytes, not the whole
buffer, so that no more than about one frame is copied before the rest goes into place. (A
64 KiB message, read whole by one read into the buffer, leaves a connection as it was.)
"""

from __future__ import annotations

from typing import Final

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.reading import FrameReader
from shoal.frontends.h2.streams import Stream

#: Frames of this size up to PLACE_FROM are read by runs (:mod:`shoal.frontends.h2.scatter`);
#: smaller ones cost less to copy than a run's guesses save.
SCATTER_FROM: Final = 4096

#: A DATA frame is read into place when at least this much of its payload is still due and the
#: place takes at least this much: below it, a read of its own costs more than the copy saved.
PLACE_FROM: Final = 64 * 1024
#: What a read that starts a frame takes on a connection that has had a large message: a
#: HEADERS frame and about one 16 KiB DATA frame (a 64 B call takes ~100 bytes).
FIRST_READ: Final = 16 * 1024


class Placing:
    """Where one connection's next read goes (``get_buffer``): into its read buffer ``reads``,
    its first frame header's worth of it, or a stream's place. ``stream``: the stream whose
    place the last buffer lent was, None for the read buffer."""

    __slots__ = (
        "_first",
        "_header",
        "_reader",
        "_reads",
        "_streams",
        "header_next",
        "large",
        "runs",
        "stream",
    )

    def __init__(self, reader: FrameReader, streams: dict[int, Stream], reads: memoryview) -> None:
        self._reader = reader
        self._streams = streams
        self._reads = reads
        self._first = reads[:FIRST_READ]
        self._header = reads[: h2.FRAME_HEADER_SIZE]
        self.stream: Stream | None = None
        #: Whether the next read takes a frame header only (set after a frame read into place).
        self.header_next = False
        #: Whether the connection reads runs of frames (its socket is its own to read).
        self.runs = False
        #: Whether the connection has had a large message (PLACE_FROM bytes into place at once).
        self.large = False

    def buffer(self) -> memoryview:
        """The buffer for the next read; :attr:`stream` says whose it is."""
        self.stream = None
        header_next, self.header_next = self.header_next, False  # for this read only
        stream_id, flags, length, due = self._reader.data_frame()
        if due:
            in_run = self._in_run(flags, length)
            if due >= PLACE_FROM or in_run:
                stream, place = self._place(stream_id, max(due, PLACE_FROM))
                # a large frame's rest; a run's frame's rest when the place has room for more
                if place is not None and len(place) >= PLACE_FROM:
                    self.stream = stream
                    self.large = self.large or not in_run
                    return place[:due] if in_run else place
            return self._reads
        if not self._reader.half_read():
            if header_next or self._run_goes_on(stream_id, flags, length):
                return self._header
            if self.large:
                return self._first
        return self._reads

    def _run_goes_on(self, stream_id: int, flags: int, length: int) -> bool:
        """Whether the last DATA frame, whole, was one of a run whose stream has a place for
        PLACE_FROM bytes more: its next frame most likely comes next, and the run goes on from
        its header. (Nearer the end, one read into the buffer takes all the rest.)"""
        if not self._in_run(flags, length):
            return False
        place = self._place(stream_id, PLACE_FROM)[1]
        return place is not None and len(place) >= PLACE_FROM

    def _in_run(self, flags: int, length: int) -> bool:
        """Whether a DATA frame of this size and flags is one of a run's, read by runs here."""
        return self.runs and not flags and SCATTER_FROM <= length < PLACE_FROM

    def _place(self, stream_id: int, due: int) -> tuple[Stream | None, memoryview | None]:
        """The stream and the place it has for up to ``due`` bytes of its DATA, if any."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.handler is None or stream.remote_closed:
            return None, None
        return stream, stream.handler.receive_buffer(due)
