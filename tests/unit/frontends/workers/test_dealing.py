"""The core deals accepted connections to the workers in turn, and each worker serves those it
gets with the protocol their kind names (``shoal/frontends/workers/dealing.py``)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

import pytest
import uvloop

from shoal.frontends.workers.dealing import (
    GRPC,
    HTTP,
    ConnectionDealer,
    DealtConnections,
    deal_socketpair,
)

pytestmark = pytest.mark.timeout(20)


@pytest.fixture(autouse=True, scope="module")
def _uvloop_started() -> None:
    """libuv opens a pipe for signals once per process, on its first loop: not a leak of a
    test (the package's fixture counts descriptors around each one)."""
    uvloop.run(asyncio.sleep(0))


class _Tagged(asyncio.Protocol):
    """Answers each connection with its worker's and protocol's tag, then closes it."""

    def __init__(self, tag: bytes, served: list[bytes]) -> None:
        self._tag = tag
        self._served = served

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._served.append(self._tag)
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        writer = cast(asyncio.Transport, transport)
        writer.write(self._tag)
        writer.close()


def _factory(tag: bytes, served: list[bytes]) -> Callable[[], asyncio.Protocol]:
    return lambda: _Tagged(tag, served)


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


async def _answer(port: int) -> bytes:
    """What a new connection to ``port`` is answered (b"": closed unanswered)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def _workers(count: int, served: list[bytes]) -> tuple[list[socket.socket], list[DealtConnections]]:
    """``count`` workers' dealing sockets (the core's ends) and their receiving ends."""
    outlets, workers = [], []
    for index in range(count):
        core_end, worker_end = deal_socketpair()
        factories = {
            HTTP: _factory(b"h%d" % index, served),
            GRPC: _factory(b"g%d" % index, served),
        }
        outlets.append(core_end)
        workers.append(DealtConnections(worker_end, factories))
    return outlets, workers


def test_connections_are_dealt_in_turn_across_protocols() -> None:
    async def run() -> None:
        served: list[bytes] = []
        outlets, workers = _workers(3, served)
        http, grpc = _listener(), _listener()
        ports = http.getsockname()[1], grpc.getsockname()[1]
        dealer = ConnectionDealer({HTTP: http, GRPC: grpc}, lambda: outlets)
        for worker in workers:
            worker.start()
        dealer.start()
        try:
            answers = [await _answer(ports[i % 2]) for i in range(6)]
        finally:
            dealer.stop()
            for worker in workers:
                worker.stop()
            for outlet in outlets:
                outlet.close()
        assert answers == [b"h0", b"g1", b"h2", b"g0", b"h1", b"g2"]
        assert dealer.dropped == 0

    uvloop.run(run())


def test_a_worker_that_does_not_serve_is_passed_over() -> None:
    """Starting or gone (None), or its socket closed by its death: the next worker gets it."""

    async def run() -> None:
        served: list[bytes] = []
        outlets, workers = _workers(3, served)
        workers[2].stop()  # died: its end is closed
        offered: list[socket.socket | None] = [outlets[0], None, outlets[2]]
        http = _listener()
        port = http.getsockname()[1]
        dealer = ConnectionDealer({HTTP: http}, lambda: offered)
        workers[0].start()
        dealer.start()
        try:
            answers = [await _answer(port) for _ in range(3)]
        finally:
            dealer.stop()
            workers[0].stop()
            workers[1].stop()
            for outlet in outlets:
                outlet.close()
        assert answers == [b"h0", b"h0", b"h0"]

    uvloop.run(run())


def test_with_no_worker_to_take_it_a_connection_is_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each is closed and counted; the log says so at the 1st, 2nd, 4th, 8th... only."""

    async def run() -> None:
        http = _listener()
        port = http.getsockname()[1]
        dealer = ConnectionDealer({HTTP: http}, lambda: [None, None])
        dealer.start()
        try:
            for _ in range(5):
                assert await _answer(port) == b""
        finally:
            dealer.stop()
        assert dealer.dropped == 5

    with caplog.at_level(logging.WARNING, logger="shoal"):
        uvloop.run(run())
    said = [r.getMessage() for r in caplog.records if "no frontend worker" in r.getMessage()]
    assert [line.rsplit("(", 1)[1] for line in said] == [
        "1 closed so far)",
        "2 closed so far)",
        "4 closed so far)",
    ]


def test_a_stopped_dealer_refuses_new_connections() -> None:
    async def run() -> None:
        http = _listener()
        port = http.getsockname()[1]
        dealer = ConnectionDealer({HTTP: http}, lambda: [])
        dealer.start()
        dealer.stop()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)

    uvloop.run(run())


def test_a_worker_stops_taking_connections_when_the_core_closes_its_end() -> None:
    async def run() -> None:
        served: list[bytes] = []
        outlets, workers = _workers(1, served)
        http = _listener()
        port = http.getsockname()[1]
        dealer = ConnectionDealer({HTTP: http}, lambda: outlets)
        workers[0].start()
        dealer.start()
        try:
            assert await _answer(port) == b"h0"
            outlets[0].close()  # the core is gone
            for _ in range(100):
                if workers[0]._loop is None:
                    break
                await asyncio.sleep(0.01)  # the worker's loop reads the end of its socket
            assert workers[0]._loop is None
        finally:
            dealer.stop()
            workers[0].stop()

    uvloop.run(run())


def test_a_connection_of_a_kind_the_worker_does_not_serve_is_closed() -> None:
    async def run() -> None:
        served: list[bytes] = []
        core_end, worker_end = deal_socketpair()
        worker = DealtConnections(worker_end, {HTTP: _factory(b"h0", served)})
        grpc = _listener()
        port = grpc.getsockname()[1]
        dealer = ConnectionDealer({GRPC: grpc}, lambda: [core_end])
        worker.start()
        dealer.start()
        try:
            assert await _answer(port) == b""
        finally:
            dealer.stop()
            worker.stop()
            core_end.close()
        assert served == []

    uvloop.run(run())
