"""Scatter reads: a connection on a real socket (loopback TCP) driven as a transport drives it,
the client's bytes sent into the socket as far as it takes them before each read. Runs of one
stream's 16 KiB frames go into its place by the connection's own ``readv``, their headers
checked afterwards; whatever the cuts and whatever follows a run (the message's last frame,
another stream's frames, padding, PINGs, RST_STREAM), each stream gets its payload byte-exact
and in order, END_STREAM once, every byte counted on the windows."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import Headers, Http2Connection
from shoal.frontends.h2.scatter import SCATTER_FRAMES
from tests.unit.frontends.h2.test_placing import _data, _frames, _open, _payload, _Place, _start
from tests.unit.frontends.h2.test_placing import _Transport as _Written

pytestmark = pytest.mark.timeout(60)

_FRAME = 16384  # what nghttp2 (h2load) sends


class _Transport(_Written):
    """A transport whose socket is the server's end of a socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def get_extra_info(self, name: str) -> Any:
        return self._sock if name == "socket" else None


class _Wire:
    """The client's end: sends what is left of the wire as far as the socket takes it."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self._client = client
        self._server = server
        self._left = memoryview(b"")

    def send(self, wire: bytes) -> None:
        self._left = memoryview(bytes(self._left) + wire)
        self.top_up()

    def top_up(self) -> None:
        while self._left:
            try:
                sent = self._client.send(self._left[:65536])
            except BlockingIOError:
                return
            self._left = self._left[sent:]

    def drive(self, connection: Http2Connection, reads: list[int]) -> None:
        """Read as the transport does, at most the next of ``reads`` bytes a read (cycled),
        until all that was sent is read."""
        for most in itertools.cycle(reads):
            self.top_up()
            buffer = connection.get_buffer(-1)
            try:
                size = self._server.recv_into(buffer, min(most, len(buffer)))
            except BlockingIOError:
                if not self._left:
                    return
                continue
            connection.buffer_updated(size)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """The two ends of a loopback TCP connection (its buffers hold a run, a socketpair's not)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    return server, client


@contextmanager
def _connection(
    sizes: dict[int, int], make: type[_Place] = _Place
) -> Iterator[tuple[Http2Connection, dict[int, _Place], _Wire]]:
    handlers: dict[int, _Place] = {}

    def open_stream(
        connection: Http2Connection, stream_id: int, headers: Headers, end: bool
    ) -> _Place:
        handlers[stream_id] = make(sizes[stream_id], True)
        return handlers[stream_id]

    server, client = _tcp_pair()
    server.setblocking(False)
    client.setblocking(False)
    try:
        connection = Http2Connection(open_stream, lambda _: None)
        connection.connection_made(_Transport(server))  # type: ignore[arg-type]
        yield connection, handlers, _Wire(client, server)
        connection.connection_lost(None)
    finally:
        server.close()
        client.close()


_READS = ([256 * 1024], [1, 8, 9, 10, 65536], [100_003, 7], [_FRAME + 9], [20_000, 4096])


def test_runs_of_16k_frames_go_into_place_whatever_the_reads() -> None:
    payload = _payload(40 * _FRAME + 777, 11)

    async def scenario(reads: list[int]) -> None:
        with _connection({1: len(payload)}) as (connection, handlers, wire):
            wire.send(_start() + _open(1) + b"".join(_frames(1, payload, _FRAME)))
            wire.drive(connection, reads)
            handler = handlers[1]
            assert bytes(handler.data) == payload
            assert handler.ends == 1
            assert handler.placed + handler.copied == len(payload)
            assert handler.placed >= 10 * _FRAME  # by scatter reads
            assert connection._recv_unacked == connection._streams[1].recv_unacked
            assert connection._recv_unacked == len(payload)
            assert not connection._reader.half_read()

    for reads in _READS:
        asyncio.run(scenario(reads))


def test_what_follows_a_run_takes_the_usual_way() -> None:
    """After runs of a stream's frames come another stream's, a padded one, a small one, a
    PING: the guesses fail there, the bytes read past them are handled as read normally."""
    one, three = _payload(30 * _FRAME + 5, 12), _payload(25 * _FRAME, 13)
    ping = h2.frame(h2.PING, 0, 0, b"p" * 8)

    def wire_of() -> bytes:
        ones, threes = _frames(1, one, _FRAME), _frames(3, three, _FRAME)
        out = _start() + _open(1) + _open(3)
        for group in range(5):
            out += b"".join(ones[6 * group : 6 * group + 6])
            out += b"".join(threes[5 * group : 5 * group + 5])
            out += ping if group % 2 else h2.window_update(0, 1)  # pings: not too many
        out += _data(1, one[30 * _FRAME : 30 * _FRAME + 2], pad=7)
        return out + _data(1, one[30 * _FRAME + 2 :], h2.END_STREAM)

    async def scenario(reads: list[int]) -> None:
        with _connection({1: len(one), 3: len(three)}) as (connection, handlers, wire):
            wire.send(wire_of())
            wire.drive(connection, reads)
            assert bytes(handlers[1].data) == one and bytes(handlers[3].data) == three
            assert handlers[1].ends == handlers[3].ends == 1
            await asyncio.sleep(0)  # the end-of-iteration flush
            written = bytes(connection._sender.transport.written)  # type: ignore[union-attr]
            assert written.count(h2.frame(h2.PING, h2.ACK, 0, b"p" * 8)) == 2
            assert connection._recv_unacked == len(one) + len(three) + 8  # the padding counts

    for reads in _READS:
        asyncio.run(scenario(reads))


def test_a_place_smaller_than_the_run_is_never_passed() -> None:
    """The handler lends a place for the first part only (then none): the rest comes through
    the buffer; a run longer than one readv takes several."""
    payload = _payload(3 * SCATTER_FRAMES * _FRAME, 14)

    class _Short(_Place):
        def receive_buffer(self, nbytes: int) -> memoryview | None:
            if self.filled >= 100_000:
                return None
            return super().receive_buffer(min(nbytes, 100_000 - self.filled))

    async def scenario(cls: type[_Place], reads: list[int]) -> None:
        with _connection({1: len(payload)}, cls) as (connection, handlers, wire):
            wire.send(_start() + _open(1) + b"".join(_frames(1, payload, _FRAME)))
            wire.drive(connection, reads)
            assert bytes(handlers[1].data) == payload
            assert handlers[1].ends == 1

    for reads in _READS:
        asyncio.run(scenario(_Short, reads))
        asyncio.run(scenario(_Place, reads))


def test_a_reset_or_a_lost_connection_mid_run() -> None:
    """RST_STREAM after part of a run: the handler is told, the frames in flight dropped, the
    next stream served; the connection lost mid-run resets the stream."""
    payload, other = _payload(20 * _FRAME, 15), _payload(10 * _FRAME + 3, 16)

    async def scenario(reads: list[int]) -> None:
        with _connection({1: len(payload), 3: len(other)}) as (connection, handlers, wire):
            frames = _frames(1, payload, _FRAME)
            wire.send(_start() + _open(1) + b"".join(frames[:9]) + h2.rst_stream(1, h2.CANCEL))
            wire.send(b"".join(frames[9:12]) + _open(3) + b"".join(_frames(3, other, _FRAME)))
            wire.drive(connection, reads)
            assert handlers[1].was_reset and handlers[1].filled == 9 * _FRAME
            assert bytes(handlers[3].data) == other
        with _connection({1: len(payload)}) as (connection, handlers, wire):
            wire.send(_start() + _open(1) + b"".join(_frames(1, payload, _FRAME)[:13]))
            wire.send(h2.frame_header(h2.DATA, 0, 1, _FRAME) + payload[:100])
            wire.drive(connection, reads)
            assert connection.half_sent()
            connection.connection_lost(None)
            assert handlers[1].was_reset and not connection._streams

    for reads in _READS:
        asyncio.run(scenario(reads))


def test_no_socket_no_scatter() -> None:
    """A transport with no socket (in-process benchmarks, other tests), or whose bytes are not
    the socket's (TLS): the usual reads and writes."""

    class _Tls(_Transport):
        def get_extra_info(self, name: str) -> Any:
            return object() if name == "sslcontext" else super().get_extra_info(name)

    async def made() -> None:
        with _connection({1: 1}) as (connection, _, _wire):
            assert connection._scatter is not None and connection._sender.fd >= 0
        for transport in (_Written(), _Tls(socket.socket())):
            connection = Http2Connection(lambda *_: None, lambda _: None)
            connection.connection_made(transport)  # type: ignore[arg-type]
            assert connection._scatter is None and connection._sender.fd == -1
            if isinstance(transport, _Tls):
                transport._sock.close()

    asyncio.run(made())
