"""The headers of gRPC over HTTP/2 that shoal's own server reads and writes: the call's metadata
and ``grpc-timeout`` in, the status trailers out."""

from __future__ import annotations

import re
from typing import Final

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.connection import Headers

#: The trailers of a call that succeeded (Final: compiled, a C static, not a dict look-up).
OK_TRAILERS: Final = h2.literal(b"grpc-status", b"0")

_TIMEOUT: Final = re.compile(rb"^(\d{1,8})([HMSmun])$")
_TIMEOUT_UNITS: Final = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Headers that are gRPC's or HTTP/2's own, not the call's metadata (as grpcio hides them).
_RESERVED: Final = frozenset(
    {b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
)


def metadata(headers: Headers) -> tuple[tuple[str, str], ...]:
    """The call's metadata: its headers but the pseudo-headers and gRPC's own."""
    return tuple(
        (bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
        for name, value in headers
        if not name.startswith(b":") and name not in _RESERVED
    )


def timeout_seconds(value: bytes) -> float | None:
    """``grpc-timeout`` in seconds; None when it is malformed (no deadline, as grpcio)."""
    found = _TIMEOUT.match(bytes(value))
    if found is None:
        return None
    return int(found[1]) * _TIMEOUT_UNITS[found[2]]


def status_block(code: int, details: str) -> bytes:
    """The trailers of a call that ended with ``code`` (``grpc-message``: ``details``)."""
    block = h2.literal(b"grpc-status", str(code).encode("ascii"))
    if details:
        block += h2.literal(b"grpc-message", percent_encode(details))
    return block


def percent_encode(text: str) -> bytes:
    """grpc-message's encoding: UTF-8, with bytes outside printable ASCII and '%' as %XX."""
    out = bytearray()
    for byte in text.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)
