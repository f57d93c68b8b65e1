"""The channel codec: every typed record that crosses a stub's channel, as a MessagePack array
``[kind, *fields]``, and the one place that encodes and decodes them.

The records live by concern: :mod:`shoal.ipc.model_messages` (load, run, answer, finish),
:mod:`shoal.ipc.call_messages` (BLS and control calls), :mod:`shoal.ipc.memory_messages`
(blocks, segments, CUDA chunks and regions) and :mod:`shoal.ipc.records` (the request and
response records batches carry). This module names them all (``from shoal.ipc import messages
as msg``; ``msg.Execute``) so that a dispatcher matches on one vocabulary.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Final

import msgpack

from shoal.ipc.call_messages import (
    BlsCall,
    BlsCancel,
    BlsDone,
    BlsReply,
    ControlCall,
    ControlOp,
    ControlReply,
    MetricUpdate,
)
from shoal.ipc.direct_messages import DirectAttach, DirectChannelAnnounce, DirectDetach
from shoal.ipc.memory_messages import (
    CudaChunkRetired,
    CudaRegionClosed,
    RegionClosed,
    Release,
    SegmentAnnounce,
    SegmentRetired,
    decode_socket,
)
from shoal.ipc.model_messages import (
    Cancel,
    Execute,
    Finalize,
    Finalized,
    Initialize,
    Log,
    Readiness,
    ReadinessCheck,
    Ready,
    Response,
    Result,
    result_from_wire,
)
from shoal.ipc.plain_execute import read_plain
from shoal.ipc.records import (
    RequestRecord,
    ResponseRecord,
)
from shoal.ipc.whole_results import MARK as WHOLE_MARK
from shoal.ipc.whole_results import pack_whole, unpack_whole

__all__ = [
    "BlsCall",
    "BlsCancel",
    "BlsDone",
    "BlsReply",
    "Cancel",
    "ControlCall",
    "ControlOp",
    "ControlReply",
    "CudaChunkRetired",
    "CudaRegionClosed",
    "DirectAttach",
    "DirectChannelAnnounce",
    "DirectDetach",
    "Execute",
    "Finalize",
    "Finalized",
    "Initialize",
    "Kind",
    "Log",
    "Message",
    "MetricUpdate",
    "Readiness",
    "ReadinessCheck",
    "Ready",
    "RegionClosed",
    "Release",
    "RequestRecord",
    "Response",
    "ResponseRecord",
    "Result",
    "SegmentAnnounce",
    "SegmentRetired",
    "decode",
    "decode_socket",
    "encode",
]


class Kind(enum.IntEnum):
    INITIALIZE = 1
    EXECUTE = 2
    RELEASE = 3
    FINALIZE = 4
    BLS_REPLY = 5
    CONTROL_REPLY = 6
    CANCEL = 7
    READY = 11
    RESULT = 12
    LOG = 13
    FINALIZED = 14
    RESPONSE = 15
    BLS_CALL = 16
    BLS_DONE = 17
    CONTROL_CALL = 18
    SEGMENT_RETIRED = 30  # both directions
    CUDA_CHUNK_RETIRED = 31
    CUDA_REGION_CLOSED = 32
    REGION_CLOSED = 33
    BLS_CANCEL = 19
    READINESS_CHECK = 8
    READINESS = 20
    DIRECT_ATTACH = 40
    DIRECT_DETACH = 41


Message = (
    Initialize
    | Execute
    | Release
    | Finalize
    | Ready
    | Result
    | Log
    | Finalized
    | Response
    | BlsCall
    | BlsReply
    | BlsDone
    | BlsCancel
    | ControlCall
    | ControlReply
    | Cancel
    | SegmentRetired
    | CudaChunkRetired
    | CudaRegionClosed
    | RegionClosed
    | ReadinessCheck
    | Readiness
    | DirectAttach
    | DirectDetach
)

#: Each message class's kind. (Not a ClassVar on the dataclasses: mypyc, which compiles this
#: module, would make a ClassVar with a value a dataclass field.)
_KINDS: Final[dict[type, Kind]] = {
    Initialize: Kind.INITIALIZE,
    Execute: Kind.EXECUTE,
    Release: Kind.RELEASE,
    Finalize: Kind.FINALIZE,
    Ready: Kind.READY,
    Result: Kind.RESULT,
    Log: Kind.LOG,
    Finalized: Kind.FINALIZED,
    SegmentRetired: Kind.SEGMENT_RETIRED,
    CudaChunkRetired: Kind.CUDA_CHUNK_RETIRED,
    CudaRegionClosed: Kind.CUDA_REGION_CLOSED,
    RegionClosed: Kind.REGION_CLOSED,
    Response: Kind.RESPONSE,
    BlsCall: Kind.BLS_CALL,
    BlsReply: Kind.BLS_REPLY,
    BlsDone: Kind.BLS_DONE,
    BlsCancel: Kind.BLS_CANCEL,
    Cancel: Kind.CANCEL,
    ControlCall: Kind.CONTROL_CALL,
    ControlReply: Kind.CONTROL_REPLY,
    ReadinessCheck: Kind.READINESS_CHECK,
    Readiness: Kind.READINESS,
    DirectAttach: Kind.DIRECT_ATTACH,
    DirectDetach: Kind.DIRECT_DETACH,
}
_TYPES: Final[dict[int, Any]] = {int(kind): cls for cls, kind in _KINDS.items()}
#: Each message class's kind as a plain int, what the wire carries: ``int(kind)`` of an
#: ``IntEnum`` member is a generic call, once per message sent.
_KIND_NUMBERS: Final[dict[type, int]] = {cls: int(kind) for cls, kind in _KINDS.items()}
_RESULT: Final = int(Kind.RESULT)


#: One packer per thread: ``msgpack.packb`` builds a new ``Packer`` for every call, which cost
#: more than packing a small message. A packer is not thread-safe, and a stub sends from
#: several threads (BLS callers, decoupled response senders).
_packers: Final = threading.local()


#: ``Kind.EXECUTE`` as a plain int, for the one message sent per batch (:func:`encode`).
_EXECUTE: Final[int] = int(Kind.EXECUTE)


def encode(message: Message) -> bytes:
    """Serialize a message for a channel ring."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    if type(message) is Execute:  # one per batch: its array built once, not its fields twice
        requests = message.requests
        for record in requests:
            if record.packed is not None:
                return _spliced(packer, message.batch_id, requests)
        return packer.pack(  # type: ignore[no-any-return]
            [_EXECUTE, message.batch_id, [r.to_wire() for r in requests]]
        )
    if type(message) is Result:  # one per batch: whole where the core may relay its records
        whole = pack_whole(packer, message)
        if whole is not None:
            return whole
    return packer.pack([_KIND_NUMBERS[type(message)], *message.fields()])  # type: ignore[no-any-return]


