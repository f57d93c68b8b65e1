"""HTTP body compression: request ``Content-Encoding`` and response ``Accept-Encoding``.

tritonclient's ``request_compression_algorithm`` / ``response_compression_algorithm`` send gzip
(RFC 1952) or "deflate", which it produces and reads as a zlib stream (RFC 1950) like Triton does.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Final

from shoal.core import InvalidArgument, Unsupported
from shoal.frontends._limits import too_large

#: What ``Accept-Encoding`` advertises on a response to an unsupported ``Content-Encoding``.
SUPPORTED_ENCODINGS: Final = "gzip, deflate"

_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS
_ZLIB_WBITS: Final = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS: Final = -zlib.MAX_WBITS
# Level 6 (zlib's default) costs a third of level 9's time for nearly the same size.
_LEVEL: Final = 6
_IDENTITY: Final = ("", "identity")


class UnsupportedEncoding(Unsupported):
    """The request body uses a ``Content-Encoding`` shoal cannot decode."""


class _CorruptBody(InvalidArgument):
    """zlib rejected the compressed stream (as opposed to a truncated or oversized one)."""


def request_encoding(content_encoding: str | None) -> str | None:
    """The request body's encoding (``"gzip"``/``"deflate"``) or ``None`` for identity."""
    if content_encoding is None:
        return None
    value = content_encoding.strip().lower()
    if value in _IDENTITY:
        return None
    if value in ("gzip", "deflate"):
        return value
    raise UnsupportedEncoding(
        f"Unsupported compression type '{value}': supported are {SUPPORTED_ENCODINGS}"
    )


#: A compressed body smaller than this is inflated on the event loop: deflate's ratio is at most
#: about 1:1032, so it cannot cost more than a millisecond or so. A larger one goes to a thread
#: (zlib releases the GIL), so that a "zip bomb" costs its own request time, not everybody's.
INFLATE_INLINE: Final = 1024


async def inflate(body: bytes | bytearray | memoryview, encoding: str, *, limit: int) -> bytes:
    """:func:`decompress`, off the event loop unless ``body`` is small."""
    if len(body) < INFLATE_INLINE:
        return decompress(body, encoding, limit=limit)
    return await asyncio.to_thread(decompress, body, encoding, limit=limit)


def decompress(body: bytes | bytearray | memoryview, encoding: str, *, limit: int) -> bytes:
    """Decode a gzip/deflate request body, refusing to inflate it past ``limit`` bytes."""
    if encoding == "gzip":
        return _inflate(body, _GZIP_WBITS, encoding, limit)
    try:
        return _inflate(body, _ZLIB_WBITS, encoding, limit)
    except _CorruptBody:
        # Some clients send raw deflate (RFC 1951) under "deflate"; accept that too.
        return _inflate(body, _RAW_DEFLATE_WBITS, encoding, limit)


def _inflate(body: bytes | bytearray | memoryview, wbits: int, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        # max_length bounds memory: a small "zip bomb" body stops one byte past the limit.
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _CorruptBody(f"failed to decompress the {encoding} request body: {exc}") from exc
    if len(data) > limit or inflater.unconsumed_tail:
        raise too_large(limit, what="Decompressed request")
    if not inflater.eof:
        raise InvalidArgument(f"failed to decompress the {encoding} request body: it is truncated")
    if inflater.unused_data:
        raise InvalidArgument(
            f"failed to decompress the {encoding} request body: "
            f"{len(inflater.unused_data)} bytes follow the compressed data"
        )
    return data


def response_encoding(accept_encoding: str | None) -> str | None:
    """Pick gzip/deflate from ``Accept-Encoding`` as Triton does, or ``None`` for identity.

    The highest ``q`` among identity, gzip and deflate wins; on a tie the one listed first wins;
    ``q=0`` means "not acceptable".
    """
    if not accept_encoding:
        return None  # most requests: none of the parsing below (a generator per entry)
    best: str | None = None
    best_weight = 0.0
    for item in accept_encoding.split(","):
        coding, weight = _coding_and_weight(item)
        if coding in ("identity", "gzip", "deflate") and weight > best_weight:
            best, best_weight = coding, weight
    return None if best == "identity" else best


def _coding_and_weight(item: str) -> tuple[str, float]:
    coding, *params = (part.strip() for part in item.split(";"))
    weight = 1.0
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                weight = float(value)
            except ValueError:
                return "", 0.0  # a malformed weight skips the entry, as Triton does
    return coding.lower(), weight


def compress(body: bytes, encoding: str) -> bytes:
    """Compress a response body with ``"gzip"`` or ``"deflate"`` (a zlib stream)."""
    wbits = _GZIP_WBITS if encoding == "gzip" else _ZLIB_WBITS
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()
