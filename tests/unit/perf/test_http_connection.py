"""The raw HTTP/1.1 client's response parsing, fed in pieces through a fake transport."""

import asyncio
import re

import pytest

from shoal.perf._http import HttpConnection
from shoal.perf.errors import RequestFailed

pytestmark = pytest.mark.timeout(10)


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def _connected() -> tuple[HttpConnection, FakeTransport]:
    connection, transport = HttpConnection(), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _feed(connection: HttpConnection, data: bytes, piece: int) -> None:
    for start in range(0, len(data), piece):
        connection.data_received(data[start : start + piece])


@pytest.mark.parametrize("piece", [1, 7, 10_000])
def test_a_response_in_any_number_of_pieces(piece):
    async def scenario():
        connection, transport = _connected()
        body = b"x" * 5000
        response = b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n" + body
        for _ in range(3):  # keep-alive: the same connection, again and again
            exchange = asyncio.ensure_future(connection.exchange(b"REQUEST"))
            await asyncio.sleep(0)  # let the request be written
            _feed(connection, response, piece)
            assert await exchange == 200
        assert transport.written == [b"REQUEST"] * 3

    asyncio.run(scenario())


def test_an_error_status_fails_the_request_with_its_body():
    async def scenario():
        connection, _ = _connected()
        exchange = asyncio.ensure_future(connection.exchange(b"REQUEST"))
        await asyncio.sleep(0)
        connection.data_received(
            b'HTTP/1.1 400 Bad Request\r\nContent-Length: 15\r\n\r\n{"error":"bad"}'
        )
        with pytest.raises(RequestFailed, match=re.escape('HTTP 400: {"error":"bad"}')):
            await exchange

    asyncio.run(scenario())


def test_a_closed_connection_fails_the_request_in_flight():
    async def scenario():
        connection, _ = _connected()
        exchange = asyncio.ensure_future(connection.exchange(b"REQUEST"))
        await asyncio.sleep(0)
        connection.connection_lost(None)
        with pytest.raises(RequestFailed, match="closed"):
            await exchange
        with pytest.raises(RequestFailed):
            await connection.exchange(b"REQUEST")

    asyncio.run(scenario())


def test_a_response_without_content_length_is_an_error():
    async def scenario():
        connection, transport = _connected()
        exchange = asyncio.ensure_future(connection.exchange(b"REQUEST"))
        await asyncio.sleep(0)
        connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        with pytest.raises(RequestFailed, match="Content-Length"):
            await exchange
        assert transport.closed

    asyncio.run(scenario())
