"""The sending side of an HTTP/2 connection: writes gathered per loop iteration, and DATA
within the peer's windows.

Everything written during one event-loop iteration leaves in one ``writev``: a unary call's
headers, message and trailers, and the answers of several streams. DATA respects the peer's
connection and stream windows and its frame size; what does not fit waits in the stream's
``pending`` queue (with a header block that must follow it) for WINDOW_UPDATE.

DATA may view memory that is not ours to keep (a response's output tensors, read in place): the
transport holds such views until the kernel has taken their bytes. :meth:`Sender.after_sent`
calls back once everything written so far has left the process (the transport's buffer is
empty) or the connection is gone, and the owner gives the memory back then.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.answers import Body, answer_frames
from shoal.frontends.h2.errors import ConnectionError_
from shoal.frontends.h2.streams import Stream

#: The transport's write buffer limits outside a wait for it to drain (asyncio's defaults).
_HIGH_WATER: Final = 64 * 1024
_LOW_WATER: Final = _HIGH_WATER // 4
#: A flush of this many pieces or more (a large answer in 16 KiB frames: a header and a view of
#: the output per frame) is written to the socket by the sender itself (``writev``) when the
#: transport holds nothing: uvloop makes two memoryviews of each piece it is given.
DIRECT_FROM: Final = 32
#: The most buffers one ``writev`` takes (Linux's UIO_MAXIOV).
_IOV_MAX: Final = 1024


class Sender:
    """Frames out of one connection. ``streams`` is the connection's table of open streams;
    ``end_local`` is called when a stream's END_STREAM has been written from its queue."""

    flush_scheduled = False
    #: HEADERS and DATA frames sent, for the ping policy (FloodGuard.ping).
    sent = 0
    #: WINDOW_UPDATEs the peer sent (connection's and streams'): the send timeout's progress.
    granted = 0
    #: Whether the next header block starts with a dynamic table size update (to 0).
    table_size_update = False

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        streams: dict[int, Stream],
        end_local: Callable[[int, Stream], None],
    ) -> None:
        #: The loop's ``call_soon``, read once: compiled, ``loop.call_soon`` is a generic
        #: attribute look-up at every flush.
        self._call_soon: Callable[..., object] = loop.call_soon
        self._streams = streams
        self._end_local = end_local
        self.transport: asyncio.Transport | None = None
        self.fd = -1  # the transport's socket, written directly (DIRECT_FROM); -1: none
        self._out: list[bytes | memoryview] = []
        # What the peer lets us send.
        self.window = h2.DEFAULT_WINDOW
        self.initial_window = h2.DEFAULT_WINDOW
        self.max_frame = h2.DEFAULT_MAX_FRAME
        self.blocked: dict[int, None] = {}  # streams with pending DATA, in order
        # after_sent's callbacks: waiting for the next flush, then for the buffer to drain.
        self._after_flush: list[Callable[[], None]] = []
        self._after_drain: list[Callable[[], None]] = []
        self._watching_drain = False

    def calls_open(self) -> bool:
        """Whether a stream is open (grpc-core PINGs only then, unless permitted)."""
        return bool(self._streams)

    def apply_setting(self, key: int, value: int) -> None:
        """Apply one of the peer's SETTINGS that concern what we send."""
        if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
            if value > h2.MAX_WINDOW:
                raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "initial window too large")
            delta = value - self.initial_window
            self.initial_window = value
            for stream in self._streams.values():
                stream.send_window += delta
        elif key == h2.SETTINGS_HEADER_TABLE_SIZE:
            # A decoder whose table shrinks below our encoder's expects a dynamic table size
            # update at the start of our next header block (RFC 7541 section 4.2; nghttp2
            # fails the connection without it, and older releases expect one after any
            # value). We never index: an update to 0 is always valid, so send one each time.
            self.table_size_update = True
        elif key == h2.SETTINGS_MAX_FRAME_SIZE:
            if not h2.DEFAULT_MAX_FRAME <= value <= h2.MAX_FRAME_LIMIT:
                raise ConnectionError_(h2.PROTOCOL_ERROR, f"max frame size {value}")
            self.max_frame = value

    def connection_window_update(self, increment: int) -> None:
        """The peer's WINDOW_UPDATE of the connection's window: go on with what waits."""
        if increment == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        self.window += increment
        self.granted += 1
        if self.window > h2.MAX_WINDOW:
            raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "the connection window overflowed")
        self.resume_blocked()

    # --- the socket ---------------------------------------------------------------------------

    def attach(self, transport: asyncio.Transport) -> None:
        """Write to ``transport`` (and its socket directly, if it has one)."""
        self.transport = transport
        self.fd = socket_fd(transport)

    def write(self, *data: bytes | memoryview) -> None:
        self._out.extend(data)
        self._flush_soon()

    def _flush_soon(self) -> None:
        """Have what was written leave at the end of this loop iteration."""
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self._call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        out, self._out = self._out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            if len(out) >= DIRECT_FROM and self.fd >= 0 and not transport.get_write_buffer_size():
                out = write_direct(self.fd, out)
            if out:
                transport.writelines(out)
        if self._after_flush:
            self._after_drain += self._after_flush
            self._after_flush = []
            self._check_drained()

    def waiting_bytes(self) -> int:
        """Bytes that wait for the peer: in the streams' queues (for its windows) and in the
        transport's buffer (for its socket)."""
        transport = self.transport
        waiting = 0 if transport is None else transport.get_write_buffer_size()
        for stream_id in self.blocked:
            stream = self._streams.get(stream_id)
            if stream is not None:
                waiting += stream.pending_bytes()
        return waiting

    def refusal(self, size: int, limit: int) -> str:
        """Why ``size`` more bytes may not wait for the peer, with what waits already past
        ``limit`` (FloodLimits.max_send_buffer); "" if they may (always, when nothing waits:
        an answer larger than the limit still goes to a client that takes what it is sent)."""
        waiting = self.waiting_bytes()
        if not waiting or waiting + size <= limit:
            return ""
        return (
            f"the connection holds {waiting} bytes of answers waiting for the client; "
            f"{size} more would pass its limit of {limit} "
            "(--grpc-max-connection-send-buffer-size)"
        )

    def drop(self) -> None:
        """Forget what waits to be written (the connection is aborted)."""
        self._out.clear()

    # --- memory lent to the transport ---------------------------------------------------------

    def after_sent(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once what has been written so far has left the process, or the
        connection is gone (:meth:`connection_lost`)."""
        if self.transport is None:
            callback()
            return
        self._after_flush.append(callback)
        self._flush_soon()

    def _check_drained(self) -> None:
        """Call back now if the transport holds nothing; else have it pause as long as it
        holds anything (limits 0), so that ``resume_writing`` says when it is empty."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # connection_lost calls back
        if transport.get_write_buffer_size() == 0:
            self._drained()
        elif not self._watching_drain:
            self._watching_drain = True
            transport.set_write_buffer_limits(high=0, low=0)

    def resume_writing(self) -> None:
        """The transport's buffer went below its low limit (empty, while watched)."""
        transport = self.transport
        if self._watching_drain and transport is not None and not transport.is_closing():
            self._watching_drain = False
            transport.set_write_buffer_limits(high=_HIGH_WATER, low=_LOW_WATER)
            self._check_drained()

    def _drained(self) -> None:
        callbacks, self._after_drain = self._after_drain, []
        for callback in callbacks:
            callback()

    def connection_lost(self) -> None:
        """The transport is gone, and its buffer with it: every callback is due."""
        self.transport = None
        self._after_drain += self._after_flush
        self._after_flush = []
        self._drained()

    # --- frames -------------------------------------------------------------------------------

    def headers(self, stream_id: int, block: bytes | memoryview, end_stream: bool) -> None:
        """HEADERS, and CONTINUATION frames for what exceeds the peer's frame size (a long
        grpc-message): a frame over that size is a connection error for the peer. The frames
        are written together, so nothing comes between them, as RFC 9113 section 6.10 asks."""
        self.sent += 1
        if self.table_size_update:
            self.table_size_update = False
            block = h2.TABLE_SIZE_ZERO + bytes(block)
        flags = h2.END_STREAM if end_stream else 0
        if len(block) <= self.max_frame:
            header = h2.frame_header(h2.HEADERS, flags | h2.END_HEADERS, stream_id, len(block))
            self.write(header, block)
        else:
            self._continued_headers(stream_id, memoryview(block), flags)

    def _continued_headers(self, stream_id: int, view: memoryview, flags: int) -> None:
        max_frame = self.max_frame
        kind = h2.HEADERS
        for offset in range(0, len(view), max_frame):
            chunk = view[offset : offset + max_frame]
            if offset + max_frame >= len(view):
                flags |= h2.END_HEADERS
            self.write(h2.frame_header(kind, flags, stream_id, len(chunk)), chunk)
            kind, flags = h2.CONTINUATION, 0

    def data(
        self, stream_id: int, stream: Stream, view: memoryview, end_stream: bool
    ) -> memoryview | None:
        """Write what the windows allow of ``view``; return the rest (None: all was written)."""
        size = len(view)
        allowed = _least(size, stream.send_window, self.window)
        if allowed < size and size:
            if allowed <= 0:
                return view
            end_stream = False
        self.sent += 1
        self._data_frames(stream_id, view, allowed, end_stream)
        stream.send_window -= allowed
        self.window -= allowed
        return view[allowed:] if allowed < size else None

    def _data_frames(self, stream_id: int, view: memoryview, size: int, end_stream: bool) -> None:
        """DATA frames of the peer's frame size for ``view[:size]`` (one empty one if 0): each
        a header and a view, no copy, straight into what the next flush writes; the full frames
        share one header."""
        max_frame = self.max_frame
        last = (size - 1) // max_frame * max_frame if size else 0  # where the last frame starts
        out = self._out
        if last:
            full = h2.frame_header(h2.DATA, 0, stream_id, max_frame)
            for offset in range(0, last, max_frame):
                out.append(full)
                out.append(view[offset : offset + max_frame])
        flags = h2.END_STREAM if end_stream else 0
        out.append(h2.frame_header(h2.DATA, flags, stream_id, size - last))
        if size > last:
            out.append(view[last:size])
        self._flush_soon()

    def answer(self, stream_id: int, head: bytes, body: Body, trailers: bytes) -> bool:
        """A stream's whole answer as one piece: HEADERS ``head``, one DATA frame holding the
        gRPC message ``body`` behind its 5-byte prefix, and HEADERS ``trailers`` ending the
        stream (a unary call's: three frame headers, three blocks and a join, where the
        frame-by-frame path costs a dozen calls and six pieces for the transport). False,
        nothing written, when it does not go at once whole (windows, frame size, a table size
        update due, something queued before it): the caller sends it frame by frame."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return True  # reset or refused: the frame-by-frame path would write nothing either
        size = len(body) + 5
        max_frame = self.max_frame
        if (
            self.table_size_update
            or stream.pending
            or size > _least(max_frame, stream.send_window, self.window)
            or len(head) > max_frame
            or len(trailers) > max_frame
        ):
            return False
        self._out.append(answer_frames(stream_id, head, body, trailers))
        self.sent += 3
        stream.send_window -= size
        self.window -= size
        scheduled = self.flush_scheduled
        self.flush_scheduled = True  # what ending the stream writes goes with the answer
        try:
            self._end_local(stream_id, stream)
        finally:  # the flag stays set only while a flush is due, whatever ending raised
            if not scheduled:
                self._flush_answered()
        return True

    def _flush_answered(self) -> None:
        """An answer was written outside a read (the call's work stepped from a done callback):
        have it leave. With another stream open, at the end of the loop iteration, with what
        the others answer in it (one ``writev``); with none, at once: nothing else can join
        this connection's writes before that flush would run (the reads that could come after
        it), and the loop handle that runs it costs ~4,000 instructions a call."""
        if self._streams:
            self._call_soon(self.flush)
        else:
            self.flush()

    # --- what waits for the peer's windows ----------------------------------------------------

    def send_data(self, stream_id: int, stream: Stream, view: memoryview, end_stream: bool) -> None:
        """Send DATA now as far as the windows allow; queue the rest."""
        rest = self.data(stream_id, stream, view, end_stream)
        if rest is not None:
            stream.queue().append((h2.DATA, rest, end_stream))
            self.blocked[stream_id] = None
        elif end_stream:
            self._end_local(stream_id, stream)

    def resume_blocked(self) -> None:
        """The connection's window opened: go on with the streams that wait, in order."""
        if not self.blocked:
            return  # the usual case: no list made of nothing
        for stream_id in list(self.blocked):
            if self.window <= 0:
                return
            stream = self._streams.get(stream_id)
            if stream is None:
                self.blocked.pop(stream_id, None)
            else:
                self.resume(stream_id, stream)

    def resume(self, stream_id: int, stream: Stream) -> None:
        """Write what waits on ``stream`` as far as the windows allow."""
        pending = stream.pending
        while pending:
            kind, view, end_stream = pending[0]
            if kind == h2.HEADERS:
                pending.popleft()
                self.headers(stream_id, view, end_stream)
            else:
                rest = self.data(stream_id, stream, view, end_stream)
                if rest is not None:
                    pending[0] = (kind, rest, end_stream)
                    self.blocked[stream_id] = None
                    break
                pending.popleft()
            if end_stream:
                self._end_local(stream_id, stream)
                return
        if not pending:
            self.blocked.pop(stream_id, None)
        stream.wake()


def _least(a: int, b: int, c: int) -> int:
    """``min(a, b, c)``: compiled, a builtin ``min`` of three is a generic call (~900
    instructions, on every answer); these comparisons are native."""
    least = a if a <= b else b
    return least if least <= c else c


def socket_fd(transport: object) -> int:
    """The file descriptor of ``transport``'s socket; -1 if it has none (a transport that is
    not a socket's, as in-process benchmarks and tests use) or its bytes are not the socket's
    (TLS, which shoal's gRPC server does not speak today)."""
    get_extra_info = getattr(transport, "get_extra_info", None)
    if get_extra_info is None or get_extra_info("sslcontext") is not None:
        return -1
    sock = get_extra_info("socket")
    return -1 if sock is None else int(sock.fileno())


def write_direct(fd: int, out: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Write what socket ``fd`` takes of ``out`` now (one ``writev`` per _IOV_MAX pieces);
    return the rest, for the transport. An error is left to the transport to meet and report."""
    start = 0
    while start < len(out):
        chunk = out[start : start + _IOV_MAX]
        try:
            sent = os.writev(fd, chunk)
        except OSError:  # full (BlockingIOError), or broken: the transport's business
            return out[start:]
        for index, piece in enumerate(chunk):
            size = len(piece)
            if sent < size:
                rest = out[start + index :]
                if sent:
                    rest[0] = memoryview(piece)[sent:]
                return rest
            sent -= size
        start += len(chunk)
    return []
