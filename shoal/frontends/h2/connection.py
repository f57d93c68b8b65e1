"""One HTTP/2 server connection on the event loop: framing, streams and flow control.

The connection parses frames straight from the bytes the loop hands it, and answers SETTINGS,
PING and WINDOW_UPDATE itself. What the streams mean is the business of a :class:`StreamOpener`
(shoal's gRPC calls, :mod:`shoal.frontends.grpc.native`): it is given each new stream's headers
and returns the :class:`StreamHandler` that receives its data.

Receiving: the connection advertises the largest windows HTTP/2 allows and gives credit back when
half of a window is used, so a client is never slowed down by flow control; the size of what a
stream may send is bounded by the gRPC layer (its message size limit), not by windows.
Sending: DATA respects the peer's connection and stream windows and its frame size; what does not
fit waits for WINDOW_UPDATE. Everything written during one event-loop iteration leaves in one
``writev``: a unary call's headers, message and trailers, and the answers of several streams.

Floods (:class:`FloodLimits`, docs/hardening.md "HTTP/2 floods") end the connection with GOAWAY
``ENHANCE_YOUR_CALM``: PINGs past grpc-core's ping policy (the one Triton's
``--grpc-http2-*`` flags set), more than a bounded number of replies (PING and SETTINGS ACKs,
RST_STREAM) queued for a peer that does not read, streams reset faster than a token bucket
allows, and long runs of frames that carry nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import hpack

from shoal.frontends.h2 import frames as h2

log = logging.getLogger(__name__)

#: Largest frame the peer may send: fewer frames to parse for large tensors.
RECEIVE_MAX_FRAME = 1 << 20
#: Largest header list accepted (names + values + 32 bytes per field, as RFC 9113 counts).
MAX_HEADER_LIST = 1 << 16
#: Streams a client may have open at once (advertised; more are refused with REFUSED_STREAM).
MAX_CONCURRENT_STREAMS = 1024

Headers = list[tuple[bytes, bytes]]

#: grpc-core's interval between pings on a connection without calls, unless permitted (2 hours).
_IDLE_PING_INTERVAL = 7200.0


@dataclass(frozen=True)
class FloodLimits:
    """What a peer may send before the connection ends with GOAWAY ``ENHANCE_YOUR_CALM``.

    The ping policy is grpc-core's (Triton's flags and defaults): a PING sooner than
    ``min_ping_interval`` seconds after the previous one is a strike, unless the server sent
    HEADERS or DATA in between; more than ``max_ping_strikes`` strikes (0: any number) end the
    connection. Without calls in progress the interval is 2 hours unless
    ``permit_pings_without_calls``. The rest are nghttp2's defaults: ``max_queued_replies``
    control frames written while the peer does not read (the transport has paused writing),
    ``reset_burst`` streams reset by the peer at once and ``reset_rate`` a second after that.
    ``max_empty_frames``: frames in a row that carry nothing (empty DATA or header fragments,
    PRIORITY, unknown types).
    """

    max_ping_strikes: int = 2
    min_ping_interval: float = 300.0
    permit_pings_without_calls: bool = False
    max_queued_replies: int = 1000
    reset_burst: int = 1000
    reset_rate: float = 33.0
    max_empty_frames: int = 1000
    #: Seconds without a byte while something is half-sent (the preface, a frame, a header
    #: block or a stream's message): then the connection is dropped (nginx's read timeouts).
    read_timeout: float = 60.0


#: Decoded header blocks remembered per connection.
_BLOCK_CACHE = 64


class StreamHandler(Protocol):
    def data_received(self, data: memoryview, end_stream: bool) -> None:
        """A DATA frame's payload, valid only during the call (copy what you keep)."""

    def trailers_received(self) -> None:
        """The peer ended its side with a header block (trailers) instead of a DATA frame."""

    def reset(self) -> None:
        """The stream ended abnormally: the peer reset it, or the connection was lost."""

    def mid_message(self) -> bool:
        """Whether part of a request message has arrived and the rest is due."""


class StreamOpener(Protocol):
    def __call__(
        self, connection: Http2Connection, stream_id: int, headers: Headers, end_stream: bool
    ) -> StreamHandler | None:
        """The handler of a new stream, or None when it was answered and closed at once."""


