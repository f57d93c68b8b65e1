"""Decode a V2 ``POST .../infer`` body into an :class:`InferRequest`.

The body is JSON or, with the binary tensor data extension, a JSON header whose size the
``Inference-Header-Content-Length`` header gives, followed by the data of the inputs that carry
``parameters.binary_data_size``, back to back in input order. Binary inputs become zero-copy,
read-only ``memoryview`` slices of the body; JSON inputs become NumPy arrays. Error texts follow
Triton's where clients are known to match on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from shoal.core import (
    DATATYPES,
    InferInput,
    InferRequest,
    InvalidArgument,
    RequestedOutput,
    Unsupported,
)
from shoal.frontends._binary import BinarySection, check_binary_input
from shoal.frontends._params import input_parameters, output_parameters, request_parameters
from shoal.frontends.http import _json
from shoal.frontends.http._plain_request import (
    SMALL_DOCUMENT,
    PlainRequest,
    known_shape,
    parse_small,
    plain_shape,
    read_shape,
    remember_shape,
)
from shoal.frontends.http._raw_request import raw_request
from shoal.frontends.http._tensor_json import array_from_json

#: The core's ``model_config``: what a raw binary request's input is deduced from.
ConfigOf = Callable[[str, str], Mapping[str, Any]]

_NO_DATA: Final = memoryview(b"")


@dataclass
class OutputFormat:
    """How the client wants each output back: binary, JSON, or left in its shared memory."""

    binary_default: Final[bool]
    #: A dict, not a Mapping: compiled, its ``get`` is a direct call, not a method look-up.
    binary: Final[dict[str, bool]]
    shared_memory: Final[frozenset[str]]

    def __init__(
        self,
        binary_default: bool = False,
        binary: dict[str, bool] | None = None,
        shared_memory: frozenset[str] = frozenset(),
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.binary_default = binary_default
        self.binary = {} if binary is None else binary
        self.shared_memory = shared_memory

    def is_binary(self, name: str) -> bool:
        """Per-output ``binary_data`` wins over the request's ``binary_data_output``."""
        return self.binary.get(name, self.binary_default)


@dataclass
class DecodedRequest:
    """The core's request plus what only the frontend needs to render the response."""

    request: InferRequest
    output_format: OutputFormat

    def __init__(self, request: InferRequest, output_format: OutputFormat) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.request = request
        self.output_format = output_format


def decode_infer_request(
    body: bytes | bytearray | memoryview,
    *,
    model_name: str,
    model_version: str = "",
    header_length: str | None = None,
    config_of: ConfigOf | None = None,
) -> DecodedRequest:
    """Decode an infer body; ``header_length`` is the ``Inference-Header-Content-Length`` value.
    A raw binary request (``header_length`` 0) needs ``config_of``; without, it is refused."""
    # The fast path's bytes is viewed as it is: bytes, read-only already (a cast and a
    # toreadonly are two method calls by name, ~500 instructions each compiled).
    view = memoryview(body) if isinstance(body, bytes) else memoryview(body).cast("B").toreadonly()
    json_size = parse_header_length(header_length, len(view))
    if json_size == 0:
        return _raw_decoded(view, model_name, model_version, config_of)
    # A JSON-only body is parsed as it is: slicing it would cost a copy of the whole body.
    whole = json_size == len(view) and not isinstance(body, memoryview)
    header = body if whole else view[:json_size]
    binary = BinarySection(view[json_size:], model_name, has_header=header_length is not None)
    key = _shape_key(header)
    shape = None if key is None else known_shape(key)
    if shape is not None:
        return _plain_decoded(read_shape(shape, binary), model_name, model_version)
    document = None if key is None else parse_small(key)
    if document is None:
        document = _parse_document(header)
    shape = plain_shape(document)
    if shape is not None:
        plain = read_shape(shape, binary)  # raises for this body: remembered only once read
        if key is not None:
            remember_shape(key, shape)
        return _plain_decoded(plain, model_name, model_version)
    # Not plain: nothing was taken from ``binary``, so the general walk reads it.
    parameters, binary_default = request_parameters(document.get("parameters", {}))
    inputs = _parse_inputs(document, binary)
    binary.finish()
    outputs, output_format = _parse_outputs(document, binary_default)
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=_parse_id(document),
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
    )
    return DecodedRequest(request, output_format)


def _shape_key(header: bytes | bytearray | memoryview) -> bytes | None:
    """``header`` as bytes if it is short enough to be parsed at once (:func:`parse_small`)."""
    if len(header) > SMALL_DOCUMENT:
        return None
    return header if isinstance(header, bytes) else bytes(header)


