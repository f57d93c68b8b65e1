"""HTTP/2 framing (RFC 9113) as shoal's gRPC server uses it: frame headers, SETTINGS, and the
header blocks it sends.

The header blocks the server sends are HPACK (RFC 7541) literals "without indexing" and static
table references only: they never touch the peer's dynamic table, so they can be encoded once
and need no encoder state. Received header blocks are decoded with the ``hpack`` library.
"""

from __future__ import annotations

import struct
from typing import Final

PREFACE: Final[bytes] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6).
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# SETTINGS parameters.
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# Error codes (RFC 9113 section 7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1
MAX_FRAME_LIMIT: Final = 2**24 - 1

#: A frame header: length (24 bits, as 16 + 8), type, flags, stream id (31 bits + reserved bit).
FRAME_HEADER: Final = struct.Struct(">HBBBI")
FRAME_HEADER_SIZE: Final = 9  # FRAME_HEADER.size, written out: mypyc inlines a literal
#: The same header read as three fields: length and type (24 + 8 bits), flags, stream id.
_HEADER_FIELDS: Final = struct.Struct(">IBI")
_SETTING: Final = struct.Struct(">HI")
_U32: Final = struct.Struct(">I")
_GOAWAY: Final = struct.Struct(">II")
#: The struct methods used on every frame, bound once: compiled, a call of a
#: struct's method looks the method up on every call first.
_read_fields: Final = _HEADER_FIELDS.unpack_from
_read_u32: Final = _U32.unpack_from
_pack_header: Final = FRAME_HEADER.pack


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return _pack_header(length >> 8, length & 0xFF, kind, flags, stream_id)


def read_header(data: bytes | bytearray | memoryview, offset: int) -> tuple[int, int, int, int]:
    """(length, type, flags, stream id) of the frame header at ``offset``. Read as three typed
    fields: compiled, the reader's arithmetic on them is native (five untyped ones cost it a
    generic operation each, on every frame)."""
    fields: tuple[int, int, int] = _read_fields(data, offset)
    word, flags, stream_id = fields
    return word >> 8, word & 0xFF, flags, stream_id & 0x7FFFFFFF


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return frame_header(kind, flags, stream_id, len(payload)) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


def parse_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def read_u32(payload: bytes | memoryview) -> int:
    value: int = _read_u32(payload)[0]
    return value & 0x7FFFFFFF


# --- HPACK, the sending side ------------------------------------------------------------------


def hpack_integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """``value`` with an N-bit prefix (RFC 7541 section 5.1); ``first`` holds the flag bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, with a literal name (no Huffman coding)."""
    return b"\x00" + hpack_integer(len(name), 7) + name + hpack_integer(len(value), 7) + value


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal without indexing whose name is entry ``index`` of the static table."""
    return hpack_integer(index, 4) + hpack_integer(len(value), 7) + value


#: ``:status: 200`` (static entry 8) and ``content-type: application/grpc`` (name: entry 31).
#: Final, as every constant read per call: compiled, ``h2.X`` is then a C static, not an
#: attribute look-up on the module (~270 instructions).
GRPC_RESPONSE_HEADERS: Final = b"\x88" + literal_indexed_name(31, b"application/grpc")


#: A dynamic table size update to 0 (RFC 7541 section 6.3): what starts the first header block
#: after the peer set SETTINGS_HEADER_TABLE_SIZE.
TABLE_SIZE_ZERO: Final = hpack_integer(0, 5, 0x20)


def status_headers(status: int) -> bytes:
    """``:status`` (name: static entry 8) for an HTTP status other than 200."""
    return literal_indexed_name(8, str(status).encode("ascii"))
