"""The HTTP frontend's limits: request size (``--http-max-input-size``) and its error, and what
one connection may cost (header size, header and body read timeouts).

Triton answers an oversized request with HTTP 400 and a message that names the limit and the flag
that raises it; clients and tests match on "exceeds the maximum allowed value", and for a JSON-only
body on Triton's own words for it, "request JSON size of N bytes exceeds the maximum allowed input
size of M bytes".
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.core import InvalidArgument

#: Triton's default ``--http-max-input-size``: 64 MiB.
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
#: nginx's ``large_client_header_buffers 4 8k``: a request head of at most 32 KiB.
DEFAULT_MAX_HEADER_SIZE = 32 * 1024
#: nginx's ``client_header_timeout`` and ``client_body_timeout``: 60 s.
DEFAULT_READ_TIMEOUT = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    """What one HTTP/1.1 connection may cost before the server closes it.

    ``max_header_size``: bytes of a request head (request line, headers, blank line); a longer
    head gets 431. ``header_timeout``: seconds a request head may take, from its first byte (or
    from the connection's accept, for the first request); ``body_timeout``: seconds without a
    byte while a body is due. Both end the connection with 408 (nginx's rules and defaults).
    ``send_timeout``: seconds a response may wait for the client to take more of it (the
    socket's buffer full, nginx's ``send_timeout``); then the connection is closed, and what the
    response held (its output blocks) is let go.
    """

    max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    header_timeout: float = DEFAULT_READ_TIMEOUT
    body_timeout: float = DEFAULT_READ_TIMEOUT
    send_timeout: float = DEFAULT_READ_TIMEOUT


def too_large(limit: int, size: int | None = None, *, what: str = "Request") -> InvalidArgument:
    """The error for a body over ``limit`` bytes (``size`` when it is known)."""
    size_text = "" if size is None else f" of {size} bytes"
    if what == "Request JSON":  # Triton's words (http_server.cc EVBufferToJson)
        return InvalidArgument(
            f"request JSON size{size_text} exceeds the maximum allowed input size of {limit} "
            "bytes. Use --http-max-input-size to increase the limit."
        )
    return InvalidArgument(
        f"{what} size{size_text} exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )
