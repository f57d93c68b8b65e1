"""The common :class:`~shoal.ipc.model_messages.Execute` read by hand, straight from MessagePack's
bytes into its records.

Every request a stub runs comes in an Execute: ``[2, batch id, [record, ...]]``, each record the
eleven fields of ``RequestRecord.to_wire`` (``messages.encode``, or a frontend worker's packed
head spliced in: ``messages._spliced``, ``frontends/workers/packing.py``). Read by
``msgpack.unpackb`` (a keyword call and a generic walk that builds a list per record and per
descriptor) and then ``RequestRecord.from_wire`` per record, it cost the stub ~10k instructions
a request. :func:`read_plain` reads the usual shape natively into the same objects:

* records of exactly eleven fields; text ids, integer or text correlation ids, integer flags,
  timeouts, keys and private-input bits;
* parameters a map of text to int, float, bool, nil or text;
* inputs of eight fields in an arena block or five inline (a ``bin`` up to
  ``INLINE_MESSAGE_MAX``), shapes of integers;
* output regions none, or each a client's system region.

*No format change:* the bytes are MessagePack's own. Anything else (another type or length
anywhere, a CUDA location, a cut or corrupt message, bytes left over) makes :func:`read_plain`
return None, and the caller reads the message with MessagePack as before, which decides what it
is or raises its own error: the hand reader never guesses, and never reads past the payload.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from shoal.ipc.arena import Block
from shoal.ipc.model_messages import Execute
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import INLINE_MESSAGE_MAX, InlineBytes, RegionLocation, TensorDesc

__all__ = ["read_plain"]

#: An Execute's kind (``Kind.EXECUTE``), its second byte.
_EXECUTE: Final = 2
#: A record's field count (``RequestRecord.to_wire``).
_RECORD_FIELDS: Final = 11
#: A descriptor's field count and location kind: in a block (eight fields, kind 0), inline
#: (five fields, kind 4); ``tensor.py``'s tags.
_BLOCK_FIELDS: Final = 8
_BLOCK_KIND: Final = 0
_INLINE_FIELDS: Final = 5
_INLINE_KIND: Final = 4
#: A system region on the wire: four fields, kind 1 (``tensor.py``).
_REGION_FIELDS: Final = 4
_REGION_KIND: Final = 1
_FLOAT32: Final = struct.Struct(">f")
_FLOAT64: Final = struct.Struct(">d")


class _Unusual(Exception):
    """Not the shape read here: MessagePack reads the message."""


def read_plain(payload: bytes) -> Execute | None:
    """The Execute in ``payload`` (which starts ``0x93 0x02``: an array of three, the kind
    ``Kind.EXECUTE``), read by hand; None where anything in it is not the common shape or is
    malformed (MessagePack then reads it)."""
    try:
        return _execute(payload)
    except (_Unusual, IndexError, UnicodeDecodeError):
        return None


def _execute(data: bytes) -> Execute:
    if data[0] != 0x93 or data[1] != _EXECUTE:
        raise _Unusual
    batch_id, at = _int(data, 2)
    count, at = _array(data, at)
    records: list[RequestRecord] = []
    for _ in range(count):  # (a count past the bytes ends in an IndexError, one byte an item)
        record, at = _record(data, at)
        records.append(record)
    if at != len(data):  # bytes left over: MessagePack's ExtraData
        raise _Unusual
    return Execute(batch_id, records)


def _record(data: bytes, at: int) -> tuple[RequestRecord, int]:
    fields, at = _array(data, at)
    if fields != _RECORD_FIELDS:
        raise _Unusual
    request_id, at = _str(data, at)
    correlation_id: int | str = 0
    if _is_str(data[at]):
        correlation_id, at = _str(data, at)
    else:
        correlation_id, at = _int(data, at)
    flags, at = _int(data, at)
    parameters, at = _parameters(data, at)
    count, at = _array(data, at)
    outputs: list[str] = []
    for _ in range(count):
        name, at = _str(data, at)
        outputs.append(name)
    count, at = _array(data, at)
    inputs: list[TensorDesc] = []
    for _ in range(count):
        desc, at = _desc(data, at)
        inputs.append(desc)
    timeout_us, at = _int(data, at)
    key, at = _int(data, at)
    regions, at = _regions(data, at)
    private_inputs, at = _int(data, at)
    trace_context, at = _str(data, at)
    record = RequestRecord(
        request_id,
        correlation_id,
        flags,
        parameters,
        outputs,
        inputs,
        timeout_us,
        key,
        regions,
        private_inputs,
        trace_context,
    )
    return record, at


def _desc(data: bytes, at: int) -> tuple[TensorDesc, int]:
    """A descriptor in a block or inline (``TensorDesc.to_wire``)."""
    fields, at = _array(data, at)
    if fields != _BLOCK_FIELDS and fields != _INLINE_FIELDS:
        raise _Unusual
    name, at = _str(data, at)
    datatype, at = _str(data, at)
    dims, at = _array(data, at)
    if dims == 1:  # the usual shape: no list made for it
        dim, at = _int(data, at)
        shape: tuple[int, ...] = (dim,)
    else:
        listed: list[int] = []
        for _ in range(dims):
            dim, at = _int(data, at)
            listed.append(dim)
        shape = tuple(listed)
    kind, at = _int(data, at)
    if fields == _INLINE_FIELDS and kind == _INLINE_KIND:
        start, end = _bin(data, at)
        if end - start > INLINE_MESSAGE_MAX:  # ``location_from_wire`` says what is wrong
            raise _Unusual
        return TensorDesc(name, datatype, shape, InlineBytes(data[start:end])), end
    if fields == _BLOCK_FIELDS and kind == _BLOCK_KIND:
        arena_id, at = _int(data, at)
        segment, at = _int(data, at)
        offset, at = _int(data, at)
        nbytes, at = _int(data, at)
        return TensorDesc(name, datatype, shape, Block(arena_id, segment, offset, nbytes)), at
    raise _Unusual


def _parameters(data: bytes, at: int) -> tuple[dict[str, Any], int]:
    count, at = _map(data, at)
    parameters: dict[str, Any] = {}
    for _ in range(count):
        name, at = _str(data, at)
        value, at = _scalar(data, at)
        parameters[name] = value
    return parameters, at


def _regions(data: bytes, at: int) -> tuple[dict[str, Any], int]:
    """Output regions: each a client's system region (a CUDA one: MessagePack's reader)."""
    count, at = _map(data, at)
    regions: dict[str, Any] = {}
    for _ in range(count):
        name, at = _str(data, at)
        fields, at = _array(data, at)
        kind, at = _int(data, at)
        if fields != _REGION_FIELDS or kind != _REGION_KIND:
            raise _Unusual
        region, at = _str(data, at)
        offset, at = _int(data, at)
        nbytes, at = _int(data, at)
        regions[name] = RegionLocation(region, offset, nbytes)
    return regions, at


def _scalar(data: bytes, at: int) -> tuple[Any, int]:
    """A parameter's value: text, an integer, a float, a bool or nil."""
    head = data[at]
    if _is_str(head):
        return _str(data, at)
    if head == 0xC0:
        return None, at + 1
    if head == 0xC2:
        return False, at + 1
    if head == 0xC3:
        return True, at + 1
    if head == 0xCA:
        _check(data, at + 5)
        return _FLOAT32.unpack_from(data, at + 1)[0], at + 5
    if head == 0xCB:
        _check(data, at + 9)
        return _FLOAT64.unpack_from(data, at + 1)[0], at + 9
    return _int(data, at)


