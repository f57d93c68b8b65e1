"""The sender's DATA: frames of the peer's frame size, each a header and a view of the payload,
END_STREAM on the last only, within the windows; its calls back once the writes drained; and
a large flush written to the socket directly, the rest left to the transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.answers import answer_frames
from shoal.frontends.h2.sending import Sender, write_direct
from shoal.frontends.h2.streams import Stream

pytestmark = pytest.mark.timeout(30)


class _Transport:
    """What the sender writes, piece by piece; ``buffered``: what it says it still holds."""

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []
        self.buffered = 0
        self.limits: list[tuple[int, int]] = []

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        self.pieces += pieces

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        self.limits.append((high, low))


def _frames(pieces: list[bytes | memoryview]) -> list[tuple[int, int, bytes]]:
    """(flags, stream, payload) of each DATA frame in the written bytes."""
    wire = b"".join(pieces)
    out, offset = [], 0
    while offset < len(wire):
        high, low, kind, flags, stream_id = h2.FRAME_HEADER.unpack_from(wire, offset)
        length = high << 8 | low
        assert kind == h2.DATA
        out.append((flags, stream_id, wire[offset + 9 : offset + 9 + length]))
        offset += 9 + length
    return out


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop the sender may schedule on; never run: the tests flush by hand."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _sender(
    loop: asyncio.AbstractEventLoop, window: int = 1 << 30
) -> tuple[Sender, _Transport, Stream, list[Any]]:
    ended: list[Any] = []
    stream = Stream(None, window)
    sender = Sender(loop, {1: stream}, lambda stream_id, _: ended.append(stream_id))
    sender.window = window
    transport = _Transport()
    sender.transport = transport  # type: ignore[assignment]
    return sender, transport, stream, ended


@pytest.mark.parametrize("size", [0, 1, 16_384, 16_385, 3 * 16_384, 1 << 20, (1 << 20) + 7])
def test_data_is_cut_into_frames_of_the_peer_frame_size(
    loop: asyncio.AbstractEventLoop, size: int
) -> None:
    sender, transport, stream, ended = _sender(loop)
    sender.max_frame = 16_384
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    sender.flush_scheduled = True  # as during data_received: flushed by hand
    sender.send_data(1, stream, memoryview(payload), end_stream=True)
    sender.flush()
    frames = _frames(transport.pieces)
    assert b"".join(payload for _, _, payload in frames) == payload
    assert all(len(p) == 16_384 for _, _, p in frames[:-1])
    assert 0 < len(frames[-1][2]) <= 16_384 or size == 0
    assert [flags for flags, _, _ in frames] == [0] * (len(frames) - 1) + [h2.END_STREAM]
    assert ended == [1]
    # no copy: the payload's pieces are views of it
    assert all(isinstance(p, memoryview) for p in transport.pieces if len(p) > 9)


def test_what_exceeds_the_window_waits_then_follows(loop: asyncio.AbstractEventLoop) -> None:
    sender, transport, stream, ended = _sender(loop, window=40_000)
    sender.max_frame = 16_384
    payload = bytes(100_000)
    sender.flush_scheduled = True
    sender.send_data(1, stream, memoryview(payload), end_stream=True)
    sender.flush()
    assert sum(len(p) for _, _, p in _frames(transport.pieces)) == 40_000
    assert ended == [] and stream.pending
    stream.send_window = sender.window = 1 << 20  # WINDOW_UPDATE
    sender.flush_scheduled = True
    sender.resume(1, stream)
    sender.flush()
    assert b"".join(p for _, _, p in _frames(transport.pieces)) == payload
    assert ended == [1]


def test_after_sent_waits_for_the_transport_to_drain(loop: asyncio.AbstractEventLoop) -> None:
    sender, transport, stream, _ = _sender(loop)
    called: list[str] = []
    sender.flush_scheduled = True
    sender.send_data(1, stream, memoryview(bytes(100)), end_stream=False)
    sender.after_sent(lambda: called.append("sent"))
    transport.buffered = 100  # the kernel has not taken it all
    sender.flush()
    assert called == [] and transport.limits == [(0, 0)]  # paused until empty
    transport.buffered = 0
    sender.resume_writing()
    assert called == ["sent"]
    sender.after_sent(lambda: called.append("at once"))
    sender.flush()
    assert called == ["sent", "at once"]


def test_a_lost_connection_calls_back_at_once(loop: asyncio.AbstractEventLoop) -> None:
    sender, transport, _, _ = _sender(loop)
    called: list[int] = []
    sender.flush_scheduled = True
    sender.after_sent(lambda: called.append(1))
    transport.buffered = 10
    sender.flush()
    sender.after_sent(lambda: called.append(2))
    assert called == []
    sender.connection_lost()
    assert called == [1, 2]
    sender.after_sent(lambda: called.append(3))  # after the loss: nothing to wait for
    assert called == [1, 2, 3]


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


def _drain(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def test_write_direct_returns_what_the_socket_did_not_take() -> None:
    """More than the socket takes, in more pieces than one writev takes: what was written and
    what is returned (its first piece cut where the write stopped) make the whole, in order."""
    pieces: list[bytes | memoryview] = []
    for index in range(3000):
        pieces.append(h2.frame_header(h2.DATA, 0, 1, 300))
        pieces.append(memoryview(bytes((index % 251,)) * 300))
    whole = b"".join(pieces)
    ours, theirs = _pair()
    with ours, theirs:
        rest = write_direct(ours.fileno(), pieces)
        written = _drain(theirs)
        assert written and rest
        assert written + b"".join(rest) == whole
        assert written == whole[: len(written)]
    small = [b"a" * 10] * 2000  # all taken: two writevs
    ours, theirs = _pair()
    with ours, theirs:
        assert write_direct(ours.fileno(), list(small)) == []
        assert _drain(theirs) == b"a" * 20_000


def test_write_direct_leaves_a_broken_socket_to_the_transport() -> None:
    ours, theirs = _pair()
    theirs.close()
    with ours:
        pieces: list[bytes | memoryview] = [b"x" * 100] * 40
        assert write_direct(ours.fileno(), pieces) == pieces


def test_a_large_flush_goes_to_the_socket_the_rest_to_the_transport(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """With a socket: the flush of a large answer is written to it directly as far as it takes
    it, the rest handed to the transport; nothing when the transport already holds some."""
    ours, theirs = _pair()

    class _Socketed(_Transport):
        def get_extra_info(self, name: str) -> Any:
            return ours if name == "socket" else None

    with ours, theirs:
        sender, _, stream, _ = _sender(loop)
        transport = _Socketed()
        sender.attach(transport)  # type: ignore[arg-type]
        payload = bytes(range(256)) * 40_000  # ~10 MiB: more than the socket takes
        sender.flush_scheduled = True
        sender.send_data(1, stream, memoryview(payload), end_stream=True)
        sender.flush()
        written = _drain(theirs)
        assert written and transport.pieces
        frames = _frames([written, *transport.pieces])
        assert b"".join(p for _, _, p in frames) == payload
        transport.buffered = 1  # the transport holds some: all goes its way, in order
        sender.flush_scheduled = True
        sender.send_data(1, Stream(None, 1 << 30), memoryview(payload[: 1 << 20]), False)
        sender.flush()
        assert _drain(theirs) == b""


def _all_frames(wire: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``wire``."""
    out, offset = [], 0
    while offset < len(wire):
        high, low, kind, flags, stream_id = h2.FRAME_HEADER.unpack_from(wire, offset)
        length = high << 8 | low
        out.append((kind, flags, stream_id, wire[offset + 9 : offset + 9 + length]))
        offset += 9 + length
    return out