def _spliced(packer: msgpack.Packer, batch_id: int, requests: list[RequestRecord]) -> bytes:
    """An Execute some of whose records a frontend worker packed: the same bytes as packing
    them all here, with a relayed record's packed head spliced in as it came and only its last
    fields packed here (``RequestRecord.packed``): the key, no output regions (a relayed
    request has no client shared memory), the private inputs and the trace context."""
    count = len(requests)
    header = _ARRAY_HEADERS[count] if count < 16 else b"\xdc" + count.to_bytes(2, "big")
    pieces: list[bytes | memoryview] = [_EXECUTE_START, packer.pack(batch_id), header]
    for record in requests:
        packed = record.packed
        if packed is None:
            pieces.append(packer.pack(record.to_wire()))
            continue
        private = record.private_inputs
        trace = record.trace_context
        pieces.append(packed)
        pieces.append(packer.pack(record.key))
        pieces.append(_NO_REGIONS)
        pieces.append(packer.pack(private) if private else _ZERO)
        pieces.append(packer.pack(trace) if trace else _NO_TEXT)
    return b"".join(pieces)


#: What :func:`_spliced` puts around the records: a three-item array's header and the kind (a
#: positive fixint), an array's header by its length, an empty map, a zero, an empty string.
_EXECUTE_START: Final = bytes((0x93, _EXECUTE))
_ARRAY_HEADERS: Final = tuple(bytes((0x90 | count,)) for count in range(16))
_NO_REGIONS: Final = b"\x80"
_ZERO: Final = b"\x00"
_NO_TEXT: Final = b"\xa0"


def decode(payload: bytes) -> Message:
    """Parse a message received from a channel ring."""
    if payload and payload[0] == WHOLE_MARK:  # a Result's whole form (``whole_results``)
        return unpack_whole(payload)
    if (
        type(payload) is bytes
        and len(payload) > 2
        and payload[1] == _EXECUTE
        and payload[0] == 0x93
    ):
        # Every request's batch, in the stub: the common shape read by hand (``plain_execute``).
        execute = read_plain(payload)
        if execute is not None:
            return execute
    message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if type(message) is list and len(message) == 7 and message[0] == _RESULT:
        # Every request's answer: read in place, with a native call (``cls.from_fields`` of
        # an ``Any`` class is a generic one, and ``*rest`` a list per message).
        return result_from_wire(message, 1)
    if type(message) is list and len(message) == 3 and message[0] == _EXECUTE:
        # Every request's batch, in the stub: its records read in place, natively (as above).
        return Execute(message[1], [RequestRecord.from_wire(r) for r in message[2]])
    kind, *rest = message
    cls = _TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown message kind {kind!r}")
    return cls.from_fields(rest)  # type: ignore[no-any-return]
