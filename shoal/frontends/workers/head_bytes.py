"""A packed record's head written piece by piece: the bytes msgpack's Packer makes of it, without
a Packer call and its type dispatch per field (``packing._head`` packed the seven fields in one
call: ~6,200 instructions for a one-input request, most of it that dispatch).

The pieces that do not change between a model version's requests are made once, with its
snapshot (:func:`str_bytes` of each input's name and datatype, :func:`array_of_str` of its
outputs); a request adds its id, its shape and its inputs' locations. Each value is written in
the shortest form, as the Packer writes it (``use_bin_type``: bytes as bin, text as UTF-8 str),
so the head is byte for byte the Packer's; anything else in it (request parameters, a
non-integer timeout) goes through the Packer.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from shoal.ipc.arena import Block
from shoal.ipc.tensor import InlineBytes

__all__ = ["array_header", "array_of_str", "desc_bytes", "int_bytes", "shape_bytes", "str_bytes"]

_U8: Final = struct.Struct(">BB")
_U16: Final = struct.Struct(">BH")
_U32: Final = struct.Struct(">BI")
_U64: Final = struct.Struct(">BQ")
_I8: Final = struct.Struct(">Bb")
_I16: Final = struct.Struct(">Bh")
_I32: Final = struct.Struct(">Bi")
_I64: Final = struct.Struct(">Bq")

#: The one-byte forms: positive fixints, fixstr and fixarray headers.
_FIXINTS: Final = tuple(bytes((value,)) for value in range(128))
_FIXSTRS: Final = tuple(bytes((0xA0 | size,)) for size in range(32))
_FIXARRAYS: Final = tuple(bytes((0x90 | size,)) for size in range(16))

#: A descriptor's array header and kind (``TensorDesc.to_wire``): inline bytes (five fields,
#: kind 4), a block of an arena (eight fields, kind 0).
_INLINE_DESC: Final = b"\x95"
_INLINE_KIND: Final = b"\x04"
_BLOCK_DESC: Final = b"\x98"
_BLOCK_KIND: Final = b"\x00"


def int_bytes(value: int) -> bytes:
    """``value`` as msgpack's shortest integer (OverflowError past 64 bits, as the Packer)."""
    if 0 <= value < 128:
        return _FIXINTS[value]
    if value >= 0:
        if value < 0x100:
            return _U8.pack(0xCC, value)
        if value < 0x10000:
            return _U16.pack(0xCD, value)
        if value < 0x100000000:
            return _U32.pack(0xCE, value)
        if value < 0x10000000000000000:
            return _U64.pack(0xCF, value)
        raise OverflowError(f"integer {value} does not fit msgpack's 64 bits")
    if value >= -32:
        return bytes((value & 0xFF,))
    if value >= -0x80:
        return _I8.pack(0xD0, value)
    if value >= -0x8000:
        return _I16.pack(0xD1, value)
    if value >= -0x80000000:
        return _I32.pack(0xD2, value)
    if value >= -0x8000000000000000:
        return _I64.pack(0xD3, value)
    raise OverflowError(f"integer {value} does not fit msgpack's 64 bits")


def str_bytes(text: str) -> bytes:
    """``text`` as msgpack's str: its UTF-8 (strict, as the Packer's: a lone surrogate raises)."""
    data = text.encode("utf-8")
    size = len(data)
    if size < 32:
        return _FIXSTRS[size] + data
    if size < 0x100:
        return _U8.pack(0xD9, size) + data
    if size < 0x10000:
        return _U16.pack(0xDA, size) + data
    return _U32.pack(0xDB, size) + data


def _bin_header(size: int) -> bytes:
    if size < 0x100:
        return _U8.pack(0xC4, size)
    if size < 0x10000:
        return _U16.pack(0xC5, size)
    return _U32.pack(0xC6, size)


def array_header(count: int) -> bytes:
    """The header of an array of ``count`` values."""
    if count < 16:
        return _FIXARRAYS[count]
    if count < 0x10000:
        return _U16.pack(0xDC, count)
    return _U32.pack(0xDD, count)


def array_of_str(texts: list[str]) -> bytes:
    """An array of strs, whole."""
    pieces = [array_header(len(texts))]
    for text in texts:
        pieces.append(str_bytes(text))
    return b"".join(pieces)


def shape_bytes(shape: tuple[int, ...]) -> bytes:
    """A shape, whole."""
    pieces = [array_header(len(shape))]
    for dim in shape:
        pieces.append(int_bytes(dim))
    return b"".join(pieces)


def desc_bytes(name_type: bytes, shape: bytes, location: Any) -> bytes:
    """An input's descriptor (``TensorDesc.to_wire`` packed): ``name_type``, its name and
    datatype packed (:func:`str_bytes` of each, made once per snapshot); ``shape``, its
    :func:`shape_bytes`; ``location``, an :class:`InlineBytes` or a :class:`Block` (the only
    places a worker stages an input)."""
    if type(location) is InlineBytes:
        data = location.data
        return b"".join(
            (
                _INLINE_DESC,
                name_type,
                shape,
                _INLINE_KIND,
                _bin_header(len(data)),
                data,
            )
        )
    if type(location) is Block:
        return b"".join(
            (
                _BLOCK_DESC,
                name_type,
                shape,
                _BLOCK_KIND,
                int_bytes(location.arena_id),
                int_bytes(location.segment),
                int_bytes(location.offset),
                int_bytes(location.nbytes),
            )
        )
    raise TypeError(f"an input staged in {type(location).__name__}, not inline or in a block")
