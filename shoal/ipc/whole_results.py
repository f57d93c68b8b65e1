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

Every other Result (an error, an output in a block, a CUDA or client-region output, a
rescheduled request, an unexecuted or decoupled batch) stays MessagePack: the stub chooses
per batch (:func:`pack_whole`), and ``messages.decode`` tells the two apart by the first byte.
"""

from __future__ import annotations

import struct
from typing import Final

import msgpack

from shoal.ipc.model_messages import Result
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import InlineBytes

#: The first byte of a whole Result (MessagePack never writes 0xC1).
MARK: Final = 0xC1
_HEAD: Final = struct.Struct("<BxxxIqqqqqq")
HEAD_SIZE: Final = _HEAD.size
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
    records = [packer.pack(response.to_wire()) for response in result.responses]
    count = len(records)
    compute, stub = result.compute_ns, result.stub_ns
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
    lengths: tuple[int, ...] = _lengths_of(count).unpack_from(payload, HEAD_SIZE)
    for length in lengths:
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