def test_a_whole_answer_is_one_piece_of_three_frames(loop: asyncio.AbstractEventLoop) -> None:
    sender, transport, stream, ended = _sender(loop, window=1000)
    stream_window = stream.send_window
    assert sender.answer(1, b"HEAD", b"message", b"TRAILERS")
    sender.flush()
    assert len(transport.pieces) == 1
    assert _all_frames(bytes(transport.pieces[0])) == [
        (h2.HEADERS, h2.END_HEADERS, 1, b"HEAD"),
        (h2.DATA, 0, 1, b"\x00\x00\x00\x00\x07message"),
        (h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, b"TRAILERS"),
    ]
    assert ended == [1]
    assert (sender.window, stream.send_window) == (1000 - 12, stream_window - 12)
    assert sender.sent == 3


@pytest.mark.parametrize("held", ["connection window", "stream window", "frame size", "queued"])
def test_an_answer_that_cannot_go_whole_at_once_is_left_to_the_frames(
    loop: asyncio.AbstractEventLoop, held: str
) -> None:
    sender, transport, stream, ended = _sender(loop)
    body = bytes(100)
    if held == "connection window":
        sender.window = 104
    elif held == "stream window":
        stream.send_window = 104
    elif held == "frame size":
        sender.max_frame, body = 16_384, bytes(16_380)
    else:
        stream.queue().append((h2.DATA, memoryview(b"x"), False))
    window, stream_window = sender.window, stream.send_window
    assert not sender.answer(1, b"HEAD", body, b"TRAILERS")
    sender.flush()
    assert transport.pieces == [] and ended == []
    assert (sender.window, stream.send_window) == (window, stream_window)


