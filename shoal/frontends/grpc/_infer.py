"""``ModelInferRequest`` bytes -> :class:`InferRequest`, :class:`InferResponse` -> response bytes.

Inputs take their data from one of three places, as in Triton: the input's shared-memory region
(``shared_memory_region`` parameter: no data here, the core reads the region), the request's
``raw_input_contents`` (one entry per input not in shared memory, in input order; zero-copy views
of the received message, checked like the HTTP frontend's binary inputs), or the input's typed
``contents`` (see :mod:`shoal.frontends.grpc._tensors`). A request uses raw contents or typed
contents, never both.

Responses carry every output's bytes in ``raw_output_contents``, as Triton's do; an output written
to the client's shared memory gets an empty entry, which keeps entries and outputs aligned by
index (tritonclient reads the entry at the output's position).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, NoReturn

import numpy as np
from google.protobuf.message import DecodeError

from shoal.core import (
    DATATYPES,
    InferInput,
    InferRequest,
    InferResponse,
    InvalidArgument,
    ParamValue,
    RequestedOutput,
)
from shoal.frontends._binary import check_binary_input
from shoal.frontends._output_bytes import output_bytes
from shoal.frontends.grpc._params import (
    FINAL_RESPONSE,
    decode_input_parameters,
    decode_output_parameters,
    decode_request_parameters,
    encode_parameters,
)
from shoal.frontends.grpc._plain_request import (
    CheckedInput,
    PlainRequest,
    PlainShape,
    known_shape,
    read_plain,
    read_plain_message,
    remember_shape,
    split_fields,
)
from shoal.frontends.grpc._reply import plain_reply
from shoal.frontends.grpc._tensors import array_from_contents
from shoal.frontends.grpc._wire import Chunk, embedded_chunks, raw_field_chunks, split_raw_contents
from shoal.frontends.grpc.native_split import SplitRequest
from shoal.protos import grpc_service_pb2 as pb

# Final: compiled, each is then a C static, not a look-up in the module's dict at every use.
_RAW_INPUT_CONTENTS: Final = pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER
_RAW_OUTPUT_CONTENTS: Final = pb.ModelInferResponse.RAW_OUTPUT_CONTENTS_FIELD_NUMBER
_INFER_RESPONSE: Final = pb.ModelStreamInferResponse.INFER_RESPONSE_FIELD_NUMBER
_SHM_REGION: Final = "shared_memory_region"
_NO_DATA: Final = memoryview(b"")
_InputTensor = pb.ModelInferRequest.InferInputTensor
_DATATYPES: Final = frozenset(DATATYPES)
_NO_OUTPUTS: Final[frozenset[str]] = frozenset()


class DecodedInfer:
    """The core's request plus what only the frontend needs to render the response. A plain
    class, not a dataclass: compiled, a dataclass's constructor with defaults cost ~1,500
    instructions per request, this one a few dozen."""

    __slots__ = ("final_response_flag", "request", "shared_memory_outputs")

    def __init__(
        self,
        request: InferRequest,
        shared_memory_outputs: frozenset[str] = _NO_OUTPUTS,
        final_response_flag: bool = False,
    ) -> None:
        self.request = request
        #: Requested outputs the core writes to the client's shared memory.
        self.shared_memory_outputs = shared_memory_outputs
        #: The client asked for ``triton_final_response`` on the (stream) response.
        self.final_response_flag = final_response_flag


def decode_infer_request(data: bytes | bytearray | memoryview | SplitRequest) -> DecodedInfer:
    """Decode a serialized ``ModelInferRequest``, or one received in parts. A plain request
    is read without protobuf (:mod:`~shoal.frontends.grpc._plain_request`), a small one
    whole, in one walk."""
    if not isinstance(data, SplitRequest):  # a split one is large
        split = split_fields(data)
        if split is not None:
            fields, entries = split
            shape = known_shape(fields)
            if shape is not None:  # a repeat: its fields were read and checked already
                return _shaped(shape, entries)
            plain = read_plain(fields)
            if plain is not None:
                decoded = _plain_decoded(plain, entries)
                remember_shape(fields, _shape_of(plain, decoded.request.inputs))
                return decoded
        else:
            walked = read_plain_message(data)
            if walked is not None:
                return _plain_decoded(walked[0], walked[1])
    wire = data.rest if isinstance(data, SplitRequest) else data
    header, raw = split_raw_contents(wire, _RAW_INPUT_CONTENTS)
    plain = read_plain(header)
    if plain is not None:
        return _plain_decoded(plain, data.entries(raw) if isinstance(data, SplitRequest) else raw)
    message, raw = _parse_request(data, header, raw)
    parameters, final_flag = decode_request_parameters(message.parameters)
    outputs = [
        RequestedOutput(output.name, decode_output_parameters(output.name, output.parameters))
        for output in message.outputs
    ]
    request = InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=_inputs(message, raw),
        outputs=outputs,
        parameters=parameters,
    )
    shared = frozenset(o.name for o in outputs if _SHM_REGION in o.parameters)
    return DecodedInfer(request, shared, final_flag)


def _parse_request(
    data: bytes | bytearray | memoryview | SplitRequest,
    header: bytes | bytearray | memoryview,
    raw: list[memoryview],
) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """The message without its raw input contents (``header``), and those as views of
    ``data`` (of the blocks they were received into, for a :class:`SplitRequest`)."""
    try:
        # upb parses any buffer, so a view of the received bytes needs no copy first.
        message = pb.ModelInferRequest.FromString(header)  # type: ignore[arg-type]
    except DecodeError as exc:
        raise InvalidArgument(f"failed to parse the request message: {exc}") from None
    if not raw and message.raw_input_contents:  # a message too long to walk: parsed whole
        raw = [memoryview(entry) for entry in message.raw_input_contents]
    if isinstance(data, SplitRequest):
        raw = data.entries(raw)
    return message, raw


def _plain_decoded(plain: PlainRequest, raw: list[memoryview]) -> DecodedInfer:
    """A plain request for the core: checked as :func:`_inputs` checks inputs with neither
    parameters nor typed contents."""
    model = plain.model_name
    inputs: list[InferInput] = []
    # Made at the second input: a single one cannot repeat a name (a set per request saved).
    seen: set[str] | None = None
    count = len(raw)
    for index, tensor in enumerate(plain.inputs):
        name, datatype = tensor.name, tensor.datatype
        shape = _checked_spec(name, datatype, tuple(tensor.shape))
        if index:
            if seen is None:
                seen = {inputs[0].name}
            if name in seen:
                raise InvalidArgument(f"input '{name}' already exists in request")
            seen.add(name)
        data = _raw_input(name, datatype, shape, raw[index] if index < count else None, model)
        inputs.append(InferInput(name, datatype, shape, data, {}))
    return _plain_infer(model, plain.model_version, plain.id, inputs, raw, plain.outputs)


def _shape_of(plain: PlainRequest, inputs: list[InferInput]) -> PlainShape:
    """What :func:`_plain_decoded` made of ``plain`` without error, to make a repeat anew."""
    checked = [CheckedInput(tensor.name, tensor.datatype, tensor.shape) for tensor in inputs]
    return PlainShape(plain, checked)


def _shaped(shape: PlainShape, raw: list[memoryview]) -> DecodedInfer:
    """A request with the fields of ``shape`` and the raw contents ``raw``: as
    :func:`_plain_decoded` makes it, its raw contents checked in the same order (the checks of
    the fields, which come first for each input, passed when the shape was made)."""
    model = shape.model_name
    inputs: list[InferInput] = []
    count = len(raw)
    for index, tensor in enumerate(shape.inputs):
        name, datatype, dims = tensor.name, tensor.datatype, tensor.shape
        data = _raw_input(name, datatype, dims, raw[index] if index < count else None, model)
        inputs.append(InferInput(name, datatype, dims, data, {}))
    return _plain_infer(model, shape.model_version, shape.id, inputs, raw, shape.outputs)


def _plain_infer(
    model: str,
    version: str,
    request_id: str,
    inputs: list[InferInput],
    raw: list[memoryview],
    outputs: list[str],
) -> DecodedInfer:
    """The request of a plain message's fields and its inputs, once the raw contents were
    counted against them (as :func:`_check_raw_count`: no input is in shared memory)."""
    if raw and len(raw) != len(inputs):
        _raw_count_error(len(inputs), raw, model)
    request = InferRequest(
        model_name=model,
        model_version=version,
        id=request_id,
        inputs=inputs,
        outputs=[RequestedOutput(name, {}) for name in outputs],
        parameters={},
    )
    return DecodedInfer(request)


def _inputs(message: pb.ModelInferRequest, raw: list[memoryview]) -> list[InferInput]:
    model = message.model_name
    tensors = message.inputs
    # Asked once per input: each HasField call on a protobuf message costs a lookup.
    typed = [tensor.HasField("contents") for tensor in tensors]
    if raw and any(typed):
        _mixed_contents(tensors[typed.index(True)].name, model)
    inputs: list[InferInput] = []
    seen: set[str] = set()
    pending_raw = iter(raw)
    for tensor, has_contents in zip(tensors, typed, strict=True):
        name, datatype, shape = _tensor_spec(tensor)
        if name in seen:
            raise InvalidArgument(f"input '{name}' already exists in request")
        seen.add(name)
        parameters = decode_input_parameters(name, tensor.parameters)
        data = _input_data(tensor, has_contents, shape, parameters, pending_raw, model)
        inputs.append(InferInput(name, datatype, shape, data, parameters))
    _check_raw_count(inputs, raw, model)
    return inputs


def _mixed_contents(name: str, model: str) -> NoReturn:
    raise InvalidArgument(
        "contents field must not be specified when using raw_input_contents for "
        f"'{name}' for model '{model}'"
    )


def _tensor_spec(tensor: _InputTensor) -> tuple[str, str, tuple[int, ...]]:
    name, datatype = tensor.name, tensor.datatype
    return name, datatype, _checked_spec(name, datatype, tuple(tensor.shape))


def _checked_spec(name: str, datatype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if not name:
        raise InvalidArgument("each input needs a non-empty name")
    if datatype not in _DATATYPES:
        raise InvalidArgument(
            f"invalid datatype for input {name}: '{datatype}' is not one of " + ", ".join(DATATYPES)
        )
    for dim in shape:  # a loop, not min(): compiled, no builtin looked up and called
        if dim < 0:
            raise InvalidArgument(
                f"invalid shape {list(shape)} for input '{name}': dimensions must be >= 0"
            )
    return shape


def _input_data(
    tensor: _InputTensor,
    has_contents: bool,
    shape: tuple[int, ...],
    parameters: dict[str, ParamValue],
    pending_raw: Iterator[memoryview],
    model: str,
) -> memoryview | np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    if _SHM_REGION in parameters:
        if has_contents:
            raise InvalidArgument(
                "unexpected 'content' provided when using shared memory for input tensor "
                f"'{name}' for model '{model}'"
            )
        return _NO_DATA  # the core reads the client's region named in the parameters
    if has_contents:
        return array_from_contents(name, datatype, shape, tensor.contents, model)
    return _raw_input(name, datatype, shape, next(pending_raw, None), model)


def _raw_input(
    name: str, datatype: str, shape: tuple[int, ...], data: memoryview | None, model: str
) -> memoryview:
    """The input's entry of ``raw_input_contents``, checked against its shape and datatype."""
    if data is None:
        raise InvalidArgument(
            f"unable to find data for input tensor '{name}' for model '{model}' in request."
        )
    check_binary_input(name, datatype, shape, data, model)
    return data


