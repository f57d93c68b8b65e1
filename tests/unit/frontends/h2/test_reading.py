"""The frame reader: frames cut anywhere by the reads come out whole, each once, in order; a
large DATA frame cut by a read comes out in pieces, as its bytes arrive, END_STREAM on the
last."""

from __future__ import annotations

import asyncio

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.errors import ConnectionError_
from shoal.frontends.h2.floods import FloodGuard, FloodLimits
from shoal.frontends.h2.reading import RECEIVE_MAX_FRAME, FrameReader

pytestmark = pytest.mark.timeout(30)


def _data_frame(stream_id: int, payload: bytes, flags: int = 0) -> bytes:
    return h2.frame_header(h2.DATA, flags, stream_id, len(payload)) + payload


def _reader(frames: list[tuple[int, int, bytes]]) -> FrameReader:
    """A reader whose DATA (runs of frames, and pieces of frames) is put back together into
    ``frames``: what continues the last entry's stream before its END_STREAM is appended to
    it. (The frames of _stream() are such that this cannot join two frames: no two of one
    stream in a row without END_STREAM between them, but stream 5's, which a run joins.)"""
    loop = asyncio.new_event_loop()
    loop.close()  # the guard only reads the time; no frame here is a flood
    guard = FloodGuard(FloodLimits(), loop)
    open_frame: list[bool] = [False]  # whether the last entry may go on (no END_STREAM yet)

    def on_data(stream_id: int, end: bool, pieces: list[memoryview], length: int) -> None:
        assert length == sum(len(piece) for piece in pieces)  # no padding here
        flags = h2.END_STREAM if end else 0
        payload = b"".join(pieces)
        if open_frame[0] and frames and frames[-1][0] == stream_id and frames[-1][1] == 0:
            last = frames.pop()
            frames.append((stream_id, flags, last[2] + payload))
        else:
            frames.append((stream_id, flags, payload))
        open_frame[0] = reader.half_read() or not end

    reader = FrameReader({}, on_data, lambda *_: None, guard)
    return reader


def _stream() -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """The preface and DATA frames of several sizes (one empty, one of 100 KiB)."""
    expected = [
        (1, 0, bytes(range(200))),
        (3, 0, b""),
        (1, h2.END_STREAM, bytes(100 * 1024)),
        (5, 0, b"x" * 16384),
        (5, h2.END_STREAM, b"tail"),
    ]
    wire = h2.PREFACE + b"".join(_data_frame(s, p, f) for s, f, p in expected)
    return wire, [*expected[:3], (5, h2.END_STREAM, b"x" * 16384 + b"tail")]


@pytest.mark.parametrize("piece", [1, 5, 9, 10, 4096, 16393, 65536, 1 << 30])
def test_frames_come_out_whole_whatever_the_read_size(piece: int) -> None:
    wire, expected = _stream()
    frames: list[tuple[int, int, bytes]] = []
    reader = _reader(frames)
    for at in range(0, len(wire), piece):
        reader.feed(wire[at : at + piece])
    assert frames == expected
    assert not reader.half_read()


def test_a_cut_at_every_position_of_a_frame_header() -> None:
    wire, expected = _stream()
    start = len(h2.PREFACE) + 9 + 200  # the second frame's header (an empty frame: 9 bytes)
    for cut in range(start, start + 10):
        frames: list[tuple[int, int, bytes]] = []
        reader = _reader(frames)
        reader.feed(wire[:cut])
        assert reader.half_read() == (start < cut < start + 9)
        reader.feed(wire[cut:])
        assert frames == expected, cut


def test_a_cut_data_frame_comes_out_as_it_arrives() -> None:
    """The part of a DATA frame that came is handed on at once (no END_STREAM on it), the rest
    with the next read, and the frames after it from that read itself."""
    wire, expected = _stream()
    pieces: list[tuple[int, int, bytes]] = []
    loop = asyncio.new_event_loop()
    loop.close()

    def on_data(stream_id: int, end: bool, run: list[memoryview], length: int) -> None:
        pieces.append((stream_id, h2.END_STREAM if end else 0, b"".join(run)))

    reader = FrameReader({}, on_data, lambda *_: None, FloodGuard(FloodLimits(), loop))
    third = len(h2.PREFACE) + 9 + 200 + 9 + 9  # the payload of the 100 KiB frame
    reader.feed(wire[: third + 1000])
    assert pieces[-1] == (1, 0, bytes(1000)) and reader.half_read()
    reader.feed(wire[third + 1000 :])
    assert pieces[3] == (1, h2.END_STREAM, bytes(100 * 1024 - 1000))
    assert pieces[4:] == expected[3:]
    assert not reader.half_read()


def test_an_oversized_frame_is_refused_once_its_header_is_complete() -> None:
    header = h2.frame_header(h2.DATA, 0, 1, RECEIVE_MAX_FRAME + 1)
    reader = _reader([])
    reader.feed(h2.PREFACE + header[:4])
    with pytest.raises(ConnectionError_, match="a frame of"):
        reader.feed(header[4:])