def test_an_answer_waits_for_a_table_size_update_due(loop: asyncio.AbstractEventLoop) -> None:
    sender, _, _, ended = _sender(loop)
    sender.table_size_update = True  # the next header block must begin with it: frame by frame
    assert not sender.answer(1, b"HEAD", b"m", b"TRAILERS")
    assert sender.table_size_update and ended == []


def test_an_answer_to_a_stream_gone_writes_nothing(loop: asyncio.AbstractEventLoop) -> None:
    sender, transport, _, ended = _sender(loop)
    assert sender.answer(3, b"HEAD", b"m", b"TRAILERS")
    sender.flush()
    assert transport.pieces == [] and ended == []


@pytest.mark.parametrize(
    ("head", "body", "trailers"),
    [
        (b"HEAD", b"message", b"TRAILERS"),
        (b"", b"", b""),
        (b"H" * 300, bytes(70_000), b"T" * 256),
        (b"HEAD", b"m", b"TRAILERS"),  # the first lengths again, after others
    ],
)
def test_answer_frames_are_the_three_frames_written_apart(
    head: bytes, body: bytes, trailers: bytes
) -> None:
    prefix = b"\x00" + len(body).to_bytes(4, "big")
    for stream_id in (1, 2**31 - 1):
        expected = (
            h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, head)
            + h2.frame(h2.DATA, 0, stream_id, prefix + body)
            + h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, stream_id, trailers)
        )
        assert answer_frames(stream_id, head, body, trailers) == expected
        assert answer_frames(stream_id, head, bytearray(body), trailers) == expected


def test_answer_frames_past_the_kept_lengths_are_the_same_frames() -> None:
    """More message lengths than packs are kept for: the others are packed in two parts."""
    for size in range(100):
        body = bytes(range(size % 256)) * (size // 256 + 1)
        expected = (
            h2.frame(h2.HEADERS, h2.END_HEADERS, 5, b"HEAD")
            + h2.frame(h2.DATA, 0, 5, b"\x00" + len(body).to_bytes(4, "big") + body)
            + h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 5, b"TRAILERS")
        )
        assert answer_frames(5, b"HEAD", body, b"TRAILERS") == expected


def _answering(
    loop: asyncio.AbstractEventLoop, stream_ids: tuple[int, ...]
) -> tuple[Sender, _Transport, list[int]]:
    """A sender whose streams leave its table as they end (as the connection's do)."""
    streams = {stream_id: Stream(None, 1 << 20) for stream_id in stream_ids}
    writes: list[int] = []

    def end_local(stream_id: int, _: Stream) -> None:
        streams.pop(stream_id)

    sender = Sender(loop, streams, end_local)
    transport = _Transport()
    writelines = transport.writelines

    def counted(pieces: list[bytes | memoryview]) -> None:
        writes.append(len(pieces))
        writelines(pieces)

    transport.writelines = counted  # type: ignore[method-assign]
    sender.transport = transport  # type: ignore[assignment]
    return sender, transport, writes


def test_an_answer_outside_a_read_on_the_last_open_stream_leaves_at_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Nothing else can join the connection's write: no loop handle to flush it."""
    sender, transport, writes = _answering(loop, (1,))
    assert sender.answer(1, b"HEAD", b"message", b"TRAILERS")
    assert writes == [1] and not sender.flush_scheduled
    assert answer_frames(1, b"HEAD", b"message", b"TRAILERS") == bytes(transport.pieces[0])


def test_answers_outside_a_read_with_other_streams_open_leave_together(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Another stream may answer in the same loop iteration: one write at its end."""
    sender, _, writes = _answering(loop, (1, 3))
    assert sender.answer(1, b"HEAD", b"one", b"TRAILERS")
    assert writes == [] and sender.flush_scheduled
    assert sender.answer(3, b"HEAD", b"three", b"TRAILERS")  # the last: still with the first
    assert writes == []
    loop.run_until_complete(asyncio.sleep(0))
    assert writes == [2] and not sender.flush_scheduled


def test_an_answer_inside_a_read_leaves_with_the_read(loop: asyncio.AbstractEventLoop) -> None:
    """Within a read (the connection flushes at its end) nothing is written before that."""
    sender, _, writes = _answering(loop, (1,))
    sender.flush_scheduled = True  # as Http2Connection._received sets it
    assert sender.answer(1, b"HEAD", b"message", b"TRAILERS")
    assert writes == [] and sender.flush_scheduled
    sender.flush()
    assert writes == [1]