class _Stream:
    __slots__ = ("handler", "pending", "recv_unacked", "remote_closed", "send_window", "waiters")

    def __init__(self, handler: StreamHandler | None, send_window: int) -> None:
        self.handler = handler
        self.send_window = send_window
        # DATA (and a final header block) that did not fit the peer's windows, in order:
        # (kind, payload, end_stream).
        self.pending: deque[tuple[int, memoryview, bool]] = deque()
        self.recv_unacked = 0
        self.remote_closed = False
        self.waiters: list[asyncio.Future[None]] = []


class ConnectionError_(Exception):
    """A connection error: the connection ends with GOAWAY and ``code``; ``abort``: at once,
    dropping what waits to be written (the peer does not read it)."""

    def __init__(self, code: int, message: str, abort: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.abort = abort


class Http2Connection(asyncio.Protocol):
    """An HTTP/2 server connection (prior knowledge, cleartext: gRPC's ``h2c``)."""

    def __init__(
        self,
        open_stream: StreamOpener,
        on_close: Callable[[Http2Connection], None],
        max_concurrent_streams: int = MAX_CONCURRENT_STREAMS,
        limits: FloodLimits | None = None,
    ):
        self._max_streams = max_concurrent_streams
        self._limits = limits = limits or FloodLimits()
        self._open_stream = open_stream
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._blocks: dict[bytes, tuple[tuple[object, int, int], Headers]] = {}
        self._streams: dict[int, _Stream] = {}
        self._last_stream_id = 0  # the last stream opened: what GOAWAY reports
        self._highest_stream_id = 0  # the last the peer used, those refused after GOAWAY too
        self._continuation: tuple[int, int, bytearray] | None = None  # stream, flags, block
        # What the peer lets us send.
        self._send_window = h2.DEFAULT_WINDOW
        self._initial_send_window = h2.DEFAULT_WINDOW
        self._send_max_frame = h2.DEFAULT_MAX_FRAME
        # Whether the next header block starts with a dynamic table size update (to 0).
        self._table_size_update = False
        self._blocked: dict[int, None] = {}  # streams with pending DATA, in order
        # Credit we have not yet given back on the connection.
        self._recv_unacked = 0
        self._out: list[bytes | memoryview] = []
        self._flush_scheduled = False
        self._going_away = False
        # Flood accounting (FloodLimits).
        self._last_ping: float | None = None  # None: we sent HEADERS or DATA since
        self._ping_strikes = 0
        self._writing_paused = False
        self._queued_replies = 0  # control frames written while writing is paused
        self._reset_tokens = float(limits.reset_burst)
        self._reset_time = self._loop.time()
        self._empty_frames = 0
        self._last_read = self._loop.time()
        self._watch: asyncio.TimerHandle | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._watch = self._loop.call_later(self._limits.read_timeout, self._check_reads)
        self._transport = cast(asyncio.Transport, transport)
        settings = {
            h2.SETTINGS_ENABLE_PUSH: 0,
            h2.SETTINGS_INITIAL_WINDOW_SIZE: h2.MAX_WINDOW,
            h2.SETTINGS_MAX_FRAME_SIZE: RECEIVE_MAX_FRAME,
            h2.SETTINGS_MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            h2.SETTINGS_MAX_CONCURRENT_STREAMS: self._max_streams,
        }
        self._write(h2.settings_frame(settings))
        self._write(h2.window_update(0, h2.MAX_WINDOW - h2.DEFAULT_WINDOW))

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        scheduled = self._flush_scheduled
        self._flush_scheduled = True  # what parsing writes leaves at the end of this call
        try:
            if self._buffer:
                self._buffer += data
                consumed = self._parse(self._buffer)
                try:
                    del self._buffer[:consumed]
                except BufferError:  # a handler kept a view: keep the rest in a new buffer
                    self._buffer = bytearray(memoryview(self._buffer)[consumed:])
            else:
                consumed = self._parse(data)
                if consumed < len(data):
                    self._buffer = bytearray(memoryview(data)[consumed:])
        except ConnectionError_ as exc:
            log.debug("HTTP/2 connection error: %s", exc)
            self._abort_streams()
            if exc.abort:
                self._out.clear()
                if self._transport is not None:
                    self._transport.abort()
                return
            self._write(h2.goaway(self._last_stream_id, exc.code, str(exc).encode()))
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        if not scheduled:
            self._flush()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._queued_replies = 0

    def _check_reads(self) -> None:
        """The connection's timer: drop it when something half-sent has stalled (see
        FloodLimits.read_timeout). Idle connections stay: gRPC clients keep theirs for long."""
        self._watch = None
        if self._transport is None:
            return
        timeout = self._limits.read_timeout
        now = self._loop.time()
        if now - self._last_read >= timeout and self._half_sent():
            log.debug("HTTP/2 connection dropped: nothing read for %g s mid-request", timeout)
            self._abort_streams()
            self._transport.abort()
            return
        self._watch = self._loop.call_later(
            max(self._last_read + timeout - now, 1.0), self._check_reads
        )

    def _half_sent(self) -> bool:
        if not self._preface_seen or self._buffer or self._continuation is not None:
            return True
        return any(
            stream.handler is not None and stream.handler.mid_message()
            for stream in self._streams.values()
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._transport = None
        self._abort_streams()
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
        self._write_headers(stream_id, block, end_stream)
        if end_stream:
            self._end_local(stream_id, stream)

    def send_data(
        self, stream_id: int, data: bytes | bytearray | memoryview, end_stream: bool = False
    ) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        view = memoryview(data)
        if stream.pending:
            stream.pending.append((h2.DATA, view, end_stream))
            return
        rest = self._send_within_window(stream_id, stream, view, end_stream)
        if rest is not None:
            stream.pending.append((h2.DATA, rest, end_stream))
            self._blocked[stream_id] = None
        elif end_stream:
            self._end_local(stream_id, stream)

    async def writable(self, stream_id: int, limit: int) -> None:
        """Return once less than ``limit`` bytes of the stream wait for the peer's window."""
        stream = self._streams.get(stream_id)
        while stream is not None and sum(len(p) for _, p, _ in stream.pending) >= limit:
            waiter = self._loop.create_future()
            stream.waiters.append(waiter)
            await waiter
            stream = self._streams.get(stream_id)

    def reset_stream(self, stream_id: int, code: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._blocked.pop(stream_id, None)
            self._wake(stream)
            self._write(h2.rst_stream(stream_id, code))
            self._close_if_idle()

    def go_away(self) -> None:
        """Refuse new streams (GOAWAY); the connection closes once its streams are done."""
        if self._going_away:
            return
        self._going_away = True
        self._write(h2.goaway(self._last_stream_id, h2.NO_ERROR))
        self._close_if_idle()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    # --- receiving ----------------------------------------------------------------------------

    def _parse(self, data: bytes | bytearray) -> int:
        """Handle every whole frame of ``data``; return the bytes consumed."""
        view = memoryview(data)
        total = len(view)
        offset = 0
        if not self._preface_seen:
            if total < len(h2.PREFACE):
                if not h2.PREFACE.startswith(bytes(view)):
                    raise ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return 0
            if view[: len(h2.PREFACE)] != h2.PREFACE:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface_seen = True
            offset = len(h2.PREFACE)
        unpack = h2.FRAME_HEADER.unpack_from
        while total - offset >= h2.FRAME_HEADER_SIZE:
            high, low, kind, flags, stream_id = unpack(view, offset)
            length = (high << 8) | low
            if length > RECEIVE_MAX_FRAME:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            end = offset + h2.FRAME_HEADER_SIZE + length
            if end > total:
                break
            payload = view[offset + h2.FRAME_HEADER_SIZE : end]
            offset = end
            stream_id &= 0x7FFFFFFF
            if self._continuation is not None and kind != h2.CONTINUATION:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
            if _carries_nothing(kind, flags, length):
                self._empty_frames += 1
                if self._empty_frames > self._limits.max_empty_frames:
                    raise ConnectionError_(
                        h2.ENHANCE_YOUR_CALM, "too many frames that carry nothing"
                    )
            elif kind == h2.DATA or kind == h2.HEADERS or kind == h2.CONTINUATION:
                self._empty_frames = 0
            if kind == h2.DATA:
                self._on_data(stream_id, flags, payload)
            elif kind == h2.HEADERS:
                self._on_headers(stream_id, flags, payload)
            elif kind == h2.CONTINUATION:
                self._on_continuation(stream_id, flags, payload)
            elif kind == h2.SETTINGS:
                self._on_settings(stream_id, flags, payload)
            elif kind == h2.WINDOW_UPDATE:
                self._on_window_update(stream_id, payload)
            elif kind == h2.PING:
                if len(payload) != 8 or stream_id:
                    raise ConnectionError_(h2.PROTOCOL_ERROR, "a malformed PING")
                if not flags & h2.ACK:
                    self._ping_received()
                    self._reply(h2.frame(h2.PING, h2.ACK, 0, bytes(payload)))
            elif kind == h2.RST_STREAM:
                self._on_rst_stream(stream_id)
            elif kind == h2.GOAWAY:
                self._going_away = True
                self._close_if_idle()
            elif kind == h2.PUSH_PROMISE:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
            # PRIORITY and unknown frame types are ignored (RFC 9113 sections 5.3.2, 4.1).
        return offset

    def _ping_received(self) -> None:
        """grpc-core's ping policy (see FloodLimits)."""
        limits = self._limits
        now = self._loop.time()
        last = self._last_ping
        self._last_ping = now
        if last is None:
            return
        interval = limits.min_ping_interval
        if not self._streams and not limits.permit_pings_without_calls:
            interval = max(interval, _IDLE_PING_INTERVAL)
        if now - last < interval:
            self._ping_strikes += 1
            if limits.max_ping_strikes and self._ping_strikes > limits.max_ping_strikes:
                raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too_many_pings")

    def _reply(self, frame: bytes) -> None:
        """Write a control frame the peer's frame asked for; the peer must read them."""
        if self._writing_paused:
            self._queued_replies += 1
            if self._queued_replies > self._limits.max_queued_replies:
                raise ConnectionError_(
                    h2.ENHANCE_YOUR_CALM,
                    "too many replies wait for a peer that does not read",
                    abort=True,
                )
        self._write(frame)

    def _on_data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on stream 0")
        self._recv_unacked += len(payload)  # padding counts against the window too
        if self._recv_unacked >= h2.MAX_WINDOW // 2:
            self._write(h2.window_update(0, self._recv_unacked))
            self._recv_unacked = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self._highest_stream_id:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we have already closed, reset or refused: its data is dropped
        stream.recv_unacked += len(payload)
        if flags & h2.PADDED:
            payload = _unpad(payload)
        end_stream = bool(flags & h2.END_STREAM)
        if end_stream:
            stream.remote_closed = True
        elif stream.recv_unacked >= h2.MAX_WINDOW // 2:
            self._write(h2.window_update(stream_id, stream.recv_unacked))
            stream.recv_unacked = 0
        if stream.handler is not None:
            stream.handler.data_received(payload, end_stream)

    def _on_headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & h2.PADDED:
            payload = _unpad(payload)
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

    def _header_block(self, stream_id: int, flags: int, block: memoryview) -> None:
        headers = self._decode(bytes(block))
        end_stream = bool(flags & h2.END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers
            if not end_stream:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "trailers without END_STREAM")
            stream.remote_closed = True
            if stream.handler is not None:
                stream.handler.trailers_received()
            return
        if stream_id % 2 == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}")
        if stream_id <= self._highest_stream_id:
            # A stream already closed: the peer's trailers may cross our RST_STREAM, and frames
            # on a stream we reset are ignored (RFC 9113 section 5.1). Decoded all the same, for
            # the HPACK state.
            return
        self._highest_stream_id = stream_id
        if self._going_away or len(self._streams) >= self._max_streams:
            # Refused (the client may retry it); what the peer sends on it still counts as a
            # known, closed stream.
            self._reply(h2.rst_stream(stream_id, h2.REFUSED_STREAM))
            return
        self._last_stream_id = stream_id
        stream = _Stream(None, self._initial_send_window)
        stream.remote_closed = end_stream
        self._streams[stream_id] = stream
        stream.handler = self._open_stream(self, stream_id, headers, end_stream)

    def _decode(self, block: bytes) -> Headers:
        """Decode a header block; a block seen before is not decoded again while the dynamic
        table is as it was (a client's repeated calls send the same few bytes of indexes)."""
        table = self._decoder.header_table
        entries = table.dynamic_entries
        # An insertion puts a new entry first; an eviction alone needs a size update.
        state = (entries[0] if entries else None, len(entries), table.maxsize)
        cached = self._blocks.get(block)
        if cached is not None and cached[0] == state and cached[0][0] is state[0]:
            return cached[1]
        try:
            headers = cast(Headers, self._decoder.decode(block, raw=True))
        except hpack.HPACKError as exc:
            raise ConnectionError_(h2.COMPRESSION_ERROR, f"a bad header block: {exc}") from None
        after = (entries[0] if entries else None, len(entries), table.maxsize)
        if after == state and after[0] is state[0]:  # the block left the table alone
            if len(self._blocks) >= _BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[block] = (state, headers)
        return headers

    def _on_settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id != 0 or len(payload) % 6:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a malformed SETTINGS frame")
        if flags & h2.ACK:
            return
        for key, value in h2.parse_settings(payload):
            if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._initial_send_window
                self._initial_send_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == h2.SETTINGS_HEADER_TABLE_SIZE:
                # A decoder whose table shrinks below our encoder's expects a dynamic table size
                # update at the start of our next header block (RFC 7541 section 4.2; nghttp2
                # fails the connection without it, and older releases expect one after any
                # value). We never index: an update to 0 is always valid, so send one each time.
                self._table_size_update = True
            elif key == h2.SETTINGS_MAX_FRAME_SIZE:
                if not h2.DEFAULT_MAX_FRAME <= value <= h2.MAX_FRAME_LIMIT:
                    raise ConnectionError_(h2.PROTOCOL_ERROR, f"max frame size {value}")
                self._send_max_frame = value
        self._reply(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._resume_blocked()

    def _on_window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = h2.read_u32(payload)
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > h2.MAX_WINDOW:
                raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "the connection window overflowed")
            self._resume_blocked()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if increment == 0:  # RFC 9113 section 6.9: a stream error of type PROTOCOL_ERROR
            self._reset_by_us(stream_id, stream, h2.PROTOCOL_ERROR)
            return
        if stream.send_window + increment > h2.MAX_WINDOW:
            self._reset_by_us(stream_id, stream, h2.FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        if stream.pending:
            self._resume(stream_id, stream)

    def _on_rst_stream(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        if stream is not None:
            self._wake(stream)
            if stream.handler is not None:
                stream.handler.reset()
            self._count_reset()
        self._close_if_idle()

    def _count_reset(self) -> None:
        """A stream the peer reset while it was open: a token of the reset bucket."""
        limits = self._limits
        now = self._loop.time()
        tokens = self._reset_tokens + (now - self._reset_time) * limits.reset_rate
        self._reset_tokens = min(float(limits.reset_burst), tokens) - 1
        self._reset_time = now
        if self._reset_tokens < 0:
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too many streams reset")

    # --- sending ------------------------------------------------------------------------------

    def _send_within_window(
        self, stream_id: int, stream: _Stream, view: memoryview, end_stream: bool
    ) -> memoryview | None:
        """Write what the windows allow of ``view``; return the rest (None: all was written)."""
        size = len(view)
        allowed = min(size, stream.send_window, self._send_window)
        if allowed < size and size:
            if allowed <= 0:
                return view
            end_stream = False
        self._last_ping = None  # data sent: grpc-core forgives earlier pings
        self._ping_strikes = 0
        max_frame = self._send_max_frame
        offset = 0
        while True:
            chunk = min(max_frame, allowed - offset)
            last = offset + chunk >= allowed
            flags = h2.END_STREAM if end_stream and last else 0
            self._write(h2.frame_header(h2.DATA, flags, stream_id, chunk))
            if chunk:
                self._write(view[offset : offset + chunk])
            offset += chunk
            if last:
                break
        stream.send_window -= allowed
        self._send_window -= allowed
        return view[allowed:] if allowed < size else None

    def _resume_blocked(self) -> None:
        for stream_id in list(self._blocked):
            if self._send_window <= 0:
                return
            stream = self._streams.get(stream_id)
            if stream is None:
                self._blocked.pop(stream_id, None)
            else:
                self._resume(stream_id, stream)

    def _resume(self, stream_id: int, stream: _Stream) -> None:
        while stream.pending:
            kind, view, end_stream = stream.pending[0]
            if kind == h2.HEADERS:
                stream.pending.popleft()
                self._write_headers(stream_id, view, end_stream)
                if end_stream:
                    self._end_local(stream_id, stream)
                    return
                continue
            rest = self._send_within_window(stream_id, stream, view, end_stream)
            if rest is not None:
                stream.pending[0] = (kind, rest, end_stream)
                self._blocked[stream_id] = None
                break
            stream.pending.popleft()
            if end_stream:
                self._end_local(stream_id, stream)
                return
        if not stream.pending:
            self._blocked.pop(stream_id, None)
        self._wake(stream)

    def _write_headers(self, stream_id: int, block: bytes | memoryview, end_stream: bool) -> None:
        """HEADERS, and CONTINUATION frames for what exceeds the peer's frame size (a long
        grpc-message): a frame over that size is a connection error for the peer. The frames
        are written together, so nothing comes between them, as RFC 9113 section 6.10 asks."""
        self._last_ping = None  # headers sent: grpc-core forgives earlier pings
        self._ping_strikes = 0
        if self._table_size_update:
            self._table_size_update = False
            block = h2.TABLE_SIZE_ZERO + bytes(block)
        max_frame = self._send_max_frame
        flags = h2.END_STREAM if end_stream else 0
        if len(block) <= max_frame:
            header = h2.frame_header(h2.HEADERS, flags | h2.END_HEADERS, stream_id, len(block))
            self._write(header, block)
            return
        view = memoryview(block)
        kind = h2.HEADERS
        for offset in range(0, len(view), max_frame):
            chunk = view[offset : offset + max_frame]
            if offset + max_frame >= len(view):
                flags |= h2.END_HEADERS
            self._write(h2.frame_header(kind, flags, stream_id, len(chunk)), chunk)
            kind, flags = h2.CONTINUATION, 0

    def _end_local(self, stream_id: int, stream: _Stream) -> None:
        """We have sent END_STREAM: the stream is over for us."""
        self._streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        self._wake(stream)
        if not stream.remote_closed:
            # The answer is complete: tell the client to stop sending (RFC 9113 section 8.1).
            self._write(h2.rst_stream(stream_id, h2.NO_ERROR))
        self._close_if_idle()

    def _reset_by_us(self, stream_id: int, stream: _Stream, code: int) -> None:
        self.reset_stream(stream_id, code)
        if stream.handler is not None:
            stream.handler.reset()

    def _wake(self, stream: _Stream) -> None:
        waiters, stream.waiters = stream.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _close_if_idle(self) -> None:
        if self._going_away and not self._streams:
            self.close()

    def _abort_streams(self) -> None:
        streams, self._streams = self._streams, {}
        self._blocked.clear()
        for stream in streams.values():
            self._wake(stream)
            if stream.handler is not None:
                stream.handler.reset()

    def _write(self, *data: bytes | memoryview) -> None:
        self._out.extend(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(out)


def _carries_nothing(kind: int, flags: int, length: int) -> bool:
    """Whether a frame is one a flood is made of (CVE-2019-9518): an empty DATA frame or header
    fragment that ends nothing, PRIORITY (which shoal ignores) or an unknown type."""
    if kind == h2.DATA:
        return length == 0 and not flags & h2.END_STREAM
    if kind == h2.HEADERS or kind == h2.CONTINUATION:
        return length == 0 and not flags & h2.END_HEADERS
    return kind == h2.PRIORITY or kind > h2.CONTINUATION


def _unpad(payload: memoryview) -> memoryview:
    if not payload:
        raise ConnectionError_(h2.PROTOCOL_ERROR, "a padded frame without a pad length")
    padding = payload[0]
    if padding >= len(payload):
        raise ConnectionError_(h2.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - padding]
