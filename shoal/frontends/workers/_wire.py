"""The records between a frontend worker and the core: MessagePack headers, raw tensor bytes.

A frame is ``<u32 header length><header><payload>``: the header is a MessagePack array whose last
element lists the sizes of the tensor payloads that follow it, back to back. Tensor bytes are
never packed into MessagePack (no copy into the packer) and are sliced out of the received frame
as memoryviews (no copy out of it). Large ones are not in the frame at all: an input the worker
placed in its arena travels as ``[segment, offset, nbytes]``, an output the worker reads in
place as ``[arena, segment, offset, nbytes]`` (with a lease the worker releases). One frame
has no MessagePack header: a packed call's, fixed binary fields the core reads with one unpack
(``core/packed.py``).

Core types travel as plain MessagePack values: dataclasses as arrays of their fields (decoded
generically from their type hints), errors as ``[class, code, message, reason, http_message]``.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack
import numpy as np

from shoal.core.packed import MARK as PACKED_MARK
from shoal.core.types import (
    InferInput,
    InferRequest,
    RequestedOutput,
)
from shoal.ipc.arena import Block

#: One packer per thread (as ``shoal.ipc.messages`` keeps): ``msgpack.packb`` builds a new one
#: (and its buffer) per call, and a packer is not thread-safe.
_packers: Final = threading.local()

#: A frame's prefix: the header's length, then the payloads' total length.
_PREFIX: Final = struct.Struct("<II")
PREFIX_SIZE: Final = _PREFIX.size

# Worker -> core (calls) and core -> worker (answers).
CALL: Final = 1
CANCEL: Final = 2
OK: Final = 3
ERROR: Final = 4
ITEM: Final = 5  # one response of a stream
END: Final = 6  # a stream's end
STOP: Final = 7  # core -> worker: stop serving (drain done or shutdown)
FREE: Final = 8  # core -> worker: blocks of the worker's arena given back
RETIRED: Final = 9  # worker -> core: the worker retired an (empty) segment of its arena
#: core -> worker: the log settings now, at the start and on every change (``[LOG_SETTINGS,
#: token, settings]``); worker -> core, applied (``[LOG_APPLIED, token]``: log_broadcast.py).
LOG_SETTINGS: Final = 10
RELEASE: Final = 11  # worker -> core: a response read in place is written: its blocks may go
DROP: Final = 12  # core -> worker: a segment it maps went away (or a whole arena: segment -1)
#: core -> worker: a relayed call the core did not take (``[STALE, id, stale, blocks]``): the
#: worker sends it again the core's own way (and drops its snapshot of the model when stale);
#: the blocks it named are still the worker's.
STALE: Final = 13
#: Direct dispatch (``direct.py``): core -> worker, give these routes back
#: ``[DIRECT_REVOKE, 0, token, slots]``; worker -> core, none of them is in use any more
#: ``[DIRECT_RELEASED, 0, token]``; core -> worker, a stub it sends to died
#: ``[DIRECT_STUB_GONE, 0, pid, error]``; worker -> core, it sends no more on the routes a
#: revocation took (at once) ``[DIRECT_STOPPED, 0, token]``.
DIRECT_REVOKE: Final = 14
DIRECT_RELEASED: Final = 15
#: Unused, reserved: it carried the statistics of requests routed directly, which workers now
#: count in shared memory (``ipc/stat_counters.py``).
DIRECT_STATS: Final = 16
DIRECT_STUB_GONE: Final = 17
DIRECT_STOPPED: Final = 18
LOG_APPLIED: Final = 19
#: Trace timestamps through the link (docs/http.md "Trace settings"): core -> worker, the
#: request of call ``id`` is traced and its frontend's timestamps are due, sent just before its
#: answer (``[TRACED, id, trace_id]``); worker -> core, those timestamps once the response is
#: sent (``[TRACE_STAMPS, 0, trace_id, [[name, ns], ...]]``, empty: none will come).
TRACED: Final = 20
TRACE_STAMPS: Final = 21

#: An input whose data is a NumPy array (JSON inputs): dtype and shape travel with the bytes.
_ARRAY: Final = 1
#: A NumPy object array (JSON BYTES): its items travel in the header.
_OBJECTS: Final = 2
_RAW: Final = 0
#: Raw bytes the worker placed in its own arena: ``[segment, offset, nbytes]`` travel instead.
_PLACED: Final = 3

#: Copies a raw input into the worker's arena; None: send it inline.
Place = Callable[[memoryview], Block | None]
#: The core's side of that: the block a call names and a view of its bytes.
Lend = Callable[[int, int, int], tuple[Block, memoryview]]


def frame(
    header: list[Any], payloads: Sequence[memoryview | bytes] = ()
) -> list[bytes | memoryview]:
    """The pieces of one frame, for ``writelines`` (or joined, for ``write``)."""
    sizes = [_nbytes(p) for p in payloads]
    header.append(sizes)
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer()
    try:
        packed: bytes = packer.pack(header)
    except UnicodeEncodeError:
        # Names, ids and parameters are the client's strings: a lone surrogate that JSON let
        # in must cross as it is, so the core answers as without workers (400, not a 500).
        # Only then: the error handler halves the packer's speed on every string.
        packed = msgpack.packb(header, unicode_errors="surrogatepass")
    return [_PREFIX.pack(len(packed), sum(sizes)), packed, *payloads]


def _nbytes(payload: memoryview | bytes) -> int:
    # No memoryview made per payload to read its size: of a memoryview (an output's view), or
    # of the bytes a stub sent inline (a relayed answer's outputs).
    if isinstance(payload, memoryview):
        return payload.nbytes
    if type(payload) is bytes:
        return len(payload)
    return memoryview(payload).nbytes


def prefix(data: bytes | bytearray | memoryview, at: int = 0) -> tuple[int, int]:
    """(header length, payload length) of the frame starting at ``at``."""
    header, payload = _PREFIX.unpack_from(data, at)
    return int(header), int(payload)


def split(
    packed: bytes | memoryview, payload: bytes | bytearray | memoryview
) -> tuple[list[Any], list[memoryview]]:
    """Header fields (the sizes removed) and the payload views."""
    # (arrays as lists: unpackb's default, one keyword fewer to parse per frame)
    try:
        header: list[Any] = msgpack.unpackb(packed)
    except UnicodeDecodeError:  # a lone surrogate of the client's (see ``frame``)
        header = msgpack.unpackb(packed, unicode_errors="surrogatepass")
    sizes: list[int] = header.pop()
    views: list[memoryview] = []
    if sizes:  # a frame's payload is a view of the received bytes already: no view of it again
        whole = payload if isinstance(payload, memoryview) else memoryview(payload)
        at = 0
        for size in sizes:
            views.append(whole[at : at + size])
            at += size
    return header, views


OnFrame = Callable[[list[Any], list[memoryview]], None]
#: A packed call's frame (``core/packed.py``): the received bytes, where its header starts, where
#: its payload (the packed head) starts and where the frame stops.
OnPacked = Callable[[memoryview, int, int, int], None]


class FrameReader(asyncio.Protocol):
    """Cuts a stream into frames and hands each to ``on_frame`` as it completes; ``on_lost``
    when the stream ends. Frames that arrive whole are sliced out of the received bytes; a frame
    that arrives in pieces is copied once, into a buffer of its exact size. A packed call's
    frame, whose header is not MessagePack, goes to ``on_packed`` undecoded."""

    def __init__(
        self, on_frame: OnFrame, on_lost: Callable[[], None], on_packed: OnPacked | None = None
    ) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._on_packed = on_packed
        #: Fewer bytes than a prefix, left over from the last read.
        self._head = b""
        #: The frame being filled, and how much of it has arrived.
        self._frame: bytearray | None = None
        self._filled = 0
        self.transport: asyncio.Transport | None = None
        #: Set while the transport holds more than its high-water mark of bytes to send.
        self._paused: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        if self._paused is None:
            self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        paused, self._paused = self._paused, None
        if paused is not None and not paused.done():
            paused.set_result(None)

    async def writable(self) -> None:
        """Returns once the transport is under its high-water mark (or closed)."""
        if self._paused is not None:
            await asyncio.shield(self._paused)  # shared: one waiter's cancel is not the others'

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        view = memoryview(data)
        frame = self._frame
        if frame is not None:
            take = min(len(view), len(frame) - self._filled)
            frame[self._filled : self._filled + take] = view[:take]
            self._filled += take
            if self._filled < len(frame):
                return
            self._frame = None
            whole = memoryview(frame)
            header_size, _ = _PREFIX.unpack_from(whole, 0)
            self._emit(whole, PREFIX_SIZE, PREFIX_SIZE + header_size, len(frame))
            view = view[take:]
        at, end = 0, len(view)
        while end - at >= PREFIX_SIZE:
            header_size, payload_size = _PREFIX.unpack_from(view, at)
            stop = at + PREFIX_SIZE + header_size + payload_size
            if stop > end:
                self._frame = bytearray(stop - at)
                self._frame[: end - at] = view[at:end]
                self._filled = end - at
                return
            start = at + PREFIX_SIZE
            self._emit(view, start, start + header_size, stop)
            at = stop
        if at < end:
            self._head = bytes(view[at:end])

    def _emit(self, view: memoryview, start: int, payload: int, stop: int) -> None:
        """The frame whose header is ``view[start:payload]`` and payload ``[payload:stop]``."""
        on_packed = self._on_packed
        if on_packed is not None and payload > start and view[start] == PACKED_MARK:
            on_packed(view, start, payload, stop)
            return
        fields, payloads = split(view[start:payload], view[payload:stop])
        self._on_frame(fields, payloads)

    def connection_lost(self, exc: Exception | None) -> None:
        self.resume_writing()
        self._on_lost()


class Outbox:
    """Frames queued during one turn of the event loop leave in one ``writelines``: under load,
    one system call carries many frames."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        self._pieces: list[bytes | memoryview] = []

    def put(self, pieces: list[bytes | memoryview], *, copy: bool) -> None:
        """Queue one frame's pieces; ``copy`` when they are views of memory that the caller
        frees once this returns (a response's output blocks)."""
        if not self._pieces:
            self._loop.call_soon(self._flush)
        if copy:
            self._pieces.append(b"".join(pieces))
        else:
            self._pieces.extend(pieces)

    async def writable(self) -> None:
        """Returns once the transport takes more: for a sender that could outrun the reader
        (a stream's answers) and fill the transport's buffer without bound."""
        protocol = self.transport.get_protocol()
        if isinstance(protocol, FrameReader):
            await protocol.writable()

    def _flush(self) -> None:
        pieces, self._pieces = self._pieces, []
        if not self.transport.is_closing():
            self.transport.writelines(pieces)


