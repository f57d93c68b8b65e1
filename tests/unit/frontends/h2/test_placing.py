"""Reads straight into place: a connection driven as a transport drives it (``get_buffer``, the
socket's bytes written into the buffer it lends, ``buffer_updated``), with reads cut anywhere.
Whatever the cuts, each stream gets its payload byte-exact and in order, END_STREAM once, every
frame counted against the windows; the payload of large frames goes into the handler's place
(never past a frame's end), and small frames, padding, another stream's frames, a reset or a
lost connection take the buffer's way."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import Headers, Http2Connection
from shoal.frontends.h2.placing import PLACE_FROM

pytestmark = pytest.mark.timeout(60)

_HEADERS_BLOCK = b"\x83\x86\x84"  # :method POST, :scheme http, :path / (static entries)
_FRAME = 1 << 20  # what the connection lets a client send


class _Transport:
    def __init__(self) -> None:
        self.written = bytearray()

    def writelines(self, parts: list[Any]) -> None:
        for part in parts:
            self.written += part

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _Place:
    """A stream handler with a place for ``size`` bytes (when ``lends``), which keeps what it is
    given in order however it comes: read into its place, or handed on from the buffer."""

    def __init__(self, size: int, lends: bool) -> None:
        self.data = bytearray(size)
        self.filled = 0
        self.lends = lends
        self.placed = 0  # bytes read into place
        self.copied = 0  # bytes handed on from the buffer
        self.ends = 0
        self.was_reset = False
        self.lent: memoryview | None = None

    def receive_buffer(self, nbytes: int) -> memoryview | None:
        if not self.lends or self.filled == len(self.data):
            return None
        self.lent = memoryview(self.data)[self.filled : self.filled + nbytes]
        return self.lent

    def data_placed(self, nbytes: int, end_stream: bool) -> None:
        assert self.lent is not None and nbytes <= len(self.lent)
        self.lent = None
        self.filled += nbytes
        self.placed += nbytes
        self.ends += end_stream

    def data_received(self, pieces: list[memoryview], end_stream: bool) -> None:
        for piece in pieces:
            self.data[self.filled : self.filled + len(piece)] = piece
            self.filled += len(piece)
            self.copied += len(piece)
        self.ends += end_stream

    def trailers_received(self) -> None:
        self.ends += 1

    def reset(self) -> None:
        self.was_reset = True

    def mid_message(self) -> bool:
        return 0 < self.filled < len(self.data)


def _connection(
    sizes: dict[int, int], lends: bool = True
) -> tuple[Http2Connection, dict[int, _Place]]:
    handlers: dict[int, _Place] = {}

    def open_stream(
        connection: Http2Connection, stream_id: int, headers: Headers, end: bool
    ) -> _Place:
        handlers[stream_id] = _Place(sizes[stream_id], lends)
        return handlers[stream_id]

    connection = Http2Connection(open_stream, lambda _: None)
    connection.connection_made(_Transport())  # type: ignore[arg-type]
    return connection, handlers


def _open(stream_id: int) -> bytes:
    return h2.frame_header(h2.HEADERS, h2.END_HEADERS, stream_id, 3) + _HEADERS_BLOCK


def _data(stream_id: int, payload: bytes, flags: int = 0, pad: int = -1) -> bytes:
    if pad >= 0:
        flags |= h2.PADDED
        payload = bytes((pad,)) + payload + bytes(pad)
    return h2.frame_header(h2.DATA, flags, stream_id, len(payload)) + payload


def _frames(stream_id: int, payload: bytes, frame: int, end: bool = True) -> list[bytes]:
    out = [_data(stream_id, payload[at : at + frame]) for at in range(0, len(payload), frame)]
    if end:
        out[-1] = _data(stream_id, payload[-(len(payload) % frame or frame) :], h2.END_STREAM)
    return out


def _payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _drive(connection: Http2Connection, wire: bytes, reads: list[int]) -> list[int]:
    """Feed ``wire`` as a socket would: each read writes into the buffer the connection lends,
    at most the next of ``reads`` bytes (cycled); returns the sizes of the buffers lent."""
    lent = []
    at = 0
    for most in itertools.cycle(reads):
        if at == len(wire):
            return lent
        buffer = connection.get_buffer(-1)
        lent.append(len(buffer))
        size = min(len(buffer), most, len(wire) - at)
        buffer[:size] = wire[at : at + size]
        at += size
        connection.buffer_updated(size)
    return lent


def _start() -> bytes:
    return h2.PREFACE + h2.settings_frame({})


def test_large_frames_go_into_place_whatever_the_reads() -> None:
    """1 MiB frames and a last short one, read in reads of every kind of size: the payload is
    byte-exact, most of it placed, END_STREAM once, every byte counted on the windows."""
    payload = _payload(3 * _FRAME + 70_000, 1)

    async def scenario(reads: list[int]) -> None:
        connection, handlers = _connection({1: len(payload)})
        wire = _start() + _open(1) + b"".join(_frames(1, payload, _FRAME))
        _drive(connection, wire, reads)
        handler = handlers[1]
        assert bytes(handler.data) == payload
        assert handler.ends == 1
        assert handler.placed + handler.copied == len(payload)
        assert handler.placed > 2 * _FRAME  # the frames' ends went into place
        # All counted on the windows (far below the half of one that WINDOW_UPDATE waits for).
        assert connection._recv_unacked == connection._streams[1].recv_unacked == len(payload)
        assert not connection._reader.half_read()
        connection.connection_lost(None)

    for reads in ([256 * 1024], [1 << 22], [1, 8, 9, 10, 65536], [100_003, 7], [9, 1 << 22]):
        asyncio.run(scenario(reads))


def test_a_read_into_place_never_passes_the_frame_or_the_place() -> None:
    """Each buffer lent for a place ends with the frame's payload (the next header is read
    into the buffer, one header only), and with the place: a place smaller than the frame
    takes what fits, the rest comes through the buffer."""

    async def scenario() -> None:
        payload = _payload(2 * _FRAME, 2)
        connection, handlers = _connection({1: len(payload)})
        prefix = _start() + _open(1)
        _drive(connection, prefix, [len(prefix)])
        first = _data(1, payload[:_FRAME])
        lent = _drive(connection, first + _data(1, payload[_FRAME:], h2.END_STREAM), [1 << 22])
        # the header and the first 256 KiB-minus-a-header into the buffer, the rest into
        # place up to the frame's end, then a header alone, then the second frame in place
        assert lent == [256 * 1024, _FRAME - (256 * 1024 - 9), 9, _FRAME]
        assert bytes(handlers[1].data) == payload
        assert handlers[1].ends == 1
        connection.connection_lost(None)

    asyncio.run(scenario())


def test_small_padded_or_unplaced_frames_take_the_buffer() -> None:
    """16 KiB frames (cut by reads with less than PLACE_FROM left), padded frames and a handler
    without a place: nothing is read into place, the bytes come out the same."""
    payload = _payload(600_000, 3)

    async def scenario(frames: list[bytes], lends: bool) -> None:
        connection, handlers = _connection({1: len(payload)}, lends)
        _drive(connection, _start() + _open(1) + b"".join(frames), [256 * 1024])
        assert bytes(handlers[1].data) == payload
        assert handlers[1].placed == 0
        assert handlers[1].ends == 1
        connection.connection_lost(None)

    asyncio.run(scenario(_frames(1, payload, 16384), True))
    padded = [_data(1, payload[:300_000], pad=200), _data(1, payload[300_000:], h2.END_STREAM)]
    padded[1] = _data(1, payload[300_000:], h2.END_STREAM, pad=0)
    asyncio.run(scenario(padded, True))
    asyncio.run(scenario(_frames(1, payload, _FRAME), False))
    assert PLACE_FROM > 16384


def test_two_streams_interleaved_each_get_their_own_bytes() -> None:
    """Large frames of two streams in turn, with PINGs and a small frame between: each stream's
    payload goes into its own place, in order."""
    one, three = _payload(3 * _FRAME, 4), _payload(2 * _FRAME + 5, 5)

    async def scenario(reads: list[int]) -> None:
        connection, handlers = _connection({1: len(one), 3: len(three)})
        ping = h2.frame(h2.PING, 0, 0, b"p" * 8)
        frames_one, frames_three = _frames(1, one, _FRAME), _frames(3, three, _FRAME)
        wire = _start() + _open(1) + _open(3)
        for first, second in itertools.zip_longest(frames_one, frames_three, fillvalue=b""):
            wire += first + ping + second
        _drive(connection, wire, reads)
        assert bytes(handlers[1].data) == one and bytes(handlers[3].data) == three
        assert handlers[1].ends == handlers[3].ends == 1
        assert handlers[1].placed and handlers[3].placed
        await asyncio.sleep(0)  # the end-of-iteration flush
        written = bytes(connection._sender.transport.written)  # type: ignore[union-attr]
        assert written.count(h2.frame(h2.PING, h2.ACK, 0, b"p" * 8)) == 3
        connection.connection_lost(None)

    for reads in ([256 * 1024], [1 << 22], [4, 9, 70_000]):
        asyncio.run(scenario(reads))


def test_a_stream_reset_mid_frame_stops_placing_and_the_rest_is_dropped() -> None:
    """The client resets the stream after part of a large frame (what it sent is still read,
    then RST_STREAM): the handler is told, the rest of the frame is not placed, and the next
    stream is served."""

    async def scenario() -> None:
        payload, other = _payload(2 * _FRAME, 6), _payload(PLACE_FROM * 2, 7)
        connection, handlers = _connection({1: len(payload), 3: len(other)})
        head = _start() + _open(1) + h2.frame_header(h2.DATA, 0, 1, _FRAME)
        _drive(connection, head + payload[: 300 * 1024], [1 << 22])
        assert handlers[1].filled == 300 * 1024
        connection.reset_stream(1, h2.CANCEL)  # as a failed call does: the stream is gone
        # The rest of the frame still arrives: read into the buffer and dropped.
        _drive(connection, payload[300 * 1024 : _FRAME], [1 << 22])
        assert handlers[1].filled == 300 * 1024
        _drive(connection, _open(3) + b"".join(_frames(3, other, _FRAME)), [1 << 22])
        assert bytes(handlers[3].data) == other
        connection.connection_lost(None)

    asyncio.run(scenario())


def test_rst_stream_from_the_client_between_large_frames() -> None:
    async def scenario() -> None:
        payload = _payload(3 * _FRAME, 8)
        connection, handlers = _connection({1: len(payload)})
        frames = _frames(1, payload, _FRAME, end=False)
        wire = _start() + _open(1) + frames[0] + h2.rst_stream(1, h2.CANCEL)
        _drive(connection, wire, [1 << 22])
        assert handlers[1].was_reset
        assert 1 not in connection._streams
        assert handlers[1].placed  # the frame's end had gone into place
        _drive(connection, frames[1], [1 << 22])  # frames in flight: dropped
        assert handlers[1].filled == _FRAME
        connection.connection_lost(None)

    asyncio.run(scenario())


def test_a_connection_lost_mid_frame_resets_the_stream() -> None:
    async def scenario() -> None:
        payload = _payload(2 * _FRAME, 9)
        connection, handlers = _connection({1: len(payload)})
        head = _start() + _open(1) + h2.frame_header(h2.DATA, 0, 1, _FRAME)
        lent = _drive(connection, head + payload[:500_000], [256 * 1024, 1 << 22])
        assert lent[-1] == _FRAME - (256 * 1024 - len(head))  # mid-frame, into place
        assert connection.half_sent()
        connection.connection_lost(None)
        assert handlers[1].was_reset
        assert not connection._streams

    asyncio.run(scenario())
