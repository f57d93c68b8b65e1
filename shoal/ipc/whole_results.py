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
            # Each dim as the object it is: a bool (an int to mypy) is MessagePack's true or
            # false, not a fixint, and a dim typed int would lose that once compiled.
            dims: tuple[object, ...] = shape
            for dim in dims:
                if type(dim) is int and 0 <= dim < 128:
                    pieces.append(_FIXINTS[dim])
                else:
                    pieces.append(packer.pack(dim))
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
    by MessagePack. A record that is not such a triple, or an output that is not inline, is a
    ValueError that says what is wrong."""
    outputs = _read_success(bytes(whole), 0, whole)
    if outputs is not None:
        return outputs, None, {}
    try:
        wire, error, parameters = msgpack.unpackb(whole, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as wrong:
        # (not MessagePack, bytes past its end, not a triple: MessagePack's or Python's words)
        raise ValueError(f"a whole record is malformed: {type(wrong).__name__}: {wrong}") from wrong
    if type(wire) is not list or type(parameters) is not dict:
        kinds = f"{type(wire).__name__} and {type(parameters).__name__}"
        raise ValueError(f"a whole record is malformed: its outputs and parameters are {kinds}")
    return [_unpacked_output(output) for output in wire], error, parameters


def _unpacked_output(output: Any) -> InlineOutput:
    """An output of a record MessagePack read, checked as the core's reader checks it
    (``TensorDesc.from_wire``), and inline."""
    if type(output) is not list or len(output) < 4:
        raise ValueError(f"a whole record is malformed: an output is {output!r}")
    name, datatype, shape = output[0], output[1], output[2]
    if type(name) is not str or type(datatype) is not str:
        raise ValueError(f"a whole record is malformed: an output is {output!r}")
    if type(shape) is not list or any(type(dim) is not int for dim in shape):
        raise ValueError(f"a whole record is malformed: output '{name}' has the shape {shape!r}")
    if len(output) != 5 or output[3] != INLINE_KIND or type(output[4]) is not bytes:
        raise ValueError(f"output '{name}' of a whole record is not inline")
    return name, datatype, tuple(shape), memoryview(output[4])


class OneWhole:
    """A whole Result of one success whose record the stub wrote by hand, read straight from
    its message by a frontend worker (:func:`read_one`): what ``messages.decode`` and
    :func:`read_record` make of it, without the Result's views of each record and the copy of
    the record that reading it natively takes. Its response has no parameters and no error."""

    def __init__(
        self,
        batch_id: int,
        compute_ns: tuple[int, int, int],
        stub_ns: tuple[int, int],
        outputs: list[InlineOutput],
    ) -> None:
        self.batch_id = batch_id
        self.compute_ns = compute_ns
        self.stub_ns = stub_ns
        #: Each output ``(name, datatype, shape, bytes)``, its bytes a view of the message.
        self.outputs = outputs


#: The prefix of a Result of one response, read with one call (bound once: a method looked up
#: by name per call otherwise).
_ONE_SIZE: Final = _HEAD_ONE.size
_UNPACK_ONE: Final = _HEAD_ONE.unpack_from


def read_one(payload: bytes) -> OneWhole | None:
    """``payload`` as a :class:`OneWhole` where it is a whole Result of one response the stub
    wrote by hand (nearly every answer to a worker's request); None for any other message,
    which ``messages.decode`` reads (and judges, if malformed)."""
    if len(payload) < _ONE_SIZE or payload[0] != MARK:
        return None
    # Typed: compiled, the fields are then read natively, not through generic calls.
    head: tuple[int, int, int, int, int, int, int, int, int] = _UNPACK_ONE(payload, 0)
    _, count, batch_id, c0, c1, c2, s0, s1, length = head
    if count != 1 or _ONE_SIZE + length != len(payload):
        return None
    outputs = _read_success(payload, _ONE_SIZE, memoryview(payload))
    if outputs is None:
        return None
    return OneWhole(batch_id, (c0, c1, c2), (s0, s1), outputs)


#: The name and datatype of outputs read so far, by their bytes in a record (the fixstr or str8
#: of each): a worker decodes each pair once (forgotten all at once past ``_MOST_NAMES``).
_names: Final[dict[bytes, tuple[str, str]]] = {}


def _read_success(record: bytes, at: int, view: memoryview) -> list[InlineOutput] | None:
    """The outputs of a record :func:`_record` wrote by hand, from ``at`` to the end of
    ``record`` (their bytes: views of ``view``, which views ``record``), or None for any other
    record (MessagePack reads it). ``record`` is bytes: indexed natively, compiled."""
    size = len(record)
    try:
        count = record[at + 1] - 0x90
        if record[at] != 0x93 or count < 0 or count > 15:
            return None
        outputs: list[InlineOutput] = []
        at += 2
        for _ in range(count):
            if record[at] != 0x95:
                return None
            names_end = _text_end(record, _text_end(record, at + 1))
            if names_end < 0:
                return None
            key = record[at + 1 : names_end]
            names = _names.get(key)
            if names is None:
                names = _decoded_names(key)
            name, datatype = names
            at = names_end
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
            outputs.append((name, datatype, tuple(shape), view[start:end]))
            at = end
        if at != size - 2 or record[at] != 0xC0 or record[at + 1] != 0x80:
            return None
        return outputs
    except (IndexError, UnicodeDecodeError):  # malformed: MessagePack says how
        return None


def _text_end(record: bytes, at: int) -> int:
    """Where the fixstr or str8 at ``at`` ends; -1 for anything else (or ``at`` of -1)."""
    if at < 0:
        return -1
    head = record[at]
    if 0xA0 <= head <= 0xBF:
        end = at + 1 + (head - 0xA0)
    elif head == 0xD9:
        end = at + 2 + record[at + 1]
    else:
        return -1
    return end if end <= len(record) else -1


def _decoded_names(key: bytes) -> tuple[str, str]:
    """The name and datatype of ``key`` (two strings :func:`_text_end` found), remembered; not
    UTF-8 is a UnicodeDecodeError."""
    start = 2 if key[0] == 0xD9 else 1
    middle = _text_end(key, 0)
    name = key[start:middle].decode()
    start = middle + (2 if key[middle] == 0xD9 else 1)
    names = (name, key[start:].decode())
    if len(_names) >= _MOST_NAMES:
        _names.clear()
    _names[key] = names
    return names


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