def _is_str(head: int) -> bool:
    return 0xA0 <= head <= 0xBF or 0xD9 <= head <= 0xDB


def _check(data: bytes, end: int) -> None:
    """A value that would end at ``end`` must lie within the payload."""
    if end > len(data):
        raise _Unusual


def _str(data: bytes, at: int) -> tuple[str, int]:
    """Text (fixstr, str8/16/32): strict UTF-8, as MessagePack's ``raw=False``."""
    head = data[at]
    if 0xA0 <= head <= 0xBF:
        start = at + 1
        end = start + (head - 0xA0)
    elif head == 0xD9:
        start = at + 2
        end = start + data[at + 1]
    elif head == 0xDA:
        start = at + 3
        end = start + (data[at + 1] << 8 | data[at + 2])
    elif head == 0xDB:
        start = at + 5
        end = start + _u32(data, at + 1)
    else:
        raise _Unusual
    if start == end:
        return "", end
    _check(data, end)
    return data[start:end].decode(), end


def _bin(data: bytes, at: int) -> tuple[int, int]:
    """Where the bin (8/16/32) at ``at`` holds its bytes: start and end."""
    head = data[at]
    if head == 0xC4:
        start = at + 2
        end = start + data[at + 1]
    elif head == 0xC5:
        start = at + 3
        end = start + (data[at + 1] << 8 | data[at + 2])
    elif head == 0xC6:
        start = at + 5
        end = start + _u32(data, at + 1)
    else:
        raise _Unusual
    _check(data, end)
    return start, end


def _array(data: bytes, at: int) -> tuple[int, int]:
    """An array's item count (fixarray, array16/32) and where its items start."""
    head = data[at]
    if 0x90 <= head <= 0x9F:
        return head - 0x90, at + 1
    if head == 0xDC:
        return data[at + 1] << 8 | data[at + 2], at + 3
    if head == 0xDD:
        return _u32(data, at + 1), at + 5
    raise _Unusual


def _map(data: bytes, at: int) -> tuple[int, int]:
    """A map's pair count (fixmap, map16/32) and where its pairs start."""
    head = data[at]
    if 0x80 <= head <= 0x8F:
        return head - 0x80, at + 1
    if head == 0xDE:
        return data[at + 1] << 8 | data[at + 2], at + 3
    if head == 0xDF:
        return _u32(data, at + 1), at + 5
    raise _Unusual


def _int(data: bytes, at: int) -> tuple[int, int]:
    """An integer in any of MessagePack's forms."""
    head = data[at]
    if head < 0x80:
        return head, at + 1
    if head >= 0xE0:  # negative fixint
        return head - 0x100, at + 1
    if head == 0xCC:
        return data[at + 1], at + 2
    if head == 0xCD:
        return data[at + 1] << 8 | data[at + 2], at + 3
    if head == 0xCE:
        return _u32(data, at + 1), at + 5
    if head == 0xCF:  # a direct sender's keys and batch ids (its number above bit 40)
        return _u32(data, at + 1) << 32 | _u32(data, at + 5), at + 9
    if 0xD0 <= head <= 0xD3:
        end = at + 1 + (1 << (head - 0xD0))
        _check(data, end)
        return int.from_bytes(data[at + 1 : end], "big", signed=True), end
    raise _Unusual


def _u32(data: bytes, at: int) -> int:
    """The big-endian u32 at ``at`` (an IndexError past the payload)."""
    return data[at] << 24 | data[at + 1] << 16 | data[at + 2] << 8 | data[at + 3]
