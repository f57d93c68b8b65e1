"""The response of a completed request, made from its stub's response record."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.core.errors import ErrorCode, ModelError
from shoal.core.types import InferOutput, InferRequest, InferResponse
from shoal.ipc.arena import Block
from shoal.ipc.tensor import CudaLocation, InlineBytes
from shoal.supervisor.requests.client_shm import placed_output
from shoal.supervisor.work import Completion

if TYPE_CHECKING:
    from shoal.supervisor.models.version import ModelVersion


def model_error(error: tuple[str, str]) -> ModelError:
    """The error a model answered with: ``(TritonError code name, message)``."""
    code_name, message = error
    return ModelError(message, ErrorCode.__members__.get(code_name, ErrorCode.INTERNAL))


def response_of(mv: ModelVersion, request: InferRequest, completion: Completion) -> InferResponse:
    """The response to ``request``: views of its outputs in the stub's arena (released with
    the response) or of the bytes the Result carried inline, or the error the model answered
    with."""
    record = completion.response
    if record.error is not None:
        raise model_error(record.error)
    outputs: list[InferOutput] = []
    for o in record.outputs:
        location = o.location
        # One class per test: an isinstance of a tuple is a generic call when compiled.
        if isinstance(location, InlineBytes):
            data = memoryview(location.data)
            outputs.append(InferOutput(o.name, o.datatype, o.shape, data))
        elif isinstance(location, Block):
            view = completion.view(location)
            outputs.append(InferOutput(o.name, o.datatype, o.shape, view, None, location))
        elif isinstance(location, CudaLocation):
            outputs.append(InferOutput(o.name, o.datatype, o.shape, completion.view(location)))
        else:  # the stub wrote it into the client's region: the response carries no data
            nbytes = location.nbytes
            outputs.append(placed_output(o.name, o.datatype, o.shape, request, nbytes))
    return InferResponse(
        model_name=mv.name,
        model_version=mv.version_label,
        id=request.id,
        outputs=outputs,
        parameters=dict(record.parameters),
        _release=completion.release,
    )