# --- requests -------------------------------------------------------------------------------


def request_to_wire(
    request: InferRequest, payloads: list[memoryview | bytes], place: Place | None = None
) -> list[Any]:
    """The request's fields; its tensors' bytes go to ``payloads``, or to the worker's arena
    through ``place`` (large raw tensors)."""
    inputs = []
    for tensor in request.inputs:
        data = tensor.data
        if isinstance(data, np.ndarray):
            if data.dtype == object:
                inputs.append(
                    [
                        tensor.name,
                        tensor.datatype,
                        list(tensor.shape),
                        tensor.parameters,
                        _OBJECTS,
                        [list(data.shape), data.ravel().tolist()],
                    ]
                )
                continue
            array = np.ascontiguousarray(data)
            # (memoryview cannot cast a view with a zero in its shape: an empty tensor)
            payloads.append(memoryview(array.data).cast("B") if array.size else memoryview(b""))
            inputs.append(
                [
                    tensor.name,
                    tensor.datatype,
                    list(tensor.shape),
                    tensor.parameters,
                    _ARRAY,
                    [list(array.shape), array.dtype.str],
                ]
            )
        else:
            view = memoryview(data)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            block = None if place is None else place(view)
            if block is not None:
                where = [block.segment, block.offset, block.nbytes]
                inputs.append(
                    [
                        tensor.name,
                        tensor.datatype,
                        list(tensor.shape),
                        tensor.parameters,
                        _PLACED,
                        where,
                    ]
                )
                continue
            payloads.append(view)
            inputs.append(
                [tensor.name, tensor.datatype, list(tensor.shape), tensor.parameters, _RAW, None]
            )
    outputs = [[o.name, o.parameters] for o in request.outputs]
    return [
        request.model_name,
        request.model_version,
        request.id,
        inputs,
        outputs,
        request.parameters,
        request.trace_id,  # -1: the worker's frontend will send its timestamps if traced
    ]


