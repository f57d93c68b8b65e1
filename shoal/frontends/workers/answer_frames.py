"""The core's answer frames to a worker: from a response, or relayed from the stub's record.

:func:`send_response` sends an ``InferResponse`` (a stream's items, and the requests whose
response the core makes itself). :func:`send_record` is the relay (issue 25): its
:func:`record_to_wire` writes the same fields as ``_wire.response_to_wire`` of the response the
core would have made from the record (so the worker decodes it unchanged), straight from the
record's tensor descriptors: no ``InferOutput`` or ``InferResponse`` is made, the bytes a stub
sent inline go into the frame as they are, and an output block is described (the worker reads
it in place) or viewed once for the frame's copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shoal.core.types import InferResponse
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers._plain import error_to_wire
from shoal.frontends.workers.outputs import LentOutputs
from shoal.ipc.arena import Block
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import CudaLocation, InlineBytes

__all__ = [
    "DescribeBlock",
    "RelaySink",
    "Relayed",
    "Send",
    "record_to_wire",
    "send_record",
    "send_response",
]

#: Queues one frame (header, payloads) to the worker, its bytes copied.
Send = Callable[[list[Any], Sequence[memoryview | bytes]], None]

#: ``[arena, segment, offset, nbytes]`` of an output block the worker may read in place (its
#: segment's fd sent first), or None: its bytes go in the frame.
DescribeBlock = Callable[[Block], list[int] | None]

#: An output relayed carries no parameters, as the response made from the record had none.
_NO_PARAMETERS: dict[str, Any] = {}


class Relayed(Protocol):
    """A completed request as the core relays it (the core's ``Completion``)."""

    @property
    def response(self) -> ResponseRecord:
        """The stub's response record."""
        ...

    def view(self, block: Block | CudaLocation) -> memoryview:
        """A read-only view of one output block (a host copy of a GPU one)."""
        ...

    def release(self) -> None:
        """Give back every block the completion owns."""
        ...


class RelaySink(Protocol):
    """Takes a relayed completion: the worker link's reply to one call."""

    def relay(self, model: str, version: str, completion: Relayed) -> None: ...


def record_to_wire(
    model: str,
    version: str,
    request_id: str,
    completion: Relayed,
    payloads: list[memoryview | bytes],
    describe: DescribeBlock | None = None,
) -> list[Any]:
    """The answer's fields, as ``response_to_wire`` writes them, the lease 0 (the caller sets
    it when ``describe`` gave a block); output bytes go to ``payloads``."""
    outputs = []
    for output in completion.response.outputs:
        location = output.location
        where = None
        if type(location) is InlineBytes:
            payloads.append(location.data)
        elif type(location) is Block:
            where = None if describe is None else describe(location)
            if where is None:
                payloads.append(completion.view(location))
        elif type(location) is CudaLocation:
            payloads.append(completion.view(location))
        else:  # the core relays no request whose outputs go to a client's region
            raise ValueError(f"output '{output.name}' has no bytes to relay")
        outputs.append([output.name, output.datatype, output.shape, _NO_PARAMETERS, where])
    # (model, version, id, outputs, parameters, final, error, lease)
    return [model, version, request_id, outputs, completion.response.parameters, True, None, 0]


def send_record(
    send: Send,
    outputs: LentOutputs | None,
    call_id: int,
    answer: tuple[str, str, str],
    done: Relayed,
) -> None:
    """Answer call ``call_id`` (``answer``: model, version, request id) from the stub's record:
    large output blocks by description when the worker maps them (``done`` is held until it
    releases them), the rest in the frame (``done`` released once copied)."""
    out: list[memoryview | bytes] = []
    lease = 0
    try:
        describe = None if outputs is None else outputs.describe_block
        fields = record_to_wire(answer[0], answer[1], answer[2], done, out, describe)
        if outputs is not None and len(out) < len(fields[3]):
            lease = fields[-1] = outputs.hold(done)
        send([wire.OK, call_id, *fields], out)
    except Exception as failure:  # every failure is the caller's answer
        send([wire.ERROR, call_id, error_to_wire(failure)], ())
    finally:
        if not lease:
            done.release()


def send_response(
    send: Send, outputs: LentOutputs | None, kind: int, call_id: int, response: InferResponse
) -> None:
    """Send a response: large outputs by block when the worker can map them (the response is
    held until it releases them), the rest inline (released once copied)."""
    out: list[memoryview | bytes] = []
    lease = 0
    try:
        if outputs is None:
            fields = wire.response_to_wire(response, out)
        else:
            fields = wire.response_to_wire(response, out, outputs.describe)
            if len(out) < len(response.outputs):
                lease = fields[-1] = outputs.hold(response)
        send([kind, call_id, *fields], out)
    finally:
        if not lease:
            response.release()
