"""Check a request against its model's configuration and stage its inputs in the input arena.

This is the one place where client tensors are copied: from the request body into shared memory.
Messages follow Triton's wording, which clients and tests match on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shoal.config import ModelConfig, TensorConfig
from shoal.core.errors import InvalidArgument, ResourceExhausted
from shoal.core.types import InferInput, InferRequest
from shoal.ipc.arena import ArenaExhausted, Block, OwnedArena
from shoal.ipc.dtypes import BytesFormatError, byte_size, deserialize_bytes, element_count
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import (
    CudaRegionLocation,
    RegionLocation,
    TensorDesc,
    numpy_to_buffer_size,
    write_numpy,
)
from shoal.supervisor.requests import classification


def classes_asked(request: InferRequest, config: ModelConfig) -> dict[str, int]:
    """:func:`classification.requested`, called only when an output names the parameter: its
    module is interpreted, and almost no request asks (this runs on every request)."""
    for output in request.outputs:
        if output.parameters and classification.PARAMETER in output.parameters:
            return classification.requested(request, config)
    return {}


def dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def _shape_matches(expected: Sequence[int], actual: Sequence[int]) -> bool:
    return len(expected) == len(actual) and all(
        e == -1 or e == a for e, a in zip(expected, actual, strict=True)
    )


def _check_text(config: ModelConfig, request: InferRequest) -> None:
    """Strings cross to the stub as UTF-8: a lone surrogate (JSON's escaped DC00) cannot."""
    texts = [request.id, *request.parameters]
    texts += [v for v in request.parameters.values() if isinstance(v, str)]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"a request for model '{config.name}' holds a string that is not valid UTF-8 "
                f"(a lone surrogate) in its id or parameters: {text!r}"
            ) from None


def check_inputs(config: ModelConfig, request: InferRequest) -> None:
    """Names, datatypes, shapes and batch size of every input, in Triton's order and words.

    Like Triton, the messages about the request's own tensors begin with ``[request id: <id>]``
    (``<id_unknown>`` without one); an unknown input name does not.
    """
    _check_text(config, request)
    model = config.name
    by_name = {t.name: t for t in config.inputs}
    required = [t.name for t in config.inputs if not t.optional]
    count = len(request.inputs)
    if count < len(required) or count > len(by_name):
        raise _missing_inputs(config, request, required)
    seen: set[str] = set()
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{model}'")
        if tensor.name in seen:
            raise InvalidArgument(
                f"input '{tensor.name}' is given more than once in the request for model '{model}'"
            )
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise request_error(
                request,
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                f"'{model}' expects '{spec.datatype}'",
            )
        _check_shape(config, spec, tensor, request)
    if any(name not in seen for name in required):
        raise _missing_inputs(config, request, required)


def request_error(request: InferRequest, text: str) -> InvalidArgument:
    """An InvalidArgument about ``request``'s tensors, prefixed with its id as Triton does."""
    return InvalidArgument(f"[request id: {request.id or '<id_unknown>'}] {text}")


