"""Reads around runs of 16 KiB frames (``placing``): when the client is slower than the server
the socket runs dry mid-message, and the next read must not take the connection's buffer (it
would copy the stream's next frames from there); and once a connection has had a large message,
the read that finds the next one's HEADERS is short. Whatever the cuts, each stream gets its
payload byte-exact, END_STREAM once, every byte counted on the windows."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.placing import FIRST_READ
from tests.unit.frontends.h2.test_placing import _data, _frames, _open, _payload, _start
from tests.unit.frontends.h2.test_scatter import _FRAME, _READS, _connection

pytestmark = pytest.mark.timeout(60)

_BUFFER = 256 * 1024  # the connection's read buffer


def _chunks(wire: bytes, cuts: list[int]) -> list[bytes]:
    """``wire`` cut at each of ``cuts`` (offsets), in order."""
    edges = [0, *cuts, len(wire)]
    return [wire[start:end] for start, end in itertools.pairwise(edges)]


def test_a_run_stopped_by_a_dry_socket_goes_on_in_place() -> None:
    """The client sends a 40-frame message in pieces, cut mid-frame, at a frame's end and at a
    header's end; the server reads all there is between pieces. After the first piece, read
    into the buffer, nothing more is copied: each piece goes into place, whatever the cut."""
    payload = _payload(40 * _FRAME + 777, 21)
    head = _start() + _open(1)
    wire = head + b"".join(_frames(1, payload, _FRAME))
    step = _FRAME + h2.FRAME_HEADER_SIZE
    first = len(head) + 5 * step + 100  # mid-frame
    cuts = [first, len(head) + 9 * step, len(head) + 14 * step + 9, len(head) + 20 * step + 77]
    cuts += [len(head) + 27 * step]

    async def scenario(reads: list[int]) -> None:
        with _connection({1: len(payload)}) as (connection, handlers, client):
            for piece in _chunks(wire, cuts):
                client.send(piece)
                client.drive(connection, reads)
            handler = handlers[1]
            assert bytes(handler.data) == payload
            assert handler.ends == 1
            assert handler.copied <= first + _FRAME  # the first piece, and the message's end
            assert connection._recv_unacked == len(payload)
            assert not connection._reader.half_read()

    for reads in ([_BUFFER], [_FRAME + 9], [20_000, 4096]):
        asyncio.run(scenario(reads))


def test_the_next_large_message_is_found_by_a_short_read() -> None:
    """After a large message, the read that finds the next one's HEADERS takes FIRST_READ
    bytes: no more than that of it is copied, the rest goes into place."""
    one, three = _payload(30 * _FRAME + 5, 22), _payload(30 * _FRAME + 9, 23)

    async def scenario() -> None:
        with _connection({1: len(one), 3: len(three)}) as (connection, handlers, client):
            client.send(_start() + _open(1) + b"".join(_frames(1, one, _FRAME)))
            client.drive(connection, [_BUFFER])
            assert connection.get_buffer(-1).nbytes == FIRST_READ
            client.send(_open(3) + b"".join(_frames(3, three, _FRAME)))
            client.drive(connection, [_BUFFER])
            assert bytes(handlers[1].data) == one and bytes(handlers[3].data) == three
            assert handlers[3].copied <= FIRST_READ + _FRAME  # its first read, and its end
            assert handlers[1].ends == handlers[3].ends == 1

    asyncio.run(scenario())


def test_small_calls_after_a_large_one_and_runs_broken_by_other_frames() -> None:
    """Small messages after a large one (read FIRST_READ bytes at a time), and a run whose
    socket ran dry before another stream's frames, a PING and a padded frame: every byte
    arrives, whatever the reads."""
    large, other = _payload(12 * _FRAME + 1, 24), _payload(3 * _FRAME, 25)
    smalls = {stream_id: _payload(100 + stream_id, stream_id) for stream_id in range(5, 205, 2)}
    sizes = {1: len(large), 3: len(other), **{key: len(value) for key, value in smalls.items()}}
    ping = h2.frame(h2.PING, 0, 0, b"p" * 8)
    frames = _frames(1, large, _FRAME)

    async def scenario(reads: list[int]) -> None:
        with _connection(sizes) as (connection, handlers, client):
            client.send(_start() + _open(1) + _open(3) + b"".join(frames[:6]))
            client.drive(connection, reads)
            client.send(ping + b"".join(_frames(3, other, _FRAME)) + _data(1, b"", pad=3))
            client.drive(connection, reads)
            client.send(b"".join(frames[6:]))
            client.drive(connection, reads)
            client.send(
                b"".join(
                    _open(key) + _data(key, value, h2.END_STREAM) for key, value in smalls.items()
                )
            )
            client.drive(connection, reads)
            assert bytes(handlers[1].data) == large and bytes(handlers[3].data) == other
            for key, value in smalls.items():
                assert bytes(handlers[key].data) == value and handlers[key].ends == 1
            await asyncio.sleep(0)  # the end-of-iteration flush
            written = bytes(connection._sender.transport.written)  # type: ignore[union-attr]
            assert written.count(h2.frame(h2.PING, h2.ACK, 0, b"p" * 8)) == 1

    for reads in _READS:
        asyncio.run(scenario(reads))


def test_near_a_message_s_end_the_rest_is_read_at_once() -> None:
    """A 64 KiB message cut mid-frame: with less than PLACE_FROM of its place left, the rest
    is read into the buffer at once (one read), not a frame's rest, a header and a run."""
    payload = _payload(4 * _FRAME, 26)
    wire = _start() + _open(1) + b"".join(_frames(1, payload, _FRAME))
    cut = len(wire) - 2 * _FRAME - 100

    async def scenario() -> None:
        with _connection({1: len(payload)}) as (connection, handlers, client):
            client.send(wire[:cut])
            client.drive(connection, [_BUFFER])
            assert connection._reader.data_due()[1]  # a frame cut
            assert connection.get_buffer(-1).nbytes == _BUFFER
            client.send(wire[cut:])
            client.drive(connection, [_BUFFER])
            assert bytes(handlers[1].data) == payload and handlers[1].ends == 1

    asyncio.run(scenario())
