"""What the HTTP fast path (:mod:`.fast_path`) reads and writes per request, in one native object.

The fast path's protocol is a subclass of uvicorn's ``HttpToolsProtocol``, an interpreted class:
compiled or not, each of its attributes is a dictionary look-up (~250 instructions), and a
small request read, served and answered touched about eighty of them. The state the fast path
owns (the request head being read, the connection's limits, the response's header lines) and
the references it follows for every request (the transport, the parser, the loop, the server's
state) live here instead, as a compiled class's attributes: one look-up of ``_fast`` per
callback, then native reads. uvicorn's own attributes that its code reads (``url``, ``headers``,
``expect_100_continue`` for a request that takes the ASGI way, ``cycle``, ``parser``) are still
kept on the protocol where its code reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Sequence
from typing import Any, Final

from shoal.frontends._limits import ConnectionLimits
from shoal.frontends.http._coalescing import CoalescingTransport
from shoal.frontends.http._fast_request import FastInfer, KnownHead


class FastConnection:
    """One connection's fast-path state (made when the connection is)."""

    def __init__(self, protocol: Any, limits: ConnectionLimits, now: float) -> None:
        self.transport: CoalescingTransport = protocol.transport
        self.loop: asyncio.AbstractEventLoop = protocol.loop
        #: The HTTP parser (a new one after a large body read directly: ``body_read``).
        self.parser: Any = protocol.parser
        self.flow: Any = protocol.flow
        self.pipeline: Any = protocol.pipeline
        self.server_state: Any = protocol.server_state
        self.config: Any = protocol.config
        self.tasks: set[Any] = protocol.tasks
        #: The inference endpoint, None where the app serves none (then no request is fast).
        self.endpoint: FastInfer | None = getattr(protocol.app, "fast_infer", None)
        self.limits = limits
        self.last_data = now
        #: What the request head being read may still take (-1: no head is being read).
        self.head_left: int = limits.max_header_size
        #: When the head's first byte came (0: none yet); the first is due from the accept.
        self.head_started = now
        #: A request body is due.
        self.in_body = False
        #: The chunks of the chunked request body being read (its last, empty, one too).
        self.chunks = 0
        #: When the transport's buffer went over its high-water mark (0: it is under it), or
        #: when the client last took some of it since; what the buffer held then.
        self.write_paused = 0.0
        self.write_left = 0
        #: The request head being read (uvicorn's ``url``, ``headers``, ``expect_100_continue``).
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100_continue = False
        #: The last fast request's head and what was read from it: a client sends the same
        #: head request after request, and a head equal to it is not read again.
        self.known_head: KnownHead | None = None
        self._defaults: list[tuple[bytes, bytes]] | None = None
        self._defaults_head = b""
        self._headers: Sequence[tuple[str, str]] = ()
        self._headers_lines = b""

    def head(
        self, status_line: bytes, headers: Sequence[tuple[str, str]], length: int, keep_alive: bool
    ) -> bytes:
        """The status line and headers of a fast response."""
        head = [status_line, self._default_head(), b"content-length: "]
        head += [str(length).encode("latin-1"), b"\r\n", self._header_lines(headers)]
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    def _header_lines(self, headers: Sequence[tuple[str, str]]) -> bytes:
        """``headers`` encoded; the last ones are kept, as a binary response's headers are the
        same object for each response of a model (:func:`codec.encode_infer_response`)."""
        if headers is not self._headers:
            lines = [name + ": " + value + "\r\n" for name, value in headers]
            self._headers, self._headers_lines = headers, "".join(lines).encode("latin-1")
        return self._headers_lines

    def _default_head(self) -> bytes:
        """The server's default header lines, encoded once per version of them: uvicorn
        replaces its list when the ``date`` header changes, once a second."""
        defaults = self.server_state.default_headers
        if defaults is not self._defaults:
            lines = [name + b": " + value + b"\r\n" for name, value in defaults]
            self._defaults, self._defaults_head = defaults, b"".join(lines)
        return self._defaults_head


def reset_connection(transport: Any) -> None:
    """Close with a reset: the kernel drops what the socket still had to send (a plain close
    would keep sending it, orphaned, to a client that does not read)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


#: The HTTP parser's leniencies: uvicorn's, and a body framed by both Content-Length and
#: Transfer-Encoding read chunked (RFC 9112 6.3; Triton reads it so) rather than refused.
LENIENCIES: Final = {"lenient_data_after_close": True, "lenient_chunked_length": True}


def is_framed_twice(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request head has both Content-Length and Transfer-Encoding (lowercase names)."""
    names = {name for name, _ in headers}
    return b"transfer-encoding" in names and b"content-length" in names
