"""A raw keep-alive HTTP/1.1 connection that re-sends one pre-built request.

Only what a load generator needs: write the bytes, wait for a complete ``Content-Length`` response,
report its status. The body is kept only when the status says the request failed.
"""

from __future__ import annotations

import asyncio
from typing import cast

from shoal.perf.errors import RequestFailed


class HttpConnection(asyncio.Protocol):
    """One TCP connection; ``exchange`` sends a request and waits for its whole response."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[int] | None = None
        self._status = 0
        self._remaining = -1  # body bytes still to come; -1 while the headers are incomplete
        self._keep_body = False
        self._body = bytearray()
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(cls, host, port)
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(RequestFailed(f"connection closed by the server ({exc})"))

    def data_received(self, data: bytes) -> None:
        if self._remaining < 0:
            self._buffer += data
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self._parse_head(bytes(self._buffer[:end]))
            data = bytes(self._buffer[end + 4 :])
            self._buffer.clear()
        if self._keep_body:
            self._body += data
        self._remaining -= len(data)
        if self._remaining <= 0:
            self._complete()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self._status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        length = -1
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value.strip())
        if length < 0:
            self._fail(RequestFailed("response without Content-Length"))
            return
        self._remaining = length
        self._keep_body = self._status != 200

    def _complete(self) -> None:
        waiter, status, body = self._waiter, self._status, bytes(self._body)
        self._remaining, self._waiter = -1, None
        self._body.clear()
        if waiter is None or waiter.done():
            return
        if status == 200:
            waiter.set_result(status)
        else:
            waiter.set_exception(
                RequestFailed(f"HTTP {status}: {body[:200].decode(errors='replace')}")
            )

    def _fail(self, error: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.close()

    async def exchange(self, request: bytes) -> int:
        """Send ``request`` and return the status of its response; raise ``RequestFailed``."""
        if self.closed or self._transport is None:
            raise RequestFailed("connection is closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.closed = True
