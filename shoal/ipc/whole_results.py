"""A batch's :class:`~shoal.ipc.model_messages.Result` in its whole form: a fixed binary prefix
the core reads with one unpack, then each response's record as the stub packed it.

The core needs little of a plain Result to finish its requests: the batch id, the compute and
stub times, and which blocks each response owns. Where every response of a batch is a success
whose outputs all travel inline (small tensors: ``tensor.INLINE_TENSOR_MAX``), the responses
own no block, so the core needs nothing of their records but their bytes: it relays them to a
frontend worker undecoded (the worker decodes them, ``_response_wire``), and decodes them only
for its own frontends (:func:`response_of`). The layout, little-endian::

    u8 MARK (0xC1: never a MessagePack byte), 3 pad bytes, u32 response count,
    i64 batch id, i64 compute_ns[3], i64 stub_ns[2],
    u32 byte length of each response's record,
    each record: the MessagePack of ``ResponseRecord.to_wire()``.

A record is MessagePack's bytes, always; the stub writes the common one by hand (a success with
at most 15 outputs and no parameters: :func:`_record`), the same bytes as MessagePack's but
without ``to_wire``'s lists and MessagePack's generic walk of them, and a reader that wants its
outputs reads such a record by hand too (:func:`read_record`), MessagePack reading any other.

Every other Result (an error, an output in a block, a CUDA or client-region output, a
rescheduled request, an unexecuted or decoupled batch) stays MessagePack: the stub chooses
per batch (:func:`pack_whole`), and ``messages.decode`` tells the two apart by the first byte.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgpack

from shoal.ipc.model_messages import Result
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import INLINE_KIND, InlineBytes

#: The first byte of a whole Result (MessagePack never writes 0xC1).
MARK: Final = 0xC1
_HEAD: Final = struct.Struct("<BxxxIqqqqqq")
HEAD_SIZE: Final = _HEAD.size
#: The prefix of a Result of one response (nearly every one) with its record's length: one call.
_HEAD_ONE: Final = struct.Struct("<BxxxIqqqqqqI")
#: The record lengths' layout by response count (made once per count).
_lengths: Final[dict[int, struct.Struct]] = {}


def _lengths_of(count: int) -> struct.Struct:
    layout = _lengths.get(count)
    if layout is None:
        layout = _lengths[count] = struct.Struct(f"<{count}I")
    return layout


def wholly_inline(result: Result) -> bool:
    """Whether ``result`` takes the whole form: executed, nothing rescheduled, and each of its
    (one or more) responses a success whose outputs are all inline."""
    responses = result.responses
    if not responses or result.rescheduled or not result.executed:
        return False
    for response in responses:
        if response.error is not None:
            return False
        for output in response.outputs:
            if type(output.location) is not InlineBytes:
                return False
    return True


def pack_whole(packer: msgpack.Packer, result: Result) -> bytes | None:
    """``result`` in the whole form, or None where it must stay MessagePack."""
    if not wholly_inline(result):
        return None
    responses = result.responses
    compute, stub = result.compute_ns, result.stub_ns
    if len(responses) == 1:
        record = _record(packer, responses[0])
        head = _HEAD_ONE.pack(
            MARK,
            1,
            result.batch_id,
            compute[0],
            compute[1],
            compute[2],
            stub[0],
            stub[1],
            len(record),
        )
        return head + record
    records = [_record(packer, response) for response in responses]
    count = len(records)
    head = _HEAD.pack(
        MARK, count, result.batch_id, compute[0], compute[1], compute[2], stub[0], stub[1]
    )
    lengths = _lengths_of(count).pack(*[len(record) for record in records])
    return b"".join([head, lengths, *records])


def unpack_whole(payload: bytes) -> Result:
    """The Result of a whole-form message, its records undecoded (``Result.wholes``); a
    message whose lengths do not add up is a ValueError."""
    size = len(payload)
    if size < HEAD_SIZE:
        raise ValueError(f"a whole Result of {size} bytes is shorter than its prefix")
    # Typed: compiled, the fields are then read natively, not through generic calls.
    head: tuple[int, int, int, int, int, int, int, int] = _HEAD.unpack_from(payload, 0)
    _, count, batch_id, c0, c1, c2, s0, s1 = head
    at = HEAD_SIZE + 4 * count
    if count == 0 or at > size:
        raise ValueError(f"a whole Result of {size} bytes cannot hold {count} records")
    view = memoryview(payload)
    wholes: list[memoryview] = []
    for index in range(count):
        # Each u32 read natively, not through a generic struct call.
        place = HEAD_SIZE + 4 * index
        length = (
            payload[place]
            | payload[place + 1] << 8
            | payload[place + 2] << 16
            | payload[place + 3] << 24
        )
        end = at + length
        wholes.append(view[at:end])
        at = end
    if at != size:
        raise ValueError(f"a whole Result's records end at byte {at} of {size}")
    return Result(batch_id, [], (c0, c1, c2), None, True, (s0, s1), wholes)


def response_of(whole: memoryview) -> ResponseRecord:
    """One record of a whole Result, decoded; a malformed one is the request's INTERNAL error
    (never the core's exception)."""
    try:
        wire = msgpack.unpackb(whole, raw=False, strict_map_key=False)
        return ResponseRecord.from_wire(wire)
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as error:
        text = f"the stub's response record is malformed: {type(error).__name__}: {error}"
        return ResponseRecord(error=("INTERNAL", text))


def relayed(whole: memoryview) -> ResponseRecord:
    """One record of a whole Result as the core relays it: its bytes, not decoded."""
    return ResponseRecord(None, None, None, whole)


# -- the common record by hand --------------------------------------------------------------------
# MessagePack's encoding of ``[[[name, datatype, shape, INLINE, data], ...], None, {}]`` (a
# fixarray of three, a fixarray of the outputs, each a fixarray of five: two str, the shape's
# array of ints, the positive fixint 4 and a bin; nil; an empty fixmap), written and read by
# hand: MessagePack's Packer cost ~4k instructions per one-output record and its unpackb ~3k,
# mostly its generic walk of the lists (BENCHMARKS.md, "A record by hand").

#: A record's first two bytes by its output count (0-15).
_RECORD_HEADS: Final = tuple([bytes((0x93, 0x90 | count)) for count in range(16)])
#: A shape's array header by its length (0-15), and each positive fixint.
_FIXARRAYS: Final = tuple([bytes((0x90 | count,)) for count in range(16)])
_FIXINTS: Final = tuple([bytes((value,)) for value in range(128)])
#: An inline location's tag and its bytes' bin8 header, by their length (0-255).
_INLINE_BIN8: Final = tuple([bytes((INLINE_KIND, 0xC4, size)) for size in range(256)])
_INLINE_BIN16: Final = bytes((INLINE_KIND, 0xC5))
_INLINE_BIN32: Final = bytes((INLINE_KIND, 0xC6))
#: A success's end: no error (nil), no parameters (an empty map).
_SUCCESS_END: Final = b"\xc0\x80"
#: Each output name's descriptor head (the fixarray of five, the name and its datatype), packed
#: once: ``name -> (datatype, head)`` (forgotten all at once past ``_MOST_NAMES``).
_heads: Final[dict[str, tuple[str, bytes]]] = {}
_MOST_NAMES: Final = 1024

#: An output of a whole record as its readers take it: name, datatype, shape and its bytes.
InlineOutput = tuple[str, str, tuple[int, ...], memoryview]


def _record(packer: msgpack.Packer, response: ResponseRecord) -> bytes:
    """``packer.pack(response.to_wire())`` of a response whose outputs are all inline and that
    is no error (:func:`wholly_inline`): by hand where it has no parameters and at most 15
    outputs, the same bytes."""
    outputs = response.outputs
    count = len(outputs)
    if response.parameters or count > 15:
        return packer.pack(response.to_wire())  # type: ignore[no-any-return]
    pieces: list[bytes] = [_RECORD_HEADS[count]]
    for desc in outputs:
        inline: InlineBytes = desc.location  # type: ignore[assignment]
        pieces.append(_head(packer, desc.name, desc.datatype))
        shape = desc.shape
        if len(shape) < 16:
            pieces.append(_FIXARRAYS[len(shape)])
            for dim in shape:
                pieces.append(_FIXINTS[dim] if 0 <= dim < 128 else packer.pack(dim))
        else:
            pieces.append(packer.pack(shape))
        data = inline.data
        size = len(data)
        if size < 256:
            pieces.append(_INLINE_BIN8[size])
        elif size < 65536:
            pieces.append(_INLINE_BIN16 + size.to_bytes(2, "big"))
        else:
            pieces.append(_INLINE_BIN32 + size.to_bytes(4, "big"))
        pieces.append(data)
    pieces.append(_SUCCESS_END)
    return b"".join(pieces)


def _head(packer: msgpack.Packer, name: str, datatype: str) -> bytes:
    known = _heads.get(name)
    if known is not None and known[0] == datatype:
        return known[1]
    if len(_heads) >= _MOST_NAMES:
        _heads.clear()
    head: bytes = b"\x95" + packer.pack(name) + packer.pack(datatype)
    _heads[name] = (datatype, head)
    return head


def read_record(whole: memoryview) -> tuple[list[InlineOutput], Any, dict[str, Any]]:
    """A whole Result's record as ``(outputs, error, parameters)``, what MessagePack reads of it
    but each output ``(name, datatype, shape, bytes)``: by hand where the stub wrote it so, else
    by MessagePack. An output that is not inline is a ValueError."""
    outputs = _read_success(whole)
    if outputs is not None:
        return outputs, None, {}
    wire, error, parameters = msgpack.unpackb(whole, strict_map_key=False)
    read: list[InlineOutput] = []
    for output in wire:
        if len(output) != 5 or output[3] != INLINE_KIND or type(output[4]) is not bytes:
            raise ValueError(f"output '{output[0]}' of a whole record is not inline")
        read.append((output[0], output[1], tuple(output[2]), memoryview(output[4])))
    return read, error, parameters


def _read_success(whole: memoryview) -> list[InlineOutput] | None:
    """The outputs of a record :func:`_record` wrote by hand (their bytes views of ``whole``),
    or None for any other record (MessagePack reads it)."""
    record = bytes(whole)  # (a copy of some bytes: indexed natively, compiled)
    size = len(record)
    try:
        count = record[1] - 0x90
        if record[0] != 0x93 or count < 0 or count > 15:
            return None
        outputs: list[InlineOutput] = []
        at = 2
        for _ in range(count):
            if record[at] != 0x95:
                return None
            name, at = _text(record, at + 1)
            if at < 0:
                return None
            datatype, at = _text(record, at)
            if at < 0:
                return None
            dims = record[at] - 0x90
            if dims < 0 or dims > 15:
                return None
            at += 1
            shape: list[int] = []
            for _ in range(dims):
                dim, at = _uint(record, at)
                if at < 0:
                    return None
                shape.append(dim)
            if record[at] != INLINE_KIND:
                return None
            bin_head = record[at + 1]
            if bin_head == 0xC4:
                start = at + 3
                end = start + record[at + 2]
            elif bin_head == 0xC5:
                start = at + 4
                end = start + (record[at + 2] << 8 | record[at + 3])
            elif bin_head == 0xC6:
                start = at + 6
                end = start + int.from_bytes(record[at + 2 : start], "big")
            else:
                return None
            if end > size:
                return None
            outputs.append((name, datatype, tuple(shape), whole[start:end]))
            at = end
        if at != size - 2 or record[at] != 0xC0 or record[at + 1] != 0x80:
            return None
        return outputs
    except (IndexError, UnicodeDecodeError):  # malformed: MessagePack says how
        return None


def _text(record: bytes, at: int) -> tuple[str, int]:
    """The fixstr or str8 at ``at`` and where it ends; ``("", -1)`` for anything else."""
    head = record[at]
    if 0xA0 <= head <= 0xBF:
        start = at + 1
        end = start + (head - 0xA0)
    elif head == 0xD9:
        start = at + 2
        end = start + record[at + 1]
    else:
        return "", -1
    if end > len(record):
        return "", -1
    return record[start:end].decode(), end


def _uint(record: bytes, at: int) -> tuple[int, int]:
    """The unsigned int at ``at`` and where it ends; ``(0, -1)`` for anything else."""
    head = record[at]
    if head < 0x80:
        return head, at + 1
    if head == 0xCC:
        return record[at + 1], at + 2
    if head == 0xCD:
        return record[at + 1] << 8 | record[at + 2], at + 3
    if head == 0xCE or head == 0xCF:
        end = at + (5 if head == 0xCE else 9)
        if end > len(record):
            return 0, -1
        return int.from_bytes(record[at + 1 : end], "big"), end
    return 0, -1
