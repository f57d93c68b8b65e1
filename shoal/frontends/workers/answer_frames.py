"""The core's answer frames to a worker: from a response, or relayed from the stub's record.

:func:`send_response` sends an ``InferResponse`` (a stream's items, and the requests whose
response the core makes itself). :func:`send_record` is the relay (issue 25), straight from the
record's tensor descriptors: no ``InferOutput`` or ``InferResponse`` is made, the bytes a stub
sent inline go into the frame as they are, and an output block is described (the worker reads
it in place) or viewed once for the frame's copy. Its answer is the response the core would
have made from the record, in a frame of its own (``_response_wire.relayed_from_wire``
decodes it into that response): what every answer of a model version repeats (model, version,
output names and datatypes, :func:`layout`) goes packed once, as bytes, and only the request's
own part (id, shapes, where its blocks lie, parameters) is packed per answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import msgpack

from shoal.core.types import InferResponse
from shoal.frontends.workers import _response_wire as response_wire
from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers._plain import error_to_wire
from shoal.frontends.workers.outputs import LentOutputs
from shoal.ipc.arena import Block
from shoal.ipc.records import ResponseRecord
from shoal.ipc.tensor import CudaLocation, InlineBytes, TensorDesc

__all__ = [
    "DescribeBlock",
    "RelaySink",
    "Relayed",
    "Send",
    "head",
    "layout",
    "record_to_wire",
    "send_record",
    "send_response",
]

#: Queues one frame (header, payloads) to the worker, its bytes copied.
Send = Callable[[list[Any], Sequence[memoryview | bytes]], None]

#: ``[arena, segment, offset, nbytes]`` of an output block the worker may read in place (its
#: segment's fd sent first), or None: its bytes go in the frame.
DescribeBlock = Callable[[Block], list[int] | None]


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


class _Layout:
    """What every relayed answer of one model version with these outputs repeats: model,
    version, output names and datatypes, packed once."""

    def __init__(self, version: str, names: list[str], datatypes: list[str], packed: bytes) -> None:
        self.version = version
        self.names = names
        self.datatypes = datatypes
        self.packed = packed

    def fits(self, version: str, outputs: list[TensorDesc]) -> bool:
        """Whether ``outputs`` of ``version`` have this layout's names and datatypes."""
        names = self.names
        if version != self.version or len(outputs) != len(names):
            return False
        datatypes = self.datatypes
        for i, output in enumerate(outputs):
            if output.name != names[i] or output.datatype != datatypes[i]:
                return False
        return True


#: The latest layout of each model's relayed answers (one per model: a model whose outputs
#: change from request to request packs its layout again, which is correct, only slower).
_layouts: Final[dict[str, _Layout]] = {}
#: Forgotten all at once past this many models.
_MOST_LAYOUTS: Final = 1024


def layout(model: str, version: str, outputs: list[TensorDesc]) -> bytes:
    """The packed constant part of a relayed answer (``_response_wire.layout_of`` reads it back)."""
    known = _layouts.get(model)
    if known is None or not known.fits(version, outputs):
        if len(_layouts) >= _MOST_LAYOUTS:
            _layouts.clear()
        known = _layouts[model] = _new_layout(model, version, outputs)
    return known.packed


def _new_layout(model: str, version: str, outputs: list[TensorDesc]) -> _Layout:
    names = [output.name for output in outputs]
    datatypes = [output.datatype for output in outputs]
    # (surrogatepass: names are the repository's and the model's strings, sent as they are)
    packed = msgpack.packb([model, version, names, datatypes], unicode_errors="surrogatepass")
    return _Layout(version, names, datatypes, packed)


def record_to_wire(
    model: str,
    version: str,
    request_id: str,
    completion: Relayed,
    payloads: list[memoryview | bytes],
    describe: DescribeBlock | None = None,
) -> list[Any]:
    """The relayed answer's fields (``_response_wire.relayed_from_wire``): its layout, then
    what is the request's own; the lease 0 (the caller sets it when ``describe`` gave a block, which
    ``wheres`` then lists); output bytes go to ``payloads``."""
    outputs = completion.response.outputs
    shapes = []
    wheres: list[list[int] | None] | None = None
    for i, output in enumerate(outputs):
        location = output.location
        if type(location) is InlineBytes:
            payloads.append(location.data)
        elif type(location) is Block:
            where = None if describe is None else describe(location)
            if where is None:
                payloads.append(completion.view(location))
            else:
                if wheres is None:
                    wheres = [None] * len(outputs)
                wheres[i] = where
        elif type(location) is CudaLocation:
            payloads.append(completion.view(location))
        else:  # the core relays no request whose outputs go to a client's region
            raise ValueError(f"output '{output.name}' has no bytes to relay")
        shapes.append(output.shape)
    # (layout, id, shapes, wheres, parameters, lease)
    packed = layout(model, version, outputs)
    return [packed, request_id, shapes, wheres, completion.response.parameters, 0]


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
    whole = done.response.whole
    if whole is not None:
        try:
            _send_whole(send, call_id, answer, whole)
        finally:
            done.release()  # (the record's bytes were copied into the frame)
        return
    out: list[memoryview | bytes] = []
    lease = 0
    try:
        describe = None if outputs is None else outputs.describe_block
        fields = record_to_wire(answer[0], answer[1], answer[2], done, out, describe)
        if outputs is not None and fields[3] is not None:
            lease = fields[-1] = outputs.hold(done)
        send([wire.OK, call_id, *fields], out)
    except Exception as failure:  # every failure is the caller's answer
        send([wire.ERROR, call_id, error_to_wire(failure)], ())
    finally:
        if not lease:
            done.release()


def _send_whole(send: Send, call_id: int, answer: tuple[str, str, str], whole: memoryview) -> None:
    """Answer call ``call_id`` with the stub's record as it came (a whole Result's, every
    output inline: ``ipc/whole_results.py``): ``[OK, id, head, request id]``, the record the one
    payload (``_response_wire.whole_from_wire`` decodes it)."""
    try:
        send([wire.OK, call_id, head(answer[0], answer[1]), answer[2]], (whole,))
    except Exception as failure:  # every failure is the caller's answer
        send([wire.ERROR, call_id, error_to_wire(failure)], ())


#: The packed ``[model, version]`` of each model's undecoded answers (its latest version).
_heads: Final[dict[str, tuple[str, bytes]]] = {}


def head(model: str, version: str) -> bytes:
    """``[model, version]`` packed once per model version: a whole answer's constant part."""
    known = _heads.get(model)
    if known is None or known[0] != version:
        if len(_heads) >= _MOST_LAYOUTS:
            _heads.clear()
        packed = msgpack.packb([model, version], unicode_errors="surrogatepass")
        known = _heads[model] = (version, packed)
    return known[1]


def send_response(
    send: Send, outputs: LentOutputs | None, kind: int, call_id: int, response: InferResponse
) -> None:
    """Send a response: large outputs by block when the worker can map them (the response is
    held until it releases them), the rest inline (released once copied)."""
    out: list[memoryview | bytes] = []
    lease = 0
    try:
        if outputs is None:
            fields = response_wire.response_to_wire(response, out)
        else:
            fields = response_wire.response_to_wire(response, out, outputs.describe)
            if len(out) < len(response.outputs):
                lease = fields[-1] = outputs.hold(response)
        send([kind, call_id, *fields], out)
    finally:
        if not lease:
            response.release()