def _check_raw_count(inputs: list[InferInput], raw: list[memoryview], model: str) -> None:
    expected = sum(1 for tensor in inputs if _SHM_REGION not in tensor.parameters)
    if raw and len(raw) != expected:
        _raw_count_error(expected, raw, model)


def _raw_count_error(expected: int, raw: list[memoryview], model: str) -> NoReturn:
    raise InvalidArgument(
        f"expected {expected} raw_input_contents entries for model '{model}' (one per "
        f"input not in shared memory), got {len(raw)}"
    )


# --- responses --------------------------------------------------------------------------------


def encode_infer_response(
    response: InferResponse, decoded: DecodedInfer, *, final: bool | None = None
) -> list[Chunk]:
    """A serialized ``ModelInferResponse`` as chunks that may view the response's memory.

    ``final`` (in a stream) is sent as ``triton_final_response``, on every stream response as
    Triton does; ``None`` (ModelInfer) sends none. Join the chunks before releasing the
    response. A reply with no parameters is written by hand (:mod:`~._reply`).
    """
    if final is None:
        plain = plain_reply(response, decoded.shared_memory_outputs)
        if plain is not None:
            return plain
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    if response.parameters:
        encode_parameters(message.parameters, response.parameters)
    if final is not None:
        message.parameters[FINAL_RESPONSE].bool_param = final
    payloads = _outputs(message, response, decoded.shared_memory_outputs)
    return [message.SerializeToString(), *raw_field_chunks(_RAW_OUTPUT_CONTENTS, payloads)]


