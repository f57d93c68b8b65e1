"""One HTTP/2 server connection on the event loop: frames in, streams opened and closed.

The connection reads frames straight from the bytes the loop hands it (:mod:`~.reading`),
keeps the table of open streams (:mod:`~.streams`) and answers SETTINGS, PING and WINDOW_UPDATE
itself. What the streams mean is the business of a :class:`StreamOpener` (shoal's gRPC calls,
:mod:`shoal.frontends.grpc.native`): given each new stream's headers, it returns the
:class:`StreamHandler` that receives its data.

Receiving: into a buffer the connection lends the transport (``BufferedProtocol``,
:func:`~shoal.frontends.h2.reading.read_buffer`), a large DATA frame's payload straight into its
stream's place (:mod:`~shoal.frontends.h2.placing`), runs of 16 KiB frames by scatter reads
(:mod:`~shoal.frontends.h2.scatter`). The largest windows HTTP/2 allows are advertised and credit
given back at half of a window: the gRPC layer bounds what a stream may send, not flow control.
Sending (:mod:`~shoal.frontends.h2.sending`): DATA within the peer's windows and frame size; what
an event-loop iteration writes leaves in one ``writev``; a small unary answer is one piece.
Floods (:mod:`~shoal.frontends.h2.floods`) end the connection with GOAWAY ``ENHANCE_YOUR_CALM``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Protocol, cast

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.answers import Body
from shoal.frontends.h2.errors import ConnectionError_, check_opened
from shoal.frontends.h2.floods import FloodGuard, FloodLimits
from shoal.frontends.h2.header_blocks import MAX_HEADER_LIST, HeaderDecoder, Headers
from shoal.frontends.h2.liveness import Liveness
from shoal.frontends.h2.placing import PLACE_FROM, Placing
from shoal.frontends.h2.reading import RECEIVE_MAX_FRAME, FrameHandler, FrameReader, read_buffer
from shoal.frontends.h2.scatter import Scatter, scatter_for
from shoal.frontends.h2.sending import Sender
from shoal.frontends.h2.streams import Stream, StreamHandler, any_mid_message, forget

__all__ = ["MAX_CONCURRENT_STREAMS", "ConnectionError_", "FloodLimits", "Headers"]
__all__ += ["Http2Connection", "StreamHandler", "StreamOpener"]

log = logging.getLogger(__name__)

#: Streams a client may have open at once (advertised; more are refused with REFUSED_STREAM).
MAX_CONCURRENT_STREAMS: Final = 1024


class StreamOpener(Protocol):
    def __call__(
        self, connection: Http2Connection, stream_id: int, headers: Headers, end_stream: bool
    ) -> StreamHandler | None:
        """The handler of a new stream, or None when it was answered and closed at once."""


class Http2Connection(asyncio.BufferedProtocol):
    """An HTTP/2 server connection (prior knowledge, cleartext: gRPC's ``h2c``)."""

    _last_stream_id = 0  # the last stream opened: what GOAWAY reports
    _highest_stream_id = 0  # the last the peer used, those refused after GOAWAY too
    _recv_unacked = 0  # credit we have not yet given back on the connection
    _going_away = False

    def __init__(
        self,
        open_stream: StreamOpener,
        on_close: Callable[[Http2Connection], None],
        max_concurrent_streams: int = MAX_CONCURRENT_STREAMS,
        limits: FloodLimits | None = None,
        reads: memoryview | None = None,
    ):
        #: What the transport reads into (shared with the server's other connections).
        self._reads = read_buffer() if reads is None else reads
        self._max_streams = max_concurrent_streams
        self._limits = limits = limits or FloodLimits()
        self._open_stream = open_stream
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self._decoder = HeaderDecoder()
        self._streams: dict[int, Stream] = {}
        self._guard = FloodGuard(limits, self._loop)
        self._sender = Sender(self._loop, self._streams, self._end_local)
        self._reader = FrameReader(
            self._frame_table(), self._on_data, self._header_block, self._guard
        )
        self._placing = Placing(self._reader, self._streams, self._reads)
        self._scatter: Scatter | None = None
        self.last_read = self._loop.time()
        self._liveness = Liveness(self, self._sender, limits)
        self.closed: asyncio.Future[None] = self._loop.create_future()

    def _frame_table(self) -> dict[int, FrameHandler]:
        """What handles each frame type but DATA and header blocks (the reader assembles those)."""
        return {
            h2.SETTINGS: self._on_settings,
            h2.WINDOW_UPDATE: self._on_window_update,
            h2.PING: self._on_ping,
            h2.RST_STREAM: self._on_rst_stream,
            h2.GOAWAY: self._on_goaway,
            h2.PUSH_PROMISE: self._on_push_promise,
        }

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._liveness.start()
        self._sender.attach(cast(asyncio.Transport, transport))
        self._scatter = scatter_for(self._sender.fd, self._reader, self._streams, self._count_data)
        self._placing.runs = self._scatter is not None
        settings = {
            h2.SETTINGS_ENABLE_PUSH: 0,
            h2.SETTINGS_INITIAL_WINDOW_SIZE: h2.MAX_WINDOW,
            h2.SETTINGS_MAX_FRAME_SIZE: RECEIVE_MAX_FRAME,
            h2.SETTINGS_MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            h2.SETTINGS_MAX_CONCURRENT_STREAMS: self._max_streams,
        }
        self._sender.write(h2.settings_frame(settings))
        self._sender.write(h2.window_update(0, h2.MAX_WINDOW - h2.DEFAULT_WINDOW))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._placing.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._placing.stream is None:
            self._received(self._reads[:nbytes], 0)
        else:
            self._received(None, nbytes)

    def data_received(self, data: bytes | memoryview) -> None:
        """Handle bytes read; nothing keeps a view of ``data`` after the call."""
        self._received(data, 0)

    def _received(self, data: bytes | memoryview | None, placed: int) -> None:
        """Handle ``data`` read, or ``placed`` bytes read straight into a stream's place."""
        self.last_read = self._loop.time()
        sender = self._sender
        scheduled = sender.flush_scheduled
        sender.flush_scheduled = True  # what parsing writes leaves at the end of this call
        try:
            if data is None:
                self._placed(placed)
            else:
                self._reader.feed(data)
            if self._scatter is not None and self._scatter.read() >= PLACE_FROM:
                self._placing.large = True
        except ConnectionError_ as exc:
            self._fail(exc)
            return
        if not scheduled:
            sender.flush()

    def _fail(self, exc: ConnectionError_) -> None:
        """End the connection for a connection error: GOAWAY, or at once if ``exc.abort``."""
        log.debug("HTTP/2 connection error: %s", exc)
        self._abort_streams()
        transport = self._sender.transport
        if exc.abort:
            self._sender.drop()
            if transport is not None:
                transport.abort()
            return
        self._sender.write(h2.goaway(self._last_stream_id, exc.code, str(exc).encode()))
        self._sender.flush()
        if transport is not None:
            transport.close()

    def pause_writing(self) -> None:
        self._guard.pause_writing()

    def resume_writing(self) -> None:
        self._guard.resume_writing()
        self._sender.resume_writing()

    def half_sent(self) -> bool:
        """Whether a preface, frame, header block or message has arrived in part."""
        return self._reader.half_read() or any_mid_message(self._streams)

    def connection_lost(self, exc: Exception | None) -> None:
        self._liveness.stop()
        self._abort_streams()
        self._sender.connection_lost()
        if not self.closed.done():
            self.closed.set_result(None)
        self._on_close(self)

    # --- what handlers call -------------------------------------------------------------------

    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block: one HEADERS frame, or more (CONTINUATION) past the peer's frame size."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.pending:  # after the data still waiting for window
            stream.pending.append((h2.HEADERS, memoryview(block), end_stream))
            return
        self._sender.headers(stream_id, block, end_stream)
        if end_stream:
            self._end_local(stream_id, stream)

    def send_answer(self, stream_id: int, head: bytes, body: Body, tail: bytes) -> bool:
        """A small answer whole (:meth:`Sender.answer`); False: it goes frame by frame."""
        return self._sender.answer(stream_id, head, body, tail)

    def send_data(
        self, stream_id: int, data: bytes | bytearray | memoryview, end_stream: bool = False
    ) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if stream.pending:
            stream.pending.append((h2.DATA, memoryview(data), end_stream))
        else:
            self._sender.send_data(stream_id, stream, memoryview(data), end_stream)

    def after_stream(self, stream_id: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the stream is over (ended, reset, or the connection lost) and
        what it wrote has left the process: then memory its DATA viewed may be reused."""
        stream = self._streams.get(stream_id)
        if stream is None:
            self._sender.after_sent(callback)
        else:
            stream.on_over.append(callback)

    def _over(self, stream: Stream) -> None:
        """The stream has left the table: its after_stream callbacks wait for the writes."""
        for callback in stream.over_callbacks():
            self._sender.after_sent(callback)

    async def writable(self, stream_id: int, limit: int) -> None:
        """Return once less than ``limit`` bytes of the stream wait for the peer's window."""
        stream = self._streams.get(stream_id)
        while stream is not None and stream.pending_bytes() >= limit:
            waiter = self._loop.create_future()
            stream.waiters.append(waiter)
            await waiter
            stream = self._streams.get(stream_id)

    def reset_stream(self, stream_id: int, code: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._sender.blocked.pop(stream_id, None)
            stream.wake()
            self._sender.write(h2.rst_stream(stream_id, code))
            self._over(stream)
            self._close_if_idle()

    def go_away(self) -> None:
        """Refuse new streams (GOAWAY); the connection closes once its streams are done."""
        if self._going_away:
            return
        self._going_away = True
        self._sender.write(h2.goaway(self._last_stream_id, h2.NO_ERROR))
        self._close_if_idle()

    def close(self) -> None:
        transport = self._sender.transport
        if transport is not None:
            self._sender.flush()
            transport.close()

    # --- what the clocks call (liveness) -------------------------------------------------------

    def cut(self, code: int, reason: str) -> None:
        """End at once (a peer that stopped taking part): calls reset, GOAWAY if it goes."""
        self._abort_streams()
        self._sender.drop()
        self._sender.write(h2.goaway(self._last_stream_id, code, reason.encode()))
        self._sender.flush()
        if self._sender.transport is not None:
            self._sender.transport.abort()

    def send_refusal(self, size: int) -> str:
        """Why an answer of ``size`` bytes may not wait for the peer too; "" if it may."""
        return self._sender.refusal(size, self._limits.max_send_buffer)

    # --- frames in ----------------------------------------------------------------------------

    def _on_ping(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if len(payload) != 8 or stream_id:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a malformed PING")
        if not flags & h2.ACK:
            self._guard.ping(bool(self._streams), self._sender.sent)
            self._reply(h2.frame(h2.PING, h2.ACK, 0, bytes(payload)))

    def _on_goaway(self, stream_id: int, flags: int, payload: memoryview) -> None:
        self._going_away = True
        self._close_if_idle()

    def _on_push_promise(self, stream_id: int, flags: int, payload: memoryview) -> None:
        raise ConnectionError_(h2.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")

    def _reply(self, frame: bytes) -> None:
        """Write a control frame the peer's frame asked for; the peer must read them."""
        self._guard.reply()
        self._sender.write(frame)

    def _on_data(
        self, stream_id: int, end_stream: bool, pieces: list[memoryview], length: int
    ) -> None:
        """A run of the stream's DATA frames (FrameReader): counted against the windows once."""
        handler = self._count_data(stream_id, end_stream, length)
        if handler is not None:
            handler.data_received(pieces, end_stream)

    def _placed(self, nbytes: int) -> None:
        """``nbytes`` of the DATA frame in progress were read into its stream's place."""
        stream_id, end_stream = self._reader.data_due()[0], self._reader.placed(nbytes)
        # At the frame's end, the next read takes one header: most likely of the stream's next
        # frame, whose payload then goes into place too.
        self._placing.header_next = not end_stream and not self._reader.data_due()[1]
        handler = self._count_data(stream_id, end_stream, nbytes)
        if handler is not None:
            handler.data_placed(nbytes, end_stream)

    def _count_data(self, stream_id: int, end_stream: bool, length: int) -> StreamHandler | None:
        """Count DATA of the stream against the windows; the handler to hand it to, if any."""
        if stream_id == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on stream 0")
        self._credit(length)  # padding counts against the window too
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._highest_stream_id:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on an idle stream")
            return None  # a stream we have already closed, reset or refused: data dropped
        if stream.remote_closed:  # half-closed (remote): see _header_block
            self._reset_by_us(stream_id, stream, h2.STREAM_CLOSED)
            return None
        stream.recv_unacked += length
        if end_stream:
            stream.remote_closed = True
        elif stream.recv_unacked >= h2.MAX_WINDOW // 2:
            self._sender.write(h2.window_update(stream_id, stream.recv_unacked))
            stream.recv_unacked = 0
        return stream.handler

    def _credit(self, received: int) -> None:
        """Count DATA against the connection's window; give credit back at half of it."""
        self._recv_unacked += received
        if self._recv_unacked >= h2.MAX_WINDOW // 2:
            self._sender.write(h2.window_update(0, self._recv_unacked))
            self._recv_unacked = 0

    def _header_block(self, stream_id: int, flags: int, block: memoryview) -> None:
        headers = self._decoder.decode(block.tobytes())  # (bytes(block): ~400 more)
        end_stream = bool(flags & h2.END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None and stream.remote_closed:
            # Half-closed (remote): a stream error (RFC 9113 section 5.1), as the peer's reset.
            self._reset_by_us(stream_id, stream, h2.STREAM_CLOSED)
        elif stream is not None:
            self._trailers(stream, end_stream)
        elif stream_id % 2 == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}")
        elif stream_id > self._highest_stream_id:
            self._open(stream_id, headers, end_stream)
        # Else a stream already closed (trailers crossing our RST_STREAM; frames on a stream
        # we reset are ignored, RFC 9113 section 5.1): decoded all the same, for HPACK's state.

    def _trailers(self, stream: Stream, end_stream: bool) -> None:
        if not end_stream:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "trailers without END_STREAM")
        stream.remote_closed = True
        if stream.handler is not None:
            stream.handler.trailers_received()

    def _open(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        self._highest_stream_id = stream_id
        if self._going_away or len(self._streams) >= self._max_streams:
            # Refused (the client may retry it); what the peer sends on it still counts as a
            # known, closed stream.
            self._reply(h2.rst_stream(stream_id, h2.REFUSED_STREAM))
            return
        self._last_stream_id = stream_id
        stream = Stream(None, self._sender.initial_window)
        stream.remote_closed = end_stream
        self._streams[stream_id] = stream
        stream.handler = self._open_stream(self, stream_id, headers, end_stream)

    def _on_settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id != 0 or len(payload) % 6:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a malformed SETTINGS frame")
        if flags & h2.ACK:
            return
        for key, value in h2.parse_settings(payload):
            self._sender.apply_setting(key, value)
        self._reply(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._sender.resume_blocked()

    def _on_window_update(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        if stream_id == 0:
            self._sender.connection_window_update(h2.read_u32(payload))
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            check_opened("WINDOW_UPDATE", stream_id, self._highest_stream_id)
            return  # a closed stream's (the client's credit for a whole answer): not read
        increment = h2.read_u32(payload)
        if increment == 0:  # RFC 9113 section 6.9: a stream error of type PROTOCOL_ERROR
            self._reset_by_us(stream_id, stream, h2.PROTOCOL_ERROR)
        elif stream.send_window + increment > h2.MAX_WINDOW:
            self._reset_by_us(stream_id, stream, h2.FLOW_CONTROL_ERROR)
        else:
            stream.send_window += increment
            self._sender.granted += 1
            if stream.pending:
                self._sender.resume(stream_id, stream)

    def _on_rst_stream(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "a malformed RST_STREAM")
        check_opened("RST_STREAM", stream_id, self._highest_stream_id)
        stream = self._streams.pop(stream_id, None)
        self._sender.blocked.pop(stream_id, None)
        if stream is not None:
            stream.reset()
            self._guard.reset()
            self._over(stream)
        self._close_if_idle()

    # --- streams ending -----------------------------------------------------------------------

    def _end_local(self, stream_id: int, stream: Stream) -> None:
        """We have sent END_STREAM: the stream is over for us."""
        forget(self._streams, self._sender.blocked, stream_id)
        stream.wake()
        if not stream.remote_closed:
            # The answer is complete: tell the client to stop sending (RFC 9113 section 8.1).
            self._sender.write(h2.rst_stream(stream_id, h2.NO_ERROR))
        self._over(stream)
        self._close_if_idle()

    def _reset_by_us(self, stream_id: int, stream: Stream, code: int) -> None:
        self.reset_stream(stream_id, code)
        if stream.handler is not None:
            stream.handler.reset()

    def _close_if_idle(self) -> None:
        if self._going_away and not self._streams:
            self.close()

    def _abort_streams(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()  # the sender shares this table
        self._sender.blocked.clear()
        for stream in streams:
            stream.reset()
            self._over(stream)
