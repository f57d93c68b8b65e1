"""The headers of gRPC over HTTP/2 that shoal's own server reads and writes: the call's metadata
and ``grpc-timeout`` in, the status trailers out."""

from __future__ import annotations

import re
from typing import Final

from shoal.frontends.grpc.status import Status
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


#: The most of ``grpc-message`` a status carries, encoded. grpcio's clients (tritonclient's,
#: perf_analyzer's gRPC C++) refuse a response whose metadata passes 8 KiB (their soft limit,
#: some of the time) or 16 KiB (always), and the caller then sees "metadata size exceeds
#: limit" instead of the call's status: an error quoting a long model name or sequence id
#: would hide its own code.
MESSAGE_LIMIT: Final = 4096


def status_block(code: int, details: str) -> bytes:
    """The trailers of a call that ended with ``code`` (``grpc-message``: ``details``, cut by
    :func:`message_value`)."""
    block = h2.literal(b"grpc-status", str(code).encode("ascii"))
    if details:
        block += h2.literal(b"grpc-message", message_value(details))
    return block


def message_value(details: str) -> bytes:
    """``details`` as grpc-message's value: :func:`cut_message`, percent-encoded."""
    encoded = percent_encode(details)
    if len(encoded) <= MESSAGE_LIMIT:
        return encoded
    return percent_encode(cut_message(details))


def cut_message(details: str) -> str:
    """``details`` as a status message, at most :data:`MESSAGE_LIMIT` bytes once
    percent-encoded: a longer one is cut at a whole character and says how many characters it
    left out."""
    # A character takes at most 12 bytes encoded (4 of UTF-8, each as %XX).
    if len(details) <= MESSAGE_LIMIT // 12 or len(percent_encode(details)) <= MESSAGE_LIMIT:
        return details
    # The note's length depends on the count it names: room for the largest count.
    room = MESSAGE_LIMIT - len(percent_encode(_cut_note(len(details))))
    used = 0
    kept = 0
    for char in details:
        size = len(percent_encode(char))
        if used + size > room:
            break
        used += size
        kept += 1
    return details[:kept] + _cut_note(len(details) - kept)


def _cut_note(omitted: int) -> str:
    return f"... ({omitted} more characters cut: a gRPC status message is limited to 4 KiB)"


def percent_encode(text: str) -> bytes:
    """grpc-message's encoding: UTF-8, with bytes outside printable ASCII and '%' as %XX."""
    out = bytearray()
    for byte in text.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def encoding_error(encoding: bytes | None) -> tuple[int, str]:
    """The status of a compressed message its call's ``grpc-encoding`` cannot inflate: an
    unknown one's (UNIMPLEMENTED), or none at all (INTERNAL)."""
    name = "identity" if encoding is None else encoding.decode("latin-1")
    code = Status.UNIMPLEMENTED if encoding is not None else Status.INTERNAL
    return int(code), f"a compressed message with grpc-encoding '{name}'"