def _outputs(
    message: pb.ModelInferResponse, response: InferResponse, in_shm: frozenset[str]
) -> list[memoryview]:
    """Each output's metadata added to ``message``; its bytes (none when it is in shared
    memory) returned, for ``raw_output_contents``."""
    payloads: list[memoryview] = []
    for output in response.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        if output.parameters:
            encode_parameters(tensor.parameters, output.parameters)
        payloads.append(_NO_DATA if output.name in in_shm else output_bytes(output))
    return payloads


def stream_response_chunks(infer_response: list[Chunk]) -> list[Chunk]:
    """A ``ModelStreamInferResponse`` holding the serialized ``infer_response``."""
    return embedded_chunks(_INFER_RESPONSE, infer_response)


def stream_error(message: str, request: InferRequest | None, *, final: bool | None = None) -> bytes:
    """A ``ModelStreamInferResponse`` that reports a failed request or an error response of a
    decoupled model (the stream goes on). ``final``: sent as ``triton_final_response``, as
    on the model's other responses."""
    reply = pb.ModelStreamInferResponse(error_message=message)
    if request is not None:
        reply.infer_response.model_name = request.model_name
        reply.infer_response.model_version = request.model_version
        reply.infer_response.id = request.id
    if final is not None:
        reply.infer_response.parameters[FINAL_RESPONSE].bool_param = final
    return reply.SerializeToString()