def _names_text(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _missing_inputs(
    config: ModelConfig, request: InferRequest, required: list[str]
) -> InvalidArgument:
    given = [t.name for t in request.inputs]
    missing = [name for name in required if name not in given]
    text = (
        f"expected {len(required)} inputs but got {len(given)} inputs for model "
        f"'{config.name}'. Got input(s) {_names_text(given)}, "
    )
    if missing:
        text += (
            f"but missing required input(s) {_names_text(missing)}. "
            "Please provide all required input(s)."
        )
    else:  # too many: say which (Triton prints an empty list of missing inputs)
        known = {t.name for t in config.inputs}
        unknown = [name for name in given if name not in known]
        if unknown:
            text += f"but the model has no input(s) {_names_text(unknown)}."
        else:
            twice = sorted({name for name in given if given.count(name) > 1})
            text += f"and input(s) {_names_text(twice)} more than once."
    return request_error(request, text)


#: No tensor may have more elements than this, even ignoring zero dimensions (NumPy cannot
#: shape an array whose dimensions multiply past 2**63, even an empty one).
MAX_ELEMENTS = 1 << 48

#: What Triton appends to a shape error of a model with a batch dimension.
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _check_shape(
    config: ModelConfig, spec: TensorConfig, tensor: InferInput, request: InferRequest
) -> None:
    model = config.name
    if any(d < 0 for d in tensor.shape):
        raise request_error(
            request,
            f"input '{tensor.name}' for model '{model}' has a negative dimension in its shape "
            f"{dims_text(tensor.shape)}",
        )
    if element_count([d for d in tensor.shape if d]) > MAX_ELEMENTS:
        raise request_error(
            request,
            f"input '{tensor.name}' for model '{model}' has an impossible shape "
            f"{dims_text(tensor.shape)}: its dimensions multiply past {MAX_ELEMENTS}",
        )
    expected = tuple(spec.dims)
    actual = tuple(tensor.shape)
    note = ""
    if config.max_batch_size > 0:
        expected = (-1, *expected)
        note = _BATCH_NOTE
        if not actual:
            raise request_error(
                request,
                f"input '{tensor.name}' has no shape but model requires batch dimension for "
                f"'{model}'",
            )
        if actual[0] > config.max_batch_size:
            raise request_error(
                request,
                f"inference request batch-size must be <= {config.max_batch_size} for '{model}'",
            )
    if not _shape_matches(expected, actual):
        raise request_error(
            request,
            f"unexpected shape for input '{tensor.name}' for model '{model}'. Expected "
            f"{dims_text(expected)}, got {dims_text(actual)}. {note}",
        )


def check_outputs(config: ModelConfig, request: InferRequest) -> list[str]:
    """The output names the model must produce (all of them when the client named none)."""
    names = {t.name for t in config.outputs}
    for output in request.outputs:
        if output.name not in names:
            raise InvalidArgument(
                f"unexpected inference output '{output.name}' for model '{config.name}'"
            )
    if request.outputs:
        return [o.name for o in request.outputs]
    return [t.name for t in config.outputs]


def _model_shape(
    config: ModelConfig, spec: TensorConfig, shape: tuple[int, ...]
) -> tuple[int, ...]:
    reshape = getattr(spec, "reshape", None)
    if reshape is None:
        return shape
    if config.max_batch_size > 0:
        return (shape[0], *reshape)
    return tuple(reshape)


def _payload_size(config: ModelConfig, tensor: InferInput, region: object = None) -> int:
    """Validated size in bytes of the tensor's V2 serialized payload (in ``region`` when the
    input is in a client's region, whose bytes the supervisor does not read)."""
    if region is not None and (
        type(region) is CudaRegionLocation or type(region) is RegionLocation
    ):
        expected = byte_size(tensor.datatype, tensor.shape)
        if region.nbytes != expected:
            raise _size_mismatch(config, tensor, expected, region.nbytes)
        return region.nbytes
    if isinstance(tensor.data, np.ndarray):
        if tensor.datatype == "BYTES" and tensor.data.size != element_count(tensor.shape):
            raise InvalidArgument(
                f"input '{tensor.name}' for model '{config.name}' has {tensor.data.size} "
                f"elements, expected {element_count(tensor.shape)} for shape "
                f"{dims_text(tensor.shape)}"
            )
        return numpy_to_buffer_size(tensor.data, tensor.datatype)
    actual = memoryview(tensor.data).nbytes
    expected = byte_size(tensor.datatype, tensor.shape)
    if expected is None:
        try:
            deserialize_bytes(tensor.data, element_count(tensor.shape))
        except BytesFormatError as error:
            raise InvalidArgument(
                f"input '{tensor.name}' for model '{config.name}': malformed BYTES data: {error}"
            ) from None
        return actual
    if actual != expected:
        raise _size_mismatch(config, tensor, expected, actual)
    return actual


def _size_mismatch(
    config: ModelConfig, tensor: InferInput, expected: int | None, actual: int
) -> InvalidArgument:
    return InvalidArgument(
        f"input byte size mismatch for input '{tensor.name}' for model '{config.name}'. "
        f"Expected {expected}, got {actual}"
    )


def _write(tensor: InferInput, dest: memoryview) -> None:
    if isinstance(tensor.data, np.ndarray):
        write_numpy(tensor.data, tensor.datatype, dest)
    else:
        dest[:] = memoryview(tensor.data).cast("B")


def stage_request(
    config: ModelConfig,
    request: InferRequest,
    arena: OwnedArena,
    outputs: list[str],
    regions: Mapping[str, RegionLocation | CudaRegionLocation] | None = None,
) -> tuple[RequestRecord, list[Block]]:
    """Copy every input into ``arena``, except those in a client's shared-memory region
    (``regions``), which the stub reads in place; the caller owns the returned blocks."""
    specs = {t.name: t for t in config.inputs}
    if regions:
        sizes = [_payload_size(config, t, regions.get(t.name)) for t in request.inputs]
    else:
        sizes = [_payload_size(config, t) for t in request.inputs]
    blocks: list[Block] = []
    descs: list[TensorDesc] = []
    private = 0
    try:
        for tensor, size in zip(request.inputs, sizes, strict=True):
            shape = _model_shape(config, specs[tensor.name], tuple(tensor.shape))
            in_region = (regions or {}).get(tensor.name)
            if in_region is not None:
                descs.append(TensorDesc(tensor.name, tensor.datatype, shape, in_region))
                continue
            block = tensor.placed
            if block is None:
                block = arena.allocate(size)
                _write(tensor, arena.view(block))
            else:  # a worker placed it: the caller owns it from now on, with the others
                tensor.placed = None
            blocks.append(block)
            private |= 1 << len(descs)  # this request's own copy: the model may write it
            descs.append(TensorDesc(tensor.name, tensor.datatype, shape, block))
    except ArenaExhausted as error:
        _give_back(request, regions, blocks, arena)
        raise ResourceExhausted(
            f"cannot stage the inputs of a request for model '{config.name}': {error}"
        ) from None
    params = dict(request.parameters)
    record = RequestRecord(
        request_id=request.id,
        correlation_id=_correlation_id(params),
        flags=_sequence_flags(params),
        parameters=params,
        requested_outputs=outputs,
        inputs=descs,
        timeout_us=int(params.get("timeout", 0) or 0),
        private_inputs=private,
    )
    return record, blocks


def _give_back(
    request: InferRequest,
    regions: Mapping[str, RegionLocation | CudaRegionLocation] | None,
    blocks: list[Block],
    arena: OwnedArena,
) -> None:
    """Undo a staging that failed: free the blocks it allocated, and hand the blocks a worker
    placed back to the request (whose maker gives them back)."""
    staged = [t for t in request.inputs if t.name not in (regions or {})]
    for tensor, block in zip(staged, blocks, strict=False):
        if block.arena_id == arena.arena_id:
            arena.free(block)
        else:
            tensor.placed = block


def _correlation_id(params: dict[str, Any]) -> int | str:
    """``sequence_id``: an unsigned integer or a string (0 and "" mean none)."""
    value = params.get("sequence_id", 0)
    return value if isinstance(value, int | str) and not isinstance(value, bool) else 0


#: TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and _END.
FLAG_SEQUENCE_START = 1
FLAG_SEQUENCE_END = 2


def _sequence_flags(params: dict[str, Any]) -> int:
    """Request flags from the ``sequence_start`` and ``sequence_end`` parameters."""
    flags = FLAG_SEQUENCE_START if params.get("sequence_start") is True else 0
    return flags | (FLAG_SEQUENCE_END if params.get("sequence_end") is True else 0)


def batch_size(config: ModelConfig, request: InferRequest) -> int:
    """Inferences in a request: the first dimension for a batching model, else 1."""
    return batch_of(config, [tuple(t.shape) for t in request.inputs])


def batch_of(config: ModelConfig, shapes: Sequence[Sequence[int]]) -> int:
    """Inferences in a request whose inputs have ``shapes`` (client, ensemble or BLS request)."""
    if config.max_batch_size > 0 and shapes and shapes[0]:
        return int(shapes[0][0])
    return 1
