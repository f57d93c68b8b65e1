"""The protobuf wire format around tensor bytes, so that they are never copied by protobuf.

Parsing a ``ModelInferRequest`` with protobuf copies every ``raw_input_contents`` entry (into the
message, then again into a Python ``bytes`` on access). :func:`split_raw_contents` instead walks
the message's top-level fields once: the entries of the raw field become read-only ``memoryview``
slices of the received bytes, and only the other fields (names, shapes, parameters: small) are
left for protobuf to parse. This walk runs once per request in Python, so it reads one-byte tags
and lengths (the usual case) inline and leaves longer varints to a helper. On the way out,
:func:`raw_field_chunks` appends each output's bytes to a serialized ``ModelInferResponse`` as a
repeated field, so the response is built with exactly one copy of each tensor, when the caller
joins the chunks.

Protobuf parsers accept the fields of a message in any order and concatenate repeated fields, so
both tricks produce and accept ordinary, valid messages.

The walk costs Python time per field, so it stops after :data:`MAX_WALKED_FIELDS` fields: a
message made of more (a hostile one: 4 MiB of zero bytes, or millions of empty fields) is left
whole to protobuf's C parser, which copies the entries but takes milliseconds, not seconds, on
the event loop (docs/hardening.md, "Parsing").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from shoal.core import InvalidArgument

# Final, one per line: compiled, each use is then inlined, not a look-up in the module's dict.
_VARINT: Final = 0
_FIXED64: Final = 1
_LENGTH_DELIMITED: Final = 2
_FIXED32: Final = 5
_MAX_VARINT_BYTES: Final = 10
#: Top-level fields walked in Python before the message is left whole to protobuf. A
#: ModelInferRequest has one per input, output, parameter and raw entry, and the few scalars.
MAX_WALKED_FIELDS: Final = 1024

#: A body part: the wire bytes of a message are the concatenation of its chunks.
Chunk = bytes | memoryview


#: The varint of each value below 128: one byte, the value itself.
_SMALL_VARINTS: Final = [bytes((value,)) for value in range(0x80)]


def encode_varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    if value < 0x80:  # tags and the lengths of small fields: once or twice per field written
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_header(number: int, size: int) -> bytes:
    """Tag and length of a length-delimited field ``number`` whose payload has ``size`` bytes."""
    return encode_varint(number << 3 | _LENGTH_DELIMITED) + encode_varint(size)


def raw_field_chunks(number: int, payloads: Sequence[memoryview]) -> list[Chunk]:
    """The repeated bytes field ``number`` holding ``payloads``, one entry each, in order."""
    chunks: list[Chunk] = []
    for payload in payloads:
        chunks.append(field_header(number, payload.nbytes))
        if payload.nbytes:
            chunks.append(payload)
    return chunks


#: Chunks smaller than this are joined before they are written; larger ones go as views.
JOIN_BELOW: Final = 64 * 1024


def coalesced(chunks: list[Chunk]) -> list[Chunk]:
    """``chunks`` with each run of small ones joined (fewer DATA frames); large ones stay views."""
    out: list[Chunk] = []
    small: list[Chunk] = []
    for chunk in chunks:
        if memoryview(chunk).nbytes < JOIN_BELOW:
            small.append(chunk)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(chunk)
    if small:
        out.append(b"".join(small))
    return out


def embedded_chunks(number: int, message: Sequence[Chunk]) -> list[Chunk]:
    """The message field ``number`` whose serialized value is the concatenation of ``message``."""
    size = sum(memoryview(chunk).nbytes for chunk in message)
    return [field_header(number, size), *message]


def split_raw_contents(
    data: bytes | bytearray | memoryview, number: int
) -> tuple[bytes | bytearray | memoryview, list[memoryview]]:
    """Separate the length-delimited field ``number`` from a serialized message.

    Returns the message without that field (to parse with protobuf) and the field's entries, in
    order, as zero-copy read-only views of ``data``. Malformed input is InvalidArgument. A
    message of more than :data:`MAX_WALKED_FIELDS` fields is returned whole, with no entries:
    protobuf parses the field with the rest.
    """
    view = memoryview(data).toreadonly()
    try:
        runs, entries = _split(view, number)
    except _TooManyFields:
        return data, []
    if not entries:
        return data, entries  # nothing to cut out: parse the message as it came
    if len(runs) == 1:
        return view[runs[0][0] : runs[0][1]], entries
    return b"".join(view[start:end] for start, end in runs), entries


def _split(view: memoryview, number: int) -> tuple[list[list[int]], list[memoryview]]:
    """The other fields, as (start, end) runs of ``view``, and the entries of field ``number``.
    Serializers write fields in number order, so the other fields are usually one run before
    the entries, which is then parsed without a join. A loop over :func:`_field`, not a
    generator: compiled, each field is then a call returning three native integers."""
    runs: list[list[int]] = []
    entries: list[memoryview] = []
    offset, total = 0, len(view)
    for _ in range(MAX_WALKED_FIELDS):
        if offset >= total:
            return runs, entries
        field, value, end = _field(view, offset, total)
        if field == number:
            entries.append(view[value:end])
        elif runs and runs[-1][1] == offset:
            runs[-1][1] = end
        else:
            runs.append([offset, end])
        offset = end
    if offset < total:
        raise _TooManyFields
    return runs, entries


class _TooManyFields(Exception):
    """The message has more than MAX_WALKED_FIELDS fields."""


def _field(view: memoryview, offset: int, total: int) -> tuple[int, int, int]:
    """(number, start of the value, end) of the top-level field that starts at ``offset``."""
    key = view[offset]
    # One-byte tags (fields 1 to 15, the only ones of ModelInferRequest) and lengths (values
    # under 128 bytes) are read inline; the rest by _value.
    key, offset = (key, offset + 1) if key < 0x80 else _read_varint(view, offset)
    if key & 7 == _LENGTH_DELIMITED and offset < total and view[offset] < 0x80 and key >> 3:
        value, offset = offset + 1, offset + 1 + view[offset]
    else:
        value, offset = _value(view, offset, key)
    if offset > total:
        raise _malformed(f"field {key >> 3} runs past the end of the message")
    return key >> 3, value, offset


def _value(view: memoryview, offset: int, key: int) -> tuple[int, int]:
    """Start and end of the value of a field whose tag ``key`` ends at ``offset``."""
    if key >> 3 == 0:
        raise _malformed("a field numbered 0")
    if key & 7 == _LENGTH_DELIMITED:
        return _delimited(view, offset, key >> 3)
    return offset, _skip_value(view, offset, key & 7, key >> 3)


def _delimited(view: memoryview, offset: int, field: int) -> tuple[int, int]:
    """Start and end of the value of a length-delimited field whose length is at ``offset``."""
    total = len(view)
    size = view[offset] if offset < total else 0x80
    if size < 0x80:
        offset += 1
    else:
        size, offset = _read_varint(view, offset)
    end = offset + size
    if end > total:
        raise _malformed(f"field {field} runs past the end of the message")
    return offset, end


def _skip_value(view: memoryview, offset: int, wire_type: int, field: int) -> int:
    if wire_type == _VARINT:
        return _read_varint(view, offset)[1]
    width = {_FIXED64: 8, _FIXED32: 4}.get(wire_type)
    if width is None:
        raise _malformed(f"field {field} has the unsupported wire type {wire_type}")
    if offset + width > len(view):
        raise _malformed(f"field {field} runs past the end of the message")
    return offset + width


def _read_varint(view: memoryview, offset: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(offset, min(offset + _MAX_VARINT_BYTES, len(view))):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise _malformed("a varint is cut off or too long")


def _malformed(detail: str) -> InvalidArgument:
    return InvalidArgument(f"failed to parse the request message: {detail}")