def _raw_decoded(
    view: memoryview, model_name: str, model_version: str, config_of: ConfigOf | None
) -> DecodedRequest:
    """A raw binary request: every output is answered binary, as Triton does."""
    if config_of is None:
        raise Unsupported(
            "Inference-Header-Content-Length 0 (a raw binary request) is not supported here; "
            "send a JSON header with 'binary_data_size' for each binary input"
        )
    config = config_of(model_name, model_version)
    return DecodedRequest(raw_request(view, model_name, model_version, config), OutputFormat(True))


def _plain_decoded(plain: PlainRequest, model_name: str, model_version: str) -> DecodedRequest:
    """The request :func:`read_shape` read."""
    request = InferRequest(model_name, model_version, plain.id, plain.inputs, plain.outputs, {})
    return DecodedRequest(request, OutputFormat(plain.binary_default, plain.binary))


def parse_header_length(value: str | None, body_size: int) -> int:
    """Bytes of JSON at the start of the body: all of it unless the header says otherwise; 0
    for a raw binary request."""
    if value is None:
        return body_size
    length = _header_length_value(value)
    if length == 0:
        return 0  # a raw binary request: the body is the one input's bytes
    if not 0 < length <= body_size:
        raise InvalidArgument(
            f"inference header size should be in range (0, {body_size}], got: {value}"
        )
    return length


def _header_length_value(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidArgument(
            f"Unable to parse Inference-Header-Content-Length, got: {value}"
        ) from None


def _parse_document(header: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        document = _json.loads(header, numbers=True)
    except _json.JsonDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("failed to parse the request JSON buffer: expected a JSON object")
    return document


def _parse_id(document: dict[str, Any]) -> str:
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id': expected a string")
    return request_id


def _parse_inputs(document: dict[str, Any], binary: BinarySection) -> list[InferInput]:
    entries = document.get("inputs")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise InvalidArgument("Unable to parse 'inputs': expected an array of input objects")
    inputs: list[InferInput] = []
    seen: set[str] = set()
    for entry in entries:
        tensor = _parse_input(entry, binary)
        if tensor.name in seen:
            raise InvalidArgument(f"input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
        inputs.append(tensor)
    return inputs


def _parse_input(entry: dict[str, Any], binary: BinarySection) -> InferInput:
    name, datatype, shape = _tensor_spec(entry)
    parameters, binary_size = input_parameters(name, entry.get("parameters", {}))
    _check_one_source(name, entry, parameters, binary_size)
    data: memoryview | np.ndarray
    if binary_size is not None:
        data = binary.take(name, binary_size)
        check_binary_input(name, datatype, shape, data, binary.model_name)
    elif "shared_memory_region" in parameters:
        data = _NO_DATA  # the core reads the client's region named in the parameters
    else:
        data = array_from_json(name, datatype, shape, entry["data"])
    return InferInput(name, datatype, shape, data, parameters)


def _tensor_spec(entry: dict[str, Any]) -> tuple[str, str, tuple[int, ...]]:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("Unable to parse 'name': each input needs a non-empty string name")
    datatype = entry.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidArgument(f"Unable to parse 'datatype' for input '{name}': expected a string")
    if datatype not in DATATYPES:
        raise InvalidArgument(
            f"invalid datatype for input {name}: '{datatype}' is not one of " + ", ".join(DATATYPES)
        )
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise InvalidArgument(
            f"Unable to parse 'shape' for input '{name}': expected an array of non-negative "
            f"integers, got {_json.dumps(shape).decode()}"
        )
    return name, datatype, tuple(shape)


def _check_one_source(
    name: str, entry: dict[str, Any], parameters: Mapping[str, Any], binary_size: int | None
) -> None:
    """Exactly one of 'data', 'binary_data_size' and 'shared_memory_region' (Triton's rule)."""
    sources = [
        label
        for label, present in (
            ("'data'", "data" in entry),
            ("'binary_data_size'", binary_size is not None),
            ("'shared_memory_region'", "shared_memory_region" in parameters),
        )
        if present
    ]
    if len(sources) != 1:
        found = " set " + " ".join(sources) if sources else " no field is set"
        raise InvalidArgument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But"
            f"{found} for input '{name}'"
        )


def _parse_outputs(
    document: dict[str, Any], binary_default: bool
) -> tuple[list[RequestedOutput], OutputFormat]:
    entries = document.get("outputs", [])
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise InvalidArgument("Unable to parse 'outputs': expected an array of output objects")
    outputs: list[RequestedOutput] = []
    binary: dict[str, bool] = {}
    shared_memory: set[str] = set()
    for entry in entries:
        name = _output_name(entry)
        parameters, wants_binary = output_parameters(name, entry.get("parameters", {}))
        if wants_binary is not None:
            binary[name] = wants_binary
        if "shared_memory_region" in parameters:
            shared_memory.add(name)
        outputs.append(RequestedOutput(name, parameters))
    return outputs, OutputFormat(binary_default, binary, frozenset(shared_memory))


def _output_name(entry: dict[str, Any]) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument("Unable to parse 'name': each output needs a non-empty string name")
    return name
