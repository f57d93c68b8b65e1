"""The records of direct dispatch, a frontend worker's side: the Execute it writes into a
stub's ring, which requests may go so, and what it reads of a Result.

An Execute of one packed record (``messages._spliced``): the array of three and the kind, the
batch id, a one-record array; the record's head (``packing._head``: its first seven fields), its
key (the batch id again), no output regions, the inputs the model may write (those staged in a
block of the worker's arena), no trace context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from shoal.core.errors import ErrorCode, ModelError
from shoal.core.types import InferOutput, InferRequest, InferResponse
from shoal.frontends.workers.head_bytes import int_bytes
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.tensor import InlineBytes, TensorDesc
from shoal.ipc.whole_results import InlineOutput, OneWhole

#: A stub's answer to a worker's request as the worker reads it: a Result of one response whose
#: record the stub wrote by hand, read at once; any other Result, decoded.
Answer = msg.Result | OneWhole

__all__ = [
    "Answer",
    "direct_fits",
    "execute_payload",
    "model_error",
    "output_blocks",
    "pin_outputs",
    "private_inputs",
    "whole_response",
]

_EXECUTE_START: Final = bytes((0x93, int(msg.Kind.EXECUTE)))
_ONE_RECORD: Final = b"\x91"
_NO_REGIONS: Final = b"\x80"
_NO_TRACE: Final = b"\xa0"
#: The record's end when no input is staged (the common small request), packed once.
_INLINE_END: Final = _NO_REGIONS + b"\x00" + _NO_TRACE


def execute_payload(batch: int, head: bytes, private: int) -> bytes:
    """The Execute of one request (packed: ``head``) as batch ``batch``; ``private``: the
    inputs in a block of their own, as bits (:func:`private_inputs`)."""
    number = int_bytes(batch)  # no Packer made per call, as msgpack.packb makes one
    end = b"".join((_NO_REGIONS, int_bytes(private), _NO_TRACE)) if private else _INLINE_END
    return b"".join((_EXECUTE_START, number, _ONE_RECORD, head, number, end))


def private_inputs(staged: list[Block | None]) -> int:
    """The inputs staged in a block of their own (``RequestRecord.private_inputs``): the model
    may write them, as the core's Executes of such a request say."""
    return sum(1 << index for index, block in enumerate(staged) if block is not None)


def direct_fits(request: InferRequest) -> bool:
    """A packed request direct dispatch may take: no timeout (the core keeps time for those).
    Its inputs are inline or in blocks of the worker's arena, which the stub maps."""
    return not (request.parameters and request.parameters.get("timeout"))


def model_error(error: Any) -> ModelError:
    """The error a model answered with: ``(TritonError code name, message)``."""
    code_name, message = error
    return ModelError(message, ErrorCode.__members__.get(code_name, ErrorCode.INTERNAL))


def output_blocks(result: Answer) -> list[Block]:
    """The output blocks of a decoded Result (a whole one has none)."""
    if type(result) is OneWhole:
        return []
    assert type(result) is msg.Result
    return [
        o.location
        for record in result.responses
        for o in record.outputs
        if isinstance(o.location, Block)
    ]


def whole_response(
    request: InferRequest,
    label: str,
    outputs: list[InlineOutput],
    error: Any,
    parameters: dict[str, Any],
) -> InferResponse:
    """The response to ``request`` (of version ``label``) from a whole record's outputs (every
    one inline, so nothing to release), or the model's error it carries."""
    if error is not None:
        raise model_error(error)
    tensors = [
        InferOutput(name, datatype, shape, data, {}) for name, datatype, shape, data in outputs
    ]
    return InferResponse(request.model_name, label, request.id, tensors, parameters)


def pin_outputs(result: Answer, own_arena: int, read: Callable[[object], memoryview]) -> None:
    """The answer of a stub that exited: its outputs in the stub's arena are copied out now,
    while the worker maps it (an output it cannot read is left to fail when answered)."""
    if type(result) is not msg.Result:
        return
    for record in result.responses:
        for index, output in enumerate(record.outputs):
            location = output.location
            if isinstance(location, Block) and location.arena_id != own_arena:
                try:
                    data = InlineBytes(bytes(read(location)))
                except Exception:
                    continue
                record.outputs[index] = TensorDesc(output.name, output.datatype, output.shape, data)
