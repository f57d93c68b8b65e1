"""The receiving side of an HTTP/2 connection: frames cut out of the bytes read, header blocks
assembled.

A :class:`FrameReader` checks the client's preface, cuts whole frames out of what the loop
hands it (keeping a partial one for the next read), and passes each to the handler of its
type; it assembles header blocks itself (HEADERS and CONTINUATION frames, padding and priority
removed) and hands each complete block on. DATA goes on by runs: the frames of one stream
that follow each other whole in a read (a large message's, 16 KiB each from most clients)
reach the stream's handler in one call, so what is done per call (window credit, the stream's
lookup, the handler's dispatch) is done once per run rather than once per frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.errors import ConnectionError_
from shoal.frontends.h2.floods import FloodGuard
from shoal.frontends.h2.header_blocks import MAX_HEADER_LIST

#: Largest frame the peer may send: fewer frames to parse for large tensors.
RECEIVE_MAX_FRAME: Final = 1 << 20

#: A DATA frame at least this large, cut by a read, is handed on in pieces as it arrives
#: rather than gathered first (a copy); a smaller one is gathered, as any other frame. Low
#: enough for the 16 KiB frames most clients send: a 256 KiB read cuts one of them.
STREAM_DATA_FROM: Final = 1024

#: What handles one frame: (stream id, flags, payload); the payload is valid during the call.
FrameHandler = Callable[[int, int, memoryview], None]
#: What handles a run of DATA frames of one stream: (stream id, END_STREAM, payloads, length).
#: The payloads come without padding, valid during the call; ``length`` is what the run counts
#: against the flow-control windows (padding included).
DataHandler = Callable[[int, bool, list[memoryview], int], None]
#: ``memoryview``, read once: compiled, the name of a builtin mypyc has no primitive for is an
#: attribute look-up on the ``builtins`` module (~270 instructions) at each use (twice a read).
_memoryview: Final = memoryview
#: The size of the buffer reads go into: a 4 MiB message comes in 16 reads.
READ_BUFFER_BYTES: Final = 256 * 1024


def read_buffer() -> memoryview:
    """A buffer the transport reads into, for the connections of one event loop: a read is
    handled whole before the next one begins, so one serves them all, and no ``bytes`` object is
    made and filled per read (uvloop would copy each read once more into one). Nothing keeps a
    view of it past the read: the reader copies a frame cut by the read, handlers what they
    keep."""
    return memoryview(bytearray(READ_BUFFER_BYTES))


class FrameReader:
    """Frames out of one connection's bytes. ``handlers``: by frame type (other types are
    ignored, as RFC 9113 sections 5.3.2 and 4.1 ask); ``data``: runs of DATA frames;
    ``header_block``: a complete header block with the flags of its HEADERS frame."""

    def __init__(
        self,
        handlers: dict[int, FrameHandler],
        data: DataHandler,
        header_block: FrameHandler,
        guard: FloodGuard,
    ) -> None:
        self._handlers = dict(handlers)
        self._handlers[h2.HEADERS] = self._on_headers
        self._handlers[h2.CONTINUATION] = self._on_continuation
        self._data = data
        self._header_block = header_block
        self._guard = guard
        self._buffer = bytearray()
        self._preface_seen = False
        self._continuation: tuple[int, int, bytearray] | None = None  # stream, flags, block
        self._data_left = 0  # bytes still due of a DATA frame handed on in pieces
        self._data_frame = (0, 0)  # its stream and flags
        self._data_length = 0  # and its length

    def half_read(self) -> bool:
        """Whether the preface, a frame or a header block has arrived in part."""
        return (
            not self._preface_seen
            or bool(self._buffer)
            or self._continuation is not None
            or self._data_left > 0
        )

    def data_due(self) -> tuple[int, int]:
        """The stream of the DATA frame in progress (cut by a read) and the bytes of its
        payload still due (0: none in progress): the next bytes the socket holds, which the
        connection may have read straight into the place the stream keeps them."""
        return self._data_frame[0], self._data_left

    def data_frame(self) -> tuple[int, int, int, int]:
        """(stream, flags, length, bytes still due) of the DATA frame in progress, the last one
        when none is (due 0)."""
        stream_id, flags = self._data_frame
        return stream_id, flags, self._data_length, self._data_left

    def data_begun(self, stream_id: int, length: int, due: int) -> None:
        """A DATA frame of ``stream_id`` (no flags) whose header and ``length - due`` bytes of
        payload were read straight into place (:mod:`shoal.frontends.h2.scatter`) is the one
        in progress now."""
        self._guard.frame(h2.DATA, 0, length)
        self._data_frame = (stream_id, 0)
        self._data_length = length
        self._data_left = due

    def placed(self, nbytes: int) -> bool:
        """``nbytes`` more of the DATA frame in progress were read straight into place (see
        :meth:`data_due`); whether they are its last and it ends the stream."""
        self._data_left -= nbytes
        return not self._data_left and bool(self._data_frame[1] & h2.END_STREAM)

    def feed(self, data: bytes | memoryview) -> None:
        """Handle the frames of ``data`` after what was left of earlier reads; keep the rest.

        Only a frame cut by the previous read is copied, to finish it; the whole frames of
        ``data`` are handled in place, so a large message's DATA is not copied here (a read of
        many frames, gathered behind a partial one, would be copied whole on every read)."""
        view = _memoryview(data)
        if self._data_left:
            view = self._data_piece(view)
        if self._buffer:
            if not self._preface_seen:
                self._buffer += view
                view = memoryview(self._buffer)
                self._buffer = bytearray()
            else:
                rest = self._finish_frame(view)
                if rest is None:
                    return
                view = rest
        consumed = self._parse(view)
        if consumed < len(view) and not self._begin_data(view[consumed:]):
            self._buffer = bytearray(view[consumed:])

    def _begin_data(self, rest: memoryview) -> bool:
        """Hand on what came of a DATA frame cut by the read, if it is one (whole header, no
        padding): its payload then goes on in pieces as it arrives, uncopied, END_STREAM with
        the last. A large frame (clients send up to RECEIVE_MAX_FRAME) is not gathered first."""
        if len(rest) < h2.FRAME_HEADER_SIZE or not self._preface_seen:
            return False
        length, kind, flags, stream_id = h2.read_header(rest, 0)
        if kind != h2.DATA or flags & h2.PADDED:
            return False
        # length: more than arrived (_parse checked it and kept the frame)
        if length < STREAM_DATA_FROM:
            return False
        if self._continuation is not None:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
        self._guard.frame(kind, flags, length)
        self._data_frame = (stream_id, flags)
        self._data_length = self._data_left = length
        self._data_piece(rest[h2.FRAME_HEADER_SIZE :])
        return True

    def _data_piece(self, view: memoryview) -> memoryview:
        """Hand on the next piece of the DATA frame in progress; return the rest of ``view``."""
        size = min(self._data_left, len(view))
        self._data_left -= size
        stream_id, flags = self._data_frame
        if size or not self._data_left:
            end_stream = not self._data_left and bool(flags & h2.END_STREAM)
            self._data(stream_id, end_stream, [view[:size]], size)
        return view[size:]

    def _finish_frame(self, view: memoryview) -> memoryview | None:
        """Complete the frame begun in the buffer from ``view`` and handle it; return the rest
        of ``view`` (None: the frame is still incomplete, all of ``view`` is buffered)."""
        buffer = self._buffer
        size = h2.FRAME_HEADER_SIZE
        if len(buffer) < size:
            taken = size - len(buffer)
            buffer += view[:taken]
            view = view[taken:]
            if len(buffer) < size:
                return None
        length = h2.read_header(buffer, 0)[0]
        if length > RECEIVE_MAX_FRAME:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
        if len(buffer) == size and self._begin_data(memoryview(buffer)):
            # A large DATA frame whose header was cut: its payload goes on in pieces too.
            self._buffer = bytearray()
            return self._data_piece(view)
        taken = size + length - len(buffer)
        buffer += view[:taken]
        if len(buffer) < size + length:
            return None
        self._buffer = bytearray()  # a handler may keep a view of the finished frame
        self._parse(buffer)
        return view[taken:]

    def _parse(self, data: bytes | bytearray | memoryview) -> int:
        """Handle every whole frame of ``data``; return the bytes consumed."""
        view = data if isinstance(data, _memoryview) else _memoryview(data)
        offset = 0 if self._preface_seen else self._read_preface(view)
        if not self._preface_seen:
            return 0
        total = len(view)
        while total - offset >= h2.FRAME_HEADER_SIZE:
            length, kind, flags, stream_id = h2.read_header(view, offset)
            if length > RECEIVE_MAX_FRAME:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            end = offset + h2.FRAME_HEADER_SIZE + length
            if end > total:
                break
            if kind == h2.DATA:
                end = self._data_run(view, end, length, flags, stream_id)
            else:
                self._frame(kind, flags, stream_id, view[end - length : end])
            offset = end
        return offset

    def _data_run(self, view: memoryview, end: int, length: int, flags: int, stream_id: int) -> int:
        """Hand on the DATA frame that ends at ``end`` with the DATA frames of its stream that
        follow it whole in ``view``; return where the run ends. A run is what a frame-by-frame
        reading would hand on, in one call: it ends with END_STREAM, and before a frame of
        another type or stream, a padded one, an empty one that ends nothing (the flood guard
        counts those) or one cut by the read; those go their usual way."""
        if self._continuation is not None:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
        self._guard.frame(h2.DATA, flags, length)  # the rest of the run is not empty: no count
        payload = view[end - length : end]
        pieces = [unpad(payload) if flags & h2.PADDED else payload]
        counted = length
        total = len(view)
        while length and not flags & h2.END_STREAM and total - end >= h2.FRAME_HEADER_SIZE:
            length, kind, next_flags, next_id = h2.read_header(view, end)
            start = end + h2.FRAME_HEADER_SIZE
            if (
                kind != h2.DATA
                or next_id != stream_id
                or next_flags & h2.PADDED
                or not (length or next_flags & h2.END_STREAM)
                or start + length > total
                or length > RECEIVE_MAX_FRAME
            ):
                break
            end = start + length
            pieces.append(view[start:end])
            counted += length
            flags = next_flags
        self._data(stream_id, bool(flags & h2.END_STREAM), pieces, counted)
        return end

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if self._continuation is not None and kind != h2.CONTINUATION:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
        self._guard.frame(kind, flags, len(payload))
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(stream_id, flags, payload)

    def _read_preface(self, view: memoryview) -> int:
        """The bytes of the client's connection preface in ``view``: 0 until all of it came."""
        if len(view) < len(h2.PREFACE):
            if not h2.PREFACE.startswith(bytes(view)):
                raise ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            return 0
        if view[: len(h2.PREFACE)] != h2.PREFACE:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        self._preface_seen = True
        return len(h2.PREFACE)

    def _on_headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & h2.PADDED:
            payload = unpad(payload)
        if flags & h2.PRIORITY_FLAG:
            payload = payload[5:]
        if not flags & h2.END_HEADERS:
            self._continuation = (stream_id, flags, bytearray(payload))
            return
        self._header_block(stream_id, flags, payload)

    def _on_continuation(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if self._continuation is None or self._continuation[0] != stream_id:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "an unexpected CONTINUATION")
        block = self._continuation[2]
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block too large")
        if flags & h2.END_HEADERS:
            first_flags = self._continuation[1]
            self._continuation = None
            self._header_block(stream_id, first_flags, memoryview(block))


def unpad(payload: memoryview) -> memoryview:
    """A padded frame's payload without its pad length and padding."""
    if not payload:
        raise ConnectionError_(h2.PROTOCOL_ERROR, "a padded frame without a pad length")
    padding = payload[0]
    if padding >= len(payload):
        raise ConnectionError_(h2.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - padding]
