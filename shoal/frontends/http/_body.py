"""Read an ASGI request body under a size limit, copying it once.

The limit is checked against ``Content-Length`` before a byte is read, and again while a chunked
body streams in, so an oversized request never sits in memory. A body that arrives in one piece is
returned as is; one that arrives in pieces is appended to one buffer as its bytes come. Memory is
taken only for bytes that arrived, never for what ``Content-Length`` claims: a client announcing
64 MiB and sending 100 bytes costs 100 bytes (docs/hardening.md, "Bodies").
"""

from __future__ import annotations

from starlette.types import Message, Receive

from shoal.core import InvalidArgument
from shoal.frontends._limits import too_large


class ClientDisconnected(Exception):
    """The client closed the connection before its request body arrived."""


async def read_body(
    receive: Receive, content_length: str | None, limit: int, *, what: str = "Request"
) -> bytes | bytearray:
    """The whole body; ``what`` names it in the size error ("Request JSON" for JSON-only)."""
    expected = _content_length(content_length)
    if expected is not None and expected > limit:
        raise too_large(limit, expected, what=what)
    first, more = _body_chunk(await receive())
    if not more:
        if len(first) > limit:
            raise too_large(limit, len(first), what=what)
        return first
    if expected is not None:
        return await _read_announced(receive, first, expected)
    return await _read_chunked(receive, first, limit, what)


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        length = -1
    if length < 0:
        raise InvalidArgument(f"Unable to parse Content-Length, got: {value}")
    return length


def _body_chunk(message: Message) -> tuple[bytes, bool]:
    if message["type"] == "http.disconnect":
        raise ClientDisconnected
    return message.get("body", b""), message.get("more_body", False)


async def _read_announced(receive: Receive, first: bytes, expected: int) -> bytearray:
    # Grown as the bytes come (bytearray over-allocates geometrically, so appends stay cheap),
    # never allocated from the announced length: that is only a claim until the bytes arrive.
    buffer = bytearray()
    chunk, more = first, True
    while True:
        if len(buffer) + len(chunk) > expected:
            raise InvalidArgument(
                f"request body is longer than its Content-Length of {expected} bytes"
            )
        buffer += chunk
        if not more:
            return buffer
        chunk, more = _body_chunk(await receive())


async def _read_chunked(receive: Receive, first: bytes, limit: int, what: str) -> bytes:
    chunks = [first]
    total = len(first)
    more = True
    while more:
        chunk, more = _body_chunk(await receive())
        total += len(chunk)
        if total > limit:
            raise too_large(limit, what=what)
        chunks.append(chunk)
    return b"".join(chunks)
