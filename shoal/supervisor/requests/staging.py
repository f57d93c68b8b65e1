"""Check a request against its model's configuration and stage its inputs in the input arena.

This is the one place where client tensors are copied: from the request body into shared memory.
Messages follow Triton's wording, which clients and tests match on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shoal.config import ModelConfig
from shoal.core.errors import InvalidArgument, ResourceExhausted
from shoal.core.packed import model_shape
from shoal.core.types import InferInput, InferRequest
from shoal.ipc.arena import ArenaExhausted, Block, OwnedArena
from shoal.ipc.dtypes import BytesFormatError, byte_size, deserialize_bytes, element_count
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import (
    INLINE_TENSOR_MAX,
    CudaRegionLocation,
    InlineBytes,
    RegionLocation,
    TensorDesc,
    numpy_to_buffer_size,
    write_numpy,
)
from shoal.supervisor.requests import classification
from shoal.supervisor.requests.summary import InputRule, ModelSummary


def classes_asked(request: InferRequest, config: ModelConfig) -> dict[str, int]:
    """:func:`classification.requested`, called only when an output names the parameter: its
    module is interpreted, and almost no request asks (this runs on every request)."""
    for output in request.outputs:
        if output.parameters and classification.PARAMETER in output.parameters:
            return classification.requested(request, config)
    return {}


def dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def _shape_matches(expected: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    # A loop over the tuples, not all() of a generator over zip(): compiled, no object is made
    if len(expected) != len(actual):
        return False
    for i in range(len(expected)):
        wanted = expected[i]
        if wanted != -1 and wanted != actual[i]:
            return False
    return True


def _check_text(model: ModelSummary, request: InferRequest) -> None:
    """Strings cross to the stub as UTF-8: a lone surrogate (JSON's escaped DC00) cannot. The
    id first, then the parameters' names, then their string values: the first bad one is named.
    """
    _check_utf8(model, request.id)
    parameters = request.parameters
    if parameters:
        for name in parameters:
            _check_utf8(model, name)
        for value in parameters.values():
            if isinstance(value, str):
                _check_utf8(model, value)


def _check_utf8(model: ModelSummary, text: str) -> None:
    if text.isascii():  # a flag of the string: no encoding per request for nearly all
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            f"a request for model '{model.name}' holds a string that is not valid UTF-8 "
            f"(a lone surrogate) in its id or parameters: {text!r}"
        ) from None


def check_inputs(model: ModelSummary, request: InferRequest) -> None:
    """Names, datatypes, shapes and batch size of every input, in Triton's order and words.

    Like Triton, the messages about the request's own tensors begin with ``[request id: <id>]``
    (``<id_unknown>`` without one); an unknown input name does not.
    """
    _check_text(model, request)
    rules = model.inputs
    required = model.required
    count = len(request.inputs)
    if count < len(required) or count > len(rules):
        raise missing_inputs(model, request.id, [t.name for t in request.inputs])
    seen: set[str] = set()
    for tensor in request.inputs:
        rule = rules.get(tensor.name)
        if rule is None:
            raise InvalidArgument(
                f"unexpected inference input '{tensor.name}' for model '{model.name}'"
            )
        if tensor.name in seen:
            raise InvalidArgument(
                f"input '{tensor.name}' is given more than once in the request for model "
                f"'{model.name}'"
            )
        seen.add(tensor.name)
        if tensor.datatype != rule.datatype:
            raise request_error(
                request,
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                f"'{model.name}' expects '{rule.datatype}'",
            )
        _check_shape(model, rule, tensor, request)
    if len(seen) < len(rules) and any(name not in seen for name in required):
        raise missing_inputs(model, request.id, [t.name for t in request.inputs])


def request_error(request: InferRequest, text: str) -> InvalidArgument:
    """An InvalidArgument about ``request``'s tensors, prefixed with its id as Triton does."""
    return InvalidArgument(f"[request id: {request.id or '<id_unknown>'}] {text}")


def _names_text(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def missing_inputs(model: ModelSummary, request_id: str, given: list[str]) -> InvalidArgument:
    """Triton's words for a request to ``model`` that gives the inputs named ``given``."""
    required = model.required
    missing = [name for name in required if name not in given]
    expected = f"{len(required)} inputs"
    if len(required) < len(model.inputs):  # Triton words it so where some inputs are optional
        expected = f"number of inputs between {len(required)} and {len(model.inputs)}"
    text = f"expected {expected} but got {len(given)} inputs for model '{model.name}'. "
    text += f"Got input(s) {_names_text(given)}, "
    if missing:
        text += (
            f"but missing required input(s) {_names_text(missing)}. "
            "Please provide all required input(s)."
        )
    else:  # too many: say which (Triton prints an empty list of missing inputs)
        unknown = [name for name in given if name not in model.inputs]
        if unknown:
            text += f"but the model has no input(s) {_names_text(unknown)}."
        else:
            twice = sorted({name for name in given if given.count(name) > 1})
            text += f"and input(s) {_names_text(twice)} more than once."
    return InvalidArgument(f"[request id: {request_id or '<id_unknown>'}] {text}")


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
    model: ModelSummary, rule: InputRule, tensor: InferInput, request: InferRequest
) -> None:
    actual = tuple(tensor.shape)
    _check_dims(model, tensor, actual, request)
    expected = rule.expected
    note = ""
    if model.max_batch_size > 0:
        note = _BATCH_NOTE
        if not actual:
            raise request_error(
                request,
                f"input '{tensor.name}' has no shape but model requires batch dimension for "
                f"'{model.name}'",
            )
        if actual[0] > model.max_batch_size:
            raise request_error(
                request,
                f"inference request batch-size must be <= {model.max_batch_size} for "
                f"'{model.name}'",
            )
    if not _shape_matches(expected, actual):
        raise request_error(
            request,
            f"unexpected shape for input '{tensor.name}' for model '{model.name}'. Expected "
            f"{dims_text(expected)}, got {dims_text(actual)}. {note}",
        )


def _check_dims(
    model: ModelSummary, tensor: InferInput, actual: tuple[int, ...], request: InferRequest
) -> None:
    """No negative dimension, and no more elements than NumPy can shape (zeros ignored)."""
    count = 1
    for dim in actual:
        if dim < 0:
            raise request_error(
                request,
                f"input '{tensor.name}' for model '{model.name}' has a negative dimension in "
                f"its shape {dims_text(actual)}",
            )
        if dim:
            count *= dim
    if count > MAX_ELEMENTS:
        raise request_error(
            request,
            f"input '{tensor.name}' for model '{model.name}' has an impossible shape "
            f"{dims_text(actual)}: its dimensions multiply past {MAX_ELEMENTS}",
        )


def check_outputs(model: ModelSummary, request: InferRequest) -> list[str]:
    """The output names the model must produce (all of them when the client named none)."""
    if not request.outputs:
        return list(model.outputs)
    asked: list[str] = []
    for name in (output.name for output in request.outputs):
        if name in asked:  # Triton's check and words (AddRequestedOutput)
            raise request_error(request, f"output '{name}' already exists in request")
        if name not in model.output_names:
            raise InvalidArgument(f"unexpected inference output '{name}' for model '{model.name}'")
        asked.append(name)
    return asked


def _model_shape(model: ModelSummary, rule: InputRule, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the model sees (a worker stages it the same: ``packing._model_shape``)."""
    reshape = rule.reshape
    if reshape is None:
        return shape
    return model_shape(shape, reshape, rule.reshape_sources, model.max_batch_size > 0)


def _payload_size(model: ModelSummary, tensor: InferInput, region: object = None) -> int:
    """Validated size in bytes of the tensor's V2 serialized payload (in ``region`` when the
    input is in a client's region, whose bytes the supervisor does not read)."""
    if region is not None and (
        type(region) is CudaRegionLocation or type(region) is RegionLocation
    ):
        expected = byte_size(tensor.datatype, tensor.shape)
        if region.nbytes != expected:
            raise _size_mismatch(model, tensor, expected, region.nbytes)
        return region.nbytes
    data = tensor.data
    # The frontends' bodies and frames are sliced (views) or copied (bytes): their size is read
    # without a view made, or NumPy's type looked up in its module, for every request.
    if isinstance(data, memoryview):
        actual = data.nbytes
    elif isinstance(data, bytes):
        actual = len(data)
    elif isinstance(data, np.ndarray):
        return _array_size(model, tensor, data)
    else:  # another buffer (a bytearray): its bytes
        actual = memoryview(data).nbytes
    expected = byte_size(tensor.datatype, tensor.shape)
    if expected is None:
        try:
            deserialize_bytes(data, element_count(tensor.shape))
        except BytesFormatError as error:
            raise InvalidArgument(
                f"input '{tensor.name}' for model '{model.name}': malformed BYTES data: {error}"
            ) from None
        return actual
    if actual != expected:
        raise _size_mismatch(model, tensor, expected, actual)
    return actual


def _array_size(model: ModelSummary, tensor: InferInput, data: np.ndarray) -> int:
    """The serialized size of an input given as an array (JSON's, an in-process caller's)."""
    if tensor.datatype == "BYTES" and data.size != element_count(tensor.shape):
        raise InvalidArgument(
            f"input '{tensor.name}' for model '{model.name}' has {data.size} "
            f"elements, expected {element_count(tensor.shape)} for shape "
            f"{dims_text(tensor.shape)}"
        )
    return numpy_to_buffer_size(data, tensor.datatype)


def _size_mismatch(
    model: ModelSummary, tensor: InferInput, expected: int | None, actual: int
) -> InvalidArgument:
    return InvalidArgument(
        f"input byte size mismatch for input '{tensor.name}' for model '{model.name}'. "
        f"Expected {expected}, got {actual}"
    )


def _inline(tensor: InferInput) -> InlineBytes:
    """The tensor's bytes, copied once, to travel inside the Execute."""
    data = tensor.data
    if type(data) is bytes:
        return InlineBytes(data)  # (immutable: no copy needed)
    if isinstance(data, np.ndarray):
        staged = bytearray(numpy_to_buffer_size(data, tensor.datatype))
        write_numpy(data, tensor.datatype, memoryview(staged))
        return InlineBytes(bytes(staged))
    return InlineBytes(bytes(data))


def _write(tensor: InferInput, dest: memoryview) -> None:
    data = tensor.data
    if isinstance(data, np.ndarray):
        write_numpy(data, tensor.datatype, dest)
        return
    try:  # bytes, or a view of bytes: copied as they are, with no view made of them first
        dest[:] = data
    except (TypeError, ValueError):  # a view of another format or shape: its bytes
        dest[:] = memoryview(data).cast("B")


def stage_request(
    model: ModelSummary,
    request: InferRequest,
    arena: OwnedArena,
    outputs: list[str],
    regions: Mapping[str, RegionLocation | CudaRegionLocation] | None = None,
) -> tuple[RequestRecord, list[Block]]:
    """Copy every input into ``arena``, except those in a client's shared-memory region
    (``regions``), which the stub reads in place, and small ones, whose bytes travel inside the
    Execute (up to the model's ``inline_budget``); the caller owns the returned blocks."""
    rules = model.inputs
    room = model.inline_budget
    if regions:
        sizes = [_payload_size(model, t, regions.get(t.name)) for t in request.inputs]
    else:
        sizes = [_payload_size(model, t) for t in request.inputs]
    blocks: list[Block] = []
    descs: list[TensorDesc] = []
    private = 0
    try:
        for index, tensor in enumerate(request.inputs):  # (compiled: no tuple per input)
            size = sizes[index]
            shape = _model_shape(model, rules[tensor.name], tuple(tensor.shape))
            in_region = regions.get(tensor.name) if regions else None
            if in_region is not None:
                descs.append(TensorDesc(tensor.name, tensor.datatype, shape, in_region))
                continue
            block = tensor.placed
            if block is None and size <= INLINE_TENSOR_MAX and size <= room:
                room -= size
                descs.append(TensorDesc(tensor.name, tensor.datatype, shape, _inline(tensor)))
                continue
            if block is None:
                block = arena.allocate(size)
                _write(tensor, arena.view(block))
            else:  # a worker placed it: the caller owns it from now on, with the others
                tensor.placed = None
            blocks.append(block)
            private |= 1 << len(descs)  # this request's own copy: the model may write it
            descs.append(TensorDesc(tensor.name, tensor.datatype, shape, block))
    except ArenaExhausted as error:
        _give_back(request, descs, blocks, arena)
        raise ResourceExhausted(
            f"cannot stage the inputs of a request for model '{model.name}': {error}"
        ) from None
    params = dict(request.parameters)
    if params:
        record = RequestRecord(
            request.id,
            _correlation_id(params),
            _sequence_flags(params),
            params,
            outputs,
            descs,
            int(params.get("timeout", 0) or 0),
            private_inputs=private,
        )
    else:  # most requests: no sequence, no flags, no timeout to look up
        record = RequestRecord(request.id, 0, 0, params, outputs, descs, private_inputs=private)
    return record, blocks


def inline_bytes(inputs: list[TensorDesc]) -> int:
    """How many bytes the inputs carry inline."""
    total = 0
    for desc in inputs:
        if type(desc.location) is InlineBytes:
            total += desc.location.nbytes
    return total


def spill_inline(inputs: list[TensorDesc], arena: OwnedArena) -> list[Block]:
    """Move the inline inputs into ``arena`` (in place in ``inputs``). For inputs that came
    inline for another model (an ensemble step's from earlier steps' outputs, a BLS call's
    from its caller) and pass the ``inline_budget`` of the model they go to: a batch of them
    must fit its stub's ring. Returns the blocks, which the request's work owns."""
    blocks: list[Block] = []
    try:
        for index, desc in enumerate(inputs):
            location = desc.location
            if type(location) is InlineBytes:
                block = arena.allocate(location.nbytes)
                blocks.append(block)
                arena.view(block)[:] = location.data
                inputs[index] = TensorDesc(desc.name, desc.datatype, desc.shape, block)
    except ArenaExhausted as error:
        for block in blocks:
            arena.free(block)
        raise ResourceExhausted(f"cannot stage the inputs of a request: {error}") from None
    return blocks


def _give_back(
    request: InferRequest, descs: list[TensorDesc], blocks: list[Block], arena: OwnedArena
) -> None:
    """Undo a staging that failed: free the blocks it allocated, and hand the blocks a worker
    placed back to the request (whose maker gives them back). ``descs`` are the inputs staged
    before the failure, in order: those in a block are the ones ``blocks`` belong to."""
    staged = [t for t, d in zip(request.inputs, descs, strict=False) if type(d.location) is Block]
    for tensor, block in zip(staged, blocks, strict=True):
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


def batch_size(model: ModelSummary, request: InferRequest) -> int:
    """Inferences in a request: the first dimension for a batching model, else 1."""
    shape = request.inputs[0].shape if request.inputs else ()
    return int(shape[0]) if model.max_batch_size > 0 and shape else 1


def batch_of(max_batch_size: int, shapes: Sequence[Sequence[int]]) -> int:
    """Inferences in a request whose inputs have ``shapes`` (client, ensemble or BLS request)."""
    if max_batch_size > 0 and shapes and shapes[0]:
        return int(shapes[0][0])
    return 1
