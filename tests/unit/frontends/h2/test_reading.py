"""The frame reader: frames cut anywhere by the reads come out whole, each once, in order."""

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
    loop = asyncio.new_event_loop()
    loop.close()  # the guard only reads the time; no frame here is a flood
    guard = FloodGuard(FloodLimits(), loop)

    def on_data(stream_id: int, flags: int, payload: memoryview) -> None:
        frames.append((stream_id, flags, bytes(payload)))

    return FrameReader({h2.DATA: on_data}, lambda *_: None, guard)


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
    return wire, expected


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


def test_a_partial_frame_keeps_only_that_frame() -> None:
    """Bytes after a partial frame's end are not buffered with it: the whole frames of the
    next read are handled from the read itself."""
    wire, expected = _stream()
    frames: list[tuple[int, int, bytes]] = []
    reader = _reader(frames)
    first_end = len(h2.PREFACE) + 9 + 200
    reader.feed(wire[: first_end - 50])
    assert frames == []
    reader.feed(wire[first_end - 50 :])
    assert frames == expected


def test_an_oversized_frame_is_refused_once_its_header_is_complete() -> None:
    header = h2.frame_header(h2.DATA, 0, 1, RECEIVE_MAX_FRAME + 1)
    reader = _reader([])
    reader.feed(h2.PREFACE + header[:4])
    with pytest.raises(ConnectionError_, match="a frame of"):
        reader.feed(header[4:])
