"""DATA by runs: the frames of one stream that follow each other whole in a read reach its
handler in one call, and what comes out, however the reads cut the bytes, is what a
frame-by-frame reading gives: each stream's payload (padding removed) in order, END_STREAM
once with its last byte, every frame's length (padding included) counted against the windows,
and other frames handled between the runs, in order."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import Headers, Http2Connection
from shoal.frontends.h2.errors import ConnectionError_
from shoal.frontends.h2.floods import FloodGuard, FloodLimits
from shoal.frontends.h2.reading import STREAM_DATA_FROM, FrameReader

pytestmark = pytest.mark.timeout(60)


def _data(stream_id: int, payload: bytes, flags: int = 0, pad: int = -1) -> bytes:
    """A DATA frame; with ``pad`` >= 0, PADDED with that many bytes of padding."""
    if pad >= 0:
        flags |= h2.PADDED
        payload = bytes((pad,)) + payload + bytes(pad)
    return h2.frame_header(h2.DATA, flags, stream_id, len(payload)) + payload


def _ping(marker: bytes) -> bytes:
    return h2.frame(h2.PING, 0, 0, marker.ljust(8, b"."))


class _Recorder:
    """What a reader hands on, in order: ("data", stream, end, payloads, length) per run and
    ("ping", payload) per PING."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        loop = asyncio.new_event_loop()
        loop.close()  # the guard only reads the time
        self.reader = FrameReader(
            {h2.PING: self._ping}, self._data, lambda *_: None, FloodGuard(FloodLimits(), loop)
        )

    def _data(self, stream_id: int, end: bool, pieces: list[memoryview], length: int) -> None:
        self.events.append(("data", stream_id, end, [bytes(p) for p in pieces], length))

    def _ping(self, stream_id: int, flags: int, payload: memoryview) -> None:
        self.events.append(("ping", bytes(payload)))

    def feed(self, wire: bytes, cuts: list[int]) -> None:
        edges = [0, *cuts, len(wire)]
        for start, end in itertools.pairwise(edges):
            self.reader.feed(wire[start:end])

    def streams(self) -> dict[int, tuple[bytes, int, int]]:
        """Per stream: its payload, how often END_STREAM came (and last) and its length."""
        out: dict[int, tuple[bytes, int, int]] = {}
        for event in self.events:
            if event[0] != "data":
                continue
            _, stream_id, end, pieces, length = event
            payload, ends, counted = out.get(stream_id, (b"", 0, 0))
            assert ends == 0, f"data on stream {stream_id} after its END_STREAM"
            out[stream_id] = (payload + b"".join(pieces), ends + end, counted + length)
        return out

    def pings(self) -> list[bytes]:
        return [event[1] for event in self.events if event[0] == "ping"]


def _payloads() -> tuple[list[bytes], list[bytes]]:
    """Stream 1's and 3's payloads; two of them about STREAM_DATA_FROM (1024) bytes, so that a
    cut frame is gathered or handed on in pieces."""
    one = [bytes([1, i]) * (50 + 7 * i) for i in range(5)]
    three = [bytes([3, i]) * 40 for i in range(4)]
    one[1] = b"\x01" * STREAM_DATA_FROM
    three[2] = b"\x03" * (STREAM_DATA_FROM - 1)
    return one, three


def _interleaved() -> tuple[bytes, dict[int, tuple[bytes, int, int]], list[bytes]]:
    """Two streams' frames interleaved, runs of several frames, padded and empty ones, and
    PINGs between; with what a reader must hand on per stream and the PINGs in order."""
    one, three = _payloads()
    wire = [
        _data(1, one[0]),
        _data(1, one[1]),
        _data(1, one[2], pad=5),  # padded: a run of its own
        _data(3, three[0]),
        _data(3, b""),  # empty: ends nothing, a run of its own
        _data(3, three[1]),
        _ping(b"a"),
        _data(3, three[2]),
        _data(1, one[3]),
        _data(1, one[4], h2.END_STREAM),
        _data(3, three[3], pad=0),
        _ping(b"b"),
        _data(3, b"", h2.END_STREAM),
    ]
    lengths = [len(frame) - h2.FRAME_HEADER_SIZE for frame in wire]
    expected = {
        1: (b"".join(one), 1, sum(lengths[i] for i in (0, 1, 2, 8, 9))),
        3: (b"".join(three), 1, sum(lengths[i] for i in (3, 4, 5, 7, 10, 12))),
    }
    return h2.PREFACE + b"".join(wire), expected, [b"a.......", b"b......."]


