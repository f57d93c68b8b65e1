"""Typed records that cross a stub's channel, as MessagePack arrays ``[kind, *fields]``.

Down (supervisor → stub): :class:`Initialize`, :class:`Execute`, :class:`Release`,
:class:`Finalize`.
Up (stub → supervisor): :class:`Ready`, :class:`Result`, :class:`Log`, :class:`Finalized`,
:class:`BlsCall`, :class:`BlsDone`, :class:`BlsCancel`.

Tensors travel as :class:`~shoal.ipc.tensor.TensorDesc` wire lists, never as bytes. File
descriptors of new arena segments travel beside the channel on the instance's Unix socket
(:class:`SegmentAnnounce` is the payload sent with the fd), and so do the IPC handles of CUDA
pool chunks (:class:`~shoal.ipc.cuda.CudaChunkAnnounce`, no fd): a stub reads the socket when a
descriptor names a segment or chunk it does not know yet.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any

import msgpack

from shoal.ipc.arena import Block
from shoal.ipc.cuda import CudaChunkAnnounce
from shoal.ipc.tensor import (
    CudaRegionLocation,
    RegionLocation,
    TensorDesc,
    location_from_wire,
    location_to_wire,
)


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
    BLS_CANCEL = 19
    READINESS_CHECK = 8
    READINESS = 20


@dataclass(slots=True)
class Initialize:
    """Load the model and call ``initialize(args)``; ``args`` holds Triton's seven keys."""

    args: dict[str, str]
    model_file: str  # absolute path of model.py
    output_arena_id: int
    output_arena: tuple[int, int, int]  # initial, growth and limit bytes
    #: A Python-based backend's ``model.py`` (``<backend-directory>/<backend>/model.py``), which
    #: the stub runs instead of ``model_file``; "" when the model is its own ``model.py``.
    runtime_file: str = ""

    def fields(self) -> list[Any]:
        return [
            self.args,
            self.model_file,
            self.output_arena_id,
            list(self.output_arena),
            self.runtime_file,
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Initialize:
        return cls(f[0], f[1], f[2], tuple(f[3]), f[4])


@dataclass(slots=True)
class RequestRecord:
    """One request of a batch, as the stub rebuilds it into a ``pb_utils.InferenceRequest``."""

    request_id: str
    correlation_id: int | str
    flags: int
    parameters: dict[str, Any]
    requested_outputs: list[str]
    inputs: list[TensorDesc]
    timeout_us: int = 0
    #: Identifies the request to its stub across messages (decoupled responses).
    key: int = 0
    #: Outputs the stub writes straight into a client's shared-memory region (system or
    #: CUDA), by name.
    output_regions: dict[str, RegionLocation | CudaRegionLocation] = field(default_factory=dict)
    #: Bit ``i`` set: input ``i`` lies in a block staged for this request alone, which the
    #: model may write in place; any other input is made writable by a private mapping.
    private_inputs: int = 0
    #: The request's trace context (``request.trace().get_context()``); "" when not traced.
    trace_context: str = ""

    def to_wire(self) -> list[Any]:
        return [
            self.request_id,
            self.correlation_id,
            self.flags,
            self.parameters,
            self.requested_outputs,
            [t.to_wire() for t in self.inputs],
            self.timeout_us,
            self.key,
            {name: location_to_wire(r) for name, r in self.output_regions.items()},
            self.private_inputs,
            self.trace_context,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> RequestRecord:
        inputs = [TensorDesc.from_wire(t) for t in w[5]]
        regions = {name: _region_from_wire(r) for name, r in w[8].items()}
        return cls(w[0], w[1], w[2], w[3], w[4], inputs, w[6], w[7], regions, w[9], w[10])


def _region_from_wire(obj: list[Any]) -> RegionLocation | CudaRegionLocation:
    location = location_from_wire(obj)
    if not isinstance(location, RegionLocation | CudaRegionLocation):
        raise ValueError(f"an output region must be a client's region, got {obj!r}")
    return location


@dataclass(slots=True)
class Execute:
    """Run ``execute`` on a batch of requests; answered by one :class:`Result`."""

    batch_id: int
    requests: list[RequestRecord]

    def fields(self) -> list[Any]:
        return [self.batch_id, [r.to_wire() for r in self.requests]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Execute:
        return cls(f[0], [RequestRecord.from_wire(r) for r in f[1]])


@dataclass(slots=True)
class Release:
    """The supervisor is done with these output blocks: the stub's arena may reuse them."""

    blocks: list[Block]

    def fields(self) -> list[Any]:
        return [[b.to_wire() for b in self.blocks]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Release:
        return cls([Block.from_wire(b) for b in f[0]])


@dataclass(slots=True)
class Finalize:
    """Call ``finalize()`` and exit."""

    def fields(self) -> list[Any]:
        return []

    @classmethod
    def from_fields(cls, f: list[Any]) -> Finalize:
        return cls()


@dataclass(slots=True)
class Ready:
    """``initialize`` finished; when it failed, ``error`` says why in one line (for clients)
    and ``traceback`` holds the model's traceback (for the log)."""

    error: str | None = None
    #: ``execute`` is a coroutine: several batches may be in the stub at once.
    concurrent: bool = False
    #: The model defines ``is_ready()``: model readiness asks it (``ReadinessCheck``).
    user_ready: bool = False
    traceback: str = ""

    def fields(self) -> list[Any]:
        return [self.error, self.concurrent, self.user_ready, self.traceback]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Ready:
        return cls(f[0], f[1], f[2], f[3])


@dataclass(slots=True)
class ReadinessCheck:
    """Run the model's ``is_ready()`` (Triton's user-defined model readiness)."""

    def fields(self) -> list[Any]:
        return []

    @classmethod
    def from_fields(cls, f: list[Any]) -> ReadinessCheck:
        return cls()


@dataclass(slots=True)
class Readiness:
    """What ``is_ready()`` said: ``ready``, or ``error`` (it raised or returned no bool)."""

    ready: bool
    error: str | None = None

    def fields(self) -> list[Any]:
        return [self.ready, self.error]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Readiness:
        return cls(f[0], f[1])


@dataclass(slots=True)
class ResponseRecord:
    """The answer to one request: outputs, or an error with a TritonError code name."""

    outputs: list[TensorDesc] = field(default_factory=list)
    error: tuple[str, str] | None = None  # (code name, message)
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> list[Any]:
        return [[t.to_wire() for t in self.outputs], self.error, self.parameters]

    @classmethod
    def from_wire(cls, w: list[Any]) -> ResponseRecord:
        error = None if w[1] is None else (w[1][0], w[1][1])
        return cls([TensorDesc.from_wire(t) for t in w[0]], error, w[2])


@dataclass(slots=True)
class Result:
    """Responses to an :class:`Execute`, one per request in order."""

    batch_id: int
    responses: list[ResponseRecord]
    #: Time spent in the model's execute (ns), for statistics.
    compute_ns: tuple[int, int, int] = (0, 0, 0)  # input, infer, output
    #: Positions in the batch of the requests the model released with
    #: ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: they run again, and have no response here.
    rescheduled: list[int] = field(default_factory=list)
    #: False when execute was not called: every request was cancelled before it started.
    executed: bool = True
    #: When the stub began and finished the batch (CLOCK_MONOTONIC ns, the supervisor's clock
    #: too): the supervisor derives the IPC legs of a request from them (--trace-overhead).
    stub_ns: tuple[int, int] = (0, 0)

    def fields(self) -> list[Any]:
        return [
            self.batch_id,
            [r.to_wire() for r in self.responses],
            list(self.compute_ns),
            self.rescheduled,
            self.executed,
            list(self.stub_ns),
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Result:
        responses = [ResponseRecord.from_wire(r) for r in f[1]]
        stub_ns = (int(f[5][0]), int(f[5][1]))
        return cls(f[0], responses, tuple(f[2]), list(f[3]), bool(f[4]), stub_ns)


@dataclass(slots=True)
class Log:
    """A ``pb_utils.Logger`` record: level (0 info, 1 warning, 2 error, 3 verbose)."""

    level: int
    message: str
    filename: str = ""
    line: int = 0

    def fields(self) -> list[Any]:
        return [self.level, self.message, self.filename, self.line]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Log:
        return cls(f[0], f[1], f[2], f[3])


@dataclass(slots=True)
class Finalized:
    """``finalize()`` returned (or raised: ``error``); the stub exits next."""

    error: str | None = None

    def fields(self) -> list[Any]:
        return [self.error]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Finalized:
        return cls(f[0])


@dataclass(slots=True)
class SegmentAnnounce:
    """Sent on the Unix socket together with one segment fd (not through the rings)."""

    arena_id: int
    segment: int
    size: int

    def encode(self) -> bytes:
        return msgpack.packb([self.arena_id, self.segment, self.size])  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, payload: bytes) -> SegmentAnnounce:
        a, s, n = msgpack.unpackb(payload)
        return cls(a, s, n)


@dataclass(slots=True)
class SegmentRetired:
    """The owner of arena ``arena_id`` retired segment ``segment`` (it held no block): unmap it.

    Up: a stub retired one of its output segments. Down: the supervisor retired an input
    segment, or passes on a stub's retirement to the other stubs it gave that segment to. Ids
    are never reused, so the message can never name a newer segment.
    """

    arena_id: int
    segment: int

    def fields(self) -> list[Any]:
        return [self.arena_id, self.segment]

    @classmethod
    def from_fields(cls, f: list[Any]) -> SegmentRetired:
        return cls(f[0], f[1])


@dataclass(slots=True)
class CudaChunkRetired:
    """The supervisor gave chunk ``chunk`` of device ``device``'s CUDA pool back (it held no
    block): close its IPC handle. Chunk ids are never reused."""

    device: int
    chunk: int

    def fields(self) -> list[Any]:
        return [self.device, self.chunk]

    @classmethod
    def from_fields(cls, f: list[Any]) -> CudaChunkRetired:
        return cls(f[0], f[1])


@dataclass(slots=True)
class CudaRegionClosed:
    """A client unregistered the CUDA region of allocation ``handle`` on ``device``: a stub
    that opened it closes it, so that the client's freed memory is not kept alive."""

    device: int
    handle: bytes

    def fields(self) -> list[Any]:
        return [self.device, self.handle]

    @classmethod
    def from_fields(cls, f: list[Any]) -> CudaRegionClosed:
        return cls(f[0], f[1])


def decode_socket(payload: bytes) -> SegmentAnnounce | CudaChunkAnnounce:
    """What came on a stub's Unix socket: a segment (with its fd) or a CUDA pool chunk (its
    IPC handle inside the payload, no fd)."""
    fields = msgpack.unpackb(payload)
    if len(fields) == 3:
        return SegmentAnnounce(*fields)
    return CudaChunkAnnounce.from_wire(fields)


@dataclass(slots=True)
class Response:
    """A decoupled model's response to request ``key`` (``final`` closes the request)."""

    key: int
    response: ResponseRecord | None
    final: bool

    def fields(self) -> list[Any]:
        return [self.key, None if self.response is None else self.response.to_wire(), self.final]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Response:
        response = None if f[1] is None else ResponseRecord.from_wire(f[1])
        return cls(f[0], response, f[2])


@dataclass(slots=True)
class BlsCall:
    """A model's ``InferenceRequest.exec()``: run ``request`` on another model."""

    call_id: int
    model_name: str
    model_version: int
    request: RequestRecord
    decoupled: bool

    def fields(self) -> list[Any]:
        return [
            self.call_id,
            self.model_name,
            self.model_version,
            self.request.to_wire(),
            self.decoupled,
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsCall:
        return cls(f[0], f[1], f[2], RequestRecord.from_wire(f[3]), f[4])


@dataclass(slots=True)
class BlsReply:
    """One response to a :class:`BlsCall` (``final`` ends it; a non-decoupled call has one)."""

    call_id: int
    response: ResponseRecord | None
    final: bool

    def fields(self) -> list[Any]:
        return [
            self.call_id,
            None if self.response is None else self.response.to_wire(),
            self.final,
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsReply:
        response = None if f[1] is None else ResponseRecord.from_wire(f[1])
        return cls(f[0], response, f[2])


@dataclass(slots=True)
class BlsDone:
    """The model dropped the responses of a BLS call: their blocks may be released."""

    call_id: int

    def fields(self) -> list[Any]:
        return [self.call_id]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsDone:
        return cls(f[0])


@dataclass(slots=True)
class BlsCancel:
    """Cancel a BLS call: ``ResponseIterator.cancel()``, or the caller's request was cancelled."""

    call_id: int

    def fields(self) -> list[Any]:
        return [self.call_id]

    @classmethod
    def from_fields(cls, f: list[Any]) -> BlsCancel:
        return cls(f[0])


@dataclass(slots=True)
class Cancel:
    """The clients of these requests went away: ``is_cancelled()`` turns true for them."""

    keys: list[int]

    def fields(self) -> list[Any]:
        return [self.keys]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Cancel:
        return cls(list(f[0]))


class ControlOp(enum.IntEnum):
    """What a model asks of the server besides inference (model control, custom metrics)."""

    LOAD_MODEL = 1  # args: [name, config json, {file key: bytes}]
    UNLOAD_MODEL = 2  # args: [name, unload_dependents]
    IS_MODEL_READY = 3  # args: [name, version (-1: latest)]
    NEW_FAMILY = 10  # args: [family id, name, description, kind]
    NEW_METRIC = 11  # args: [metric id, family id, {label: value}, buckets | None]
    UPDATE_METRIC = 12  # args: [metric id, MetricUpdate, value] (no reply)
    METRIC_VALUE = 13  # args: [metric id]
    DELETE_METRIC = 14  # args: [metric id] (no reply)
    DELETE_FAMILY = 15  # args: [family id] (no reply)
    CUDA_ALLOCATE = 20  # args: [device, nbytes] -> [device, offset, nbytes] of a pool block
    CUDA_FREE = 21  # args: [[device, offset, nbytes], ...] blocks the stub will not hand on


class MetricUpdate(enum.IntEnum):
    INCREMENT = 1
    SET = 2
    OBSERVE = 3


@dataclass(slots=True)
class ControlCall:
    """A model's request to the server; ``call_id`` 0 wants no reply."""

    call_id: int
    op: ControlOp
    args: list[Any]

    def fields(self) -> list[Any]:
        return [self.call_id, int(self.op), self.args]

    @classmethod
    def from_fields(cls, f: list[Any]) -> ControlCall:
        return cls(f[0], ControlOp(f[1]), f[2])


@dataclass(slots=True)
class ControlReply:
    """The answer to a :class:`ControlCall`: a value, or the error text."""

    call_id: int
    error: str | None
    value: Any = None

    def fields(self) -> list[Any]:
        return [self.call_id, self.error, self.value]

    @classmethod
    def from_fields(cls, f: list[Any]) -> ControlReply:
        return cls(f[0], f[1], f[2])


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
    | ReadinessCheck
    | Readiness
)

#: Each message class's kind. (Not a ClassVar on the dataclasses: mypyc, which compiles this
#: module, would make a ClassVar with a value a dataclass field.)
_KINDS: dict[type, Kind] = {
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
}
_TYPES: dict[int, Any] = {int(kind): cls for cls, kind in _KINDS.items()}


#: One packer per thread: ``msgpack.packb`` builds a new ``Packer`` for every call, which cost
#: more than packing a small message. A packer is not thread-safe, and a stub sends from
#: several threads (BLS callers, decoupled response senders).
_packers = threading.local()


def encode(message: Message) -> bytes:
    """Serialize a message for a channel ring."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack([int(_KINDS[type(message)]), *message.fields()])  # type: ignore[no-any-return]


def decode(payload: bytes) -> Message:
    """Parse a message received from a channel ring."""
    kind, *rest = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    cls = _TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown message kind {kind!r}")
    return cls.from_fields(rest)  # type: ignore[no-any-return]