def request_from_wire(
    fields: Sequence[Any], payloads: list[memoryview], lend: Lend | None = None
) -> InferRequest:
    """The request a worker sent; inputs it placed in its arena come through ``lend``."""
    model_name, model_version, request_id, inputs, outputs, parameters, trace_id = fields
    tensors = []
    at = 0
    for name, datatype, shape, params, kind, extra in inputs:
        data: memoryview | np.ndarray
        if kind == _PLACED:
            if lend is None:
                raise ValueError(f"input '{name}' lies in a worker arena the core does not know")
            block, data = lend(*extra)
            tensors.append(InferInput(name, datatype, tuple(shape), data, params, block))
            continue
        if kind == _OBJECTS:
            array_shape, items = extra
            data = np.empty(len(items), dtype=object)
            data[:] = items
            data = data.reshape(array_shape)
        elif kind == _ARRAY:
            array_shape, dtype = extra
            data = np.frombuffer(payloads[at], dtype=np.dtype(dtype)).reshape(array_shape)
            at += 1
        else:
            data = payloads[at]
            at += 1
        tensors.append(InferInput(name, datatype, tuple(shape), data, params))
    request = InferRequest(
        model_name,
        model_version,
        request_id,
        tensors,
        [RequestedOutput(name, params) for name, params in outputs],
        parameters,
    )
    if trace_id < 0:  # never a positive id: the core gives those (TraceSettings.hold)
        request.trace_id = -1
    return request


def stamps_from_wire(stamps: Any) -> list[tuple[str, int]]:
    """The ``[name, ns]`` pairs of a ``TRACE_STAMPS`` frame that are one: the trace file
    writes the names as they are, so only names that need no escaping."""
    given: list[tuple[str, int]] = []
    if isinstance(stamps, list):
        for stamp in stamps:
            if isinstance(stamp, list) and len(stamp) == 2:
                name, ns = stamp
                if isinstance(name, str) and name.isidentifier() and isinstance(ns, int):
                    given.append((name, ns))
    return given