def test_runs_in_one_read_are_cut_where_a_frame_by_frame_reading_would_differ() -> None:
    """Fed whole, each run is the stream's frames up to a frame of another stream or type,
    a padded or empty one, or END_STREAM; a padded frame comes without its padding."""
    wire, _, _ = _interleaved()
    one, three = _payloads()
    recorder = _Recorder()
    recorder.feed(wire, [])
    runs = [(e[1], e[2], e[3]) if e[0] == "data" else e[0] for e in recorder.events]
    assert (
        runs
        == [
            (1, False, one[:2]),
            (1, False, one[2:3]),  # padded: starts a run, continues none
            (3, False, three[:1]),
            (3, False, [b""]),  # empty: the same
            (3, False, three[1:2]),
            "ping",
            (3, False, three[2:3]),
            (1, True, one[3:5]),  # END_STREAM ends a run
            (3, False, three[3:4]),
            "ping",
            (3, True, [b""]),
        ]
    )


def test_every_cut_of_the_reads_hands_on_the_same_data() -> None:
    """One cut anywhere, then two cuts around each frame boundary: the same payload per
    stream, END_STREAM once, the same lengths counted, the PINGs in order."""
    wire, expected, pings = _interleaved()
    for cut in range(1, len(wire)):
        recorder = _Recorder()
        recorder.feed(wire, [cut])
        assert recorder.streams() == expected, cut
        assert recorder.pings() == pings, cut
        assert not recorder.reader.half_read()
    for first in range(len(h2.PREFACE), len(wire), 7):
        for second in range(first + 1, min(first + 40, len(wire))):
            recorder = _Recorder()
            recorder.feed(wire, [first, second])
            assert recorder.streams() == expected, (first, second)


def test_a_run_of_full_frames_and_a_large_frame_cut_by_the_reads() -> None:
    """A 4 MiB-like message in 16 KiB frames read in 256 KiB reads, then a 100 KiB frame
    (handed on in pieces as it arrives): the bytes come out whole, in order, once."""
    payload = bytes(range(256)) * (16 * 64 * 3)  # 768 KiB
    frames = [payload[at : at + 16384] for at in range(0, len(payload), 16384)]
    big = b"B" * (100 * 1024)
    wire = h2.PREFACE + b"".join(_data(1, frame) for frame in frames)
    wire += _data(1, big, h2.END_STREAM)
    recorder = _Recorder()
    recorder.feed(wire, list(range(256 * 1024, len(wire), 256 * 1024)))
    assert recorder.streams() == {1: (payload + big, 1, len(payload) + len(big))}
    calls = [e for e in recorder.events if e[0] == "data"]
    assert len(calls) < len(frames)  # runs, not a call per frame
    assert max(len(e[3]) for e in calls) == 256 * 1024 // (16384 + 9)


def test_a_padded_frame_with_too_much_padding_is_a_connection_error() -> None:
    frame = h2.frame_header(h2.DATA, h2.PADDED, 1, 3) + bytes((3, 0, 0))
    recorder = _Recorder()
    with pytest.raises(ConnectionError_, match="padding"):
        recorder.feed(h2.PREFACE + _data(1, b"x" * 20) + frame, [])


def test_data_inside_a_header_block_is_a_connection_error() -> None:
    headers = h2.frame_header(h2.HEADERS, 0, 1, 1) + b"\x88"  # no END_HEADERS
    recorder = _Recorder()
    with pytest.raises(ConnectionError_, match="interrupted"):
        recorder.feed(h2.PREFACE + headers + _data(1, b"x" * 20), [])


