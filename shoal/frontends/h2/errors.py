"""The error that ends an HTTP/2 connection."""

from __future__ import annotations

from shoal.frontends.h2.frames import PROTOCOL_ERROR


class ConnectionError_(Exception):
    """A connection error: the connection ends with GOAWAY and ``code``; ``abort``: at once,
    dropping what waits to be written (the peer does not read it)."""

    def __init__(self, code: int, message: str, abort: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.abort = abort


def check_opened(kind: str, stream_id: int, highest: int) -> None:
    """A frame of ``kind`` on a stream the peer has not opened, an idle one (above ``highest``,
    the last it used) or stream 0, ends the connection: PROTOCOL_ERROR (RFC 9113 section 5.1)."""
    if stream_id == 0 or stream_id > highest:
        raise ConnectionError_(PROTOCOL_ERROR, f"{kind} on idle stream {stream_id}")
