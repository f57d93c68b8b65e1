"""The error that ends an HTTP/2 connection."""

from __future__ import annotations


class ConnectionError_(Exception):
    """A connection error: the connection ends with GOAWAY and ``code``; ``abort``: at once,
    dropping what waits to be written (the peer does not read it)."""

    def __init__(self, code: int, message: str, abort: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.abort = abort