# --- through the connection: windows and streams ----------------------------------------------


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


class _Collect:
    """A stream handler that keeps what it is given, and may end the stream when told to."""

    def __init__(self, connection: Http2Connection, stream_id: int, stop_after: int) -> None:
        self.connection, self.stream_id, self.stop_after = connection, stream_id, stop_after
        self.data = bytearray()
        self.calls = 0
        self.ended = False

    def data_received(self, pieces: list[memoryview], end_stream: bool) -> None:
        self.calls += 1
        for piece in pieces:
            if self.ended:
                return
            self.data += piece
            if len(self.data) >= self.stop_after:  # answers early, as a failed call does
                self.ended = True
                self.connection.send_headers(self.stream_id, h2.GRPC_RESPONSE_HEADERS, True)
        if end_stream:
            self.ended = True

    def trailers_received(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def mid_message(self) -> bool:
        return False


_HEADERS_BLOCK = b"\x83\x86\x84"  # :method POST, :scheme http, :path / (static entries)


def _connection(stop_after: int = 1 << 30) -> tuple[Http2Connection, dict[int, _Collect]]:
    handlers: dict[int, _Collect] = {}

    def open_stream(
        connection: Http2Connection, stream_id: int, headers: Headers, end: bool
    ) -> _Collect:
        handlers[stream_id] = _Collect(connection, stream_id, stop_after)
        return handlers[stream_id]

    connection = Http2Connection(open_stream, lambda _: None)
    connection.connection_made(_Transport())  # type: ignore[arg-type]
    connection.data_received(h2.PREFACE + h2.settings_frame({}))
    return connection, handlers


def _open(stream_id: int) -> bytes:
    return h2.frame_header(h2.HEADERS, h2.END_HEADERS, stream_id, 3) + _HEADERS_BLOCK


def test_a_run_counts_every_frame_against_the_windows_padding_included() -> None:
    async def scenario() -> None:
        connection, handlers = _connection()
        frames = [_data(1, b"a" * 100), _data(1, b"b" * 100), _data(1, b"c" * 10, pad=20)]
        frames += [_data(1, b"d" * 30)]
        connection.data_received(_open(1) + b"".join(frames))
        counted = sum(len(frame) - h2.FRAME_HEADER_SIZE for frame in frames)
        assert connection._recv_unacked == counted
        assert connection._streams[1].recv_unacked == counted
        assert bytes(handlers[1].data) == b"a" * 100 + b"b" * 100 + b"c" * 10 + b"d" * 30
        assert handlers[1].calls == 2  # two frames; the padded one and the one after it
        connection.connection_lost(None)

    asyncio.run(scenario())


def test_a_stream_ended_inside_a_run_drops_the_rest_and_later_runs() -> None:
    """The handler answers (END_STREAM) after the first frame of a run: the rest of the run
    and the stream's later frames are dropped, still counted on the connection's window; the
    other stream's frames in between come through."""

    async def scenario() -> None:
        connection, handlers = _connection(stop_after=100)
        wire = _open(1) + _open(3)
        wire += _data(1, b"a" * 100) + _data(1, b"b" * 100) + _data(3, b"x" * 50)
        wire += _data(1, b"c" * 100, h2.END_STREAM) + _data(3, b"y" * 10, h2.END_STREAM)
        connection.data_received(wire)
        assert bytes(handlers[1].data) == b"a" * 100
        assert 1 not in connection._streams  # answered: over for the server
        assert bytes(handlers[3].data) == b"x" * 50 + b"y" * 10
        assert connection._recv_unacked == 360
        await asyncio.sleep(0)  # the end-of-iteration flush
        written = bytes(connection._sender.transport.written)  # type: ignore[union-attr]
        assert h2.rst_stream(1, h2.NO_ERROR) in written  # the client is told to stop
        connection.connection_lost(None)

    asyncio.run(scenario())
