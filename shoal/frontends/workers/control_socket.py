"""A frontend worker's blocking control socket to the core: whole frames, and the error when
the core is gone (``client.py`` makes its synchronous calls on it)."""

from __future__ import annotations

import socket
from typing import Any

from shoal.core import errors
from shoal.frontends.workers import _wire as wire

__all__ = ["CoreGone", "recv_exactly", "recv_frame"]


class CoreGone(errors.Unavailable):
    """The core process closed the worker's sockets: it is exiting or died."""

    def __init__(self) -> None:
        super().__init__("the server's core process is not reachable (shutting down)")


def recv_exactly(sock: socket.socket, size: int) -> bytearray:
    """``size`` bytes from a blocking socket; :class:`CoreGone` at end of stream."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:])
        if count == 0:
            raise CoreGone()
        got += count
    return buffer


def recv_frame(sock: socket.socket) -> tuple[list[Any], list[memoryview]]:
    """One frame from a blocking socket."""
    header_size, payload_size = wire.prefix(recv_exactly(sock, wire.PREFIX_SIZE))
    rest = memoryview(recv_exactly(sock, header_size + payload_size))
    return wire.split(rest[:header_size], rest[header_size:])
