"""The bodies of Triton's generate extension: a flat JSON object <-> core request and responses.

A request body maps model input names to values (a scalar or a flat array) and carries anything
else as request parameters, as Triton's generate endpoint does: each key that names a model input
becomes that input, with the datatype and shape from the model's metadata; every other key becomes
a parameter. The optional ``parameters`` object is read the same way (its keys become inputs when
they name one). A response becomes one flat object: ``model_name``, ``model_version``, the
response's parameters and each output by name, a scalar when it has one element, else a flat list.

Pure functions, no I/O. Malformed input raises :class:`~shoal.core.api.InvalidArgument`
with a message that names the offending key; error texts follow Triton's where it has one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shoal.core import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    InvalidArgument,
    TensorMetadata,
)
from shoal.frontends._params import request_parameters
from shoal.frontends.http import _json
from shoal.frontends.http._tensor_json import array_from_json, json_from_output

#: The key of the nested parameters object.
PARAMETERS = "parameters"

#: The error of ``/generate`` when the model answers with no response or more than one.
EXACTLY_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


class _Object(dict[str, Any]):
    """A JSON object that remembers which keys it held more than once (the last value is kept)."""

    repeated: tuple[str, ...] = ()


def decode_generate_request(
    body: bytes | bytearray,
    inputs: Sequence[TensorMetadata],
    *,
    model_name: str,
    model_version: str = "",
) -> InferRequest:
    """The core request of a generate body, for a model whose inputs are ``inputs``."""
    document = _parse(body)
    specs = {spec.name: spec for spec in inputs}
    tensors: dict[str, InferInput] = {}
    raw_parameters: dict[str, Any] = {}
    for key, value in _members(document, specs):
        if key == PARAMETERS:
            _assign_nested(_nested(value, specs), specs, tensors, raw_parameters)
        else:
            _assign(key, value, specs, tensors, raw_parameters)
    parameters, _ = request_parameters(raw_parameters)  # outputs are JSON whatever it asks
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=_request_id(document),
        inputs=list(tensors.values()),
        parameters=parameters,
    )


def encode_generate_response(response: InferResponse) -> bytes:
    """The JSON object of one response (a name already taken keeps its first value, as Triton)."""
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    for key, value in response.parameters.items():
        document.setdefault(key, value)
    for output in response.outputs:
        if output.name not in document:
            document[output.name] = _output_value(output)
    return _json.dumps(document)


def sse_event(data: bytes) -> bytes:
    """One Server-Sent Event carrying ``data`` (compact JSON: it holds no line break)."""
    return b"data: " + data + b"\n\n"


def error_json(message: str) -> bytes:
    return _json.dumps({"error": message})


def fit_shape(name: str, dims: Sequence[int], count: int) -> tuple[int, ...]:
    """The shape of ``count`` values for an input of ``dims`` (-1: variable), as Triton finds it:
    the fixed dims take their share, the innermost variable dim the rest, other variable dims 1."""
    fixed = math.prod(dim for dim in dims if dim >= 0)
    if fixed == 0:
        remaining = 1 if count == 0 else -1
    else:
        remaining = count // fixed if count % fixed == 0 else -1
    shape = list(dims)
    for index in reversed(range(len(shape))):
        if shape[index] < 0 and remaining >= 0:
            shape[index], remaining = remaining, 1
    if remaining != 1:
        raise InvalidArgument(
            f"The schema can not convert input '{name}' to tensor with proper shape: "
            f"{count} value(s) do not fit the model's shape {list(dims)}"
        )
    return tuple(shape)


def _request_id(document: _Object) -> str:
    """The request's id: its ``id`` member, which stays a parameter too (as in Triton), and
    comes back in each response where it is not empty."""
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id': attempt to access JSON non-string as string")
    return request_id


def _parse(body: bytes | bytearray) -> _Object:
    try:
        document = json.loads(body, object_pairs_hook=_object)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError; deep nesting
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, _Object):
        raise InvalidArgument("failed to parse the request JSON buffer: expected a JSON object")
    return document


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    document = _Object(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        repeated: list[str] = []
        for key, _ in pairs:
            if key in seen and key not in repeated:
                repeated.append(key)
            seen.add(key)
        document.repeated = tuple(repeated)
    return document


def _members(document: _Object, specs: Mapping[str, TensorMetadata]) -> Iterable[tuple[str, Any]]:
    """The object's items, after refusing an input given twice (JSON keeps only the last)."""
    for key in document.repeated:
        if key in specs:
            raise InvalidArgument(f"input '{key}' already exists in request")
    return document.items()


def _nested(value: Any, specs: Mapping[str, TensorMetadata]) -> _Object:
    if PARAMETERS in specs:
        raise InvalidArgument(
            f"Keyword '{PARAMETERS}' for nested schema also given as input tensor name"
        )
    if not isinstance(value, _Object):
        raise InvalidArgument(f"Expected JSON object for keyword: '{PARAMETERS}'")
    return value


def _assign_nested(
    nested: _Object,
    specs: Mapping[str, TensorMetadata],
    tensors: dict[str, InferInput],
    parameters: dict[str, Any],
) -> None:
    """The ``parameters`` object's members; what is wrong with one is said as Triton says it,
    after "Converting keyword: 'parameters': "."""
    try:
        for key, value in _members(nested, specs):
            _assign(key, value, specs, tensors, parameters)
            if key not in specs:
                request_parameters({key: value})  # checked here, to be named as nested
    except InvalidArgument as exc:
        raise InvalidArgument(f"Converting keyword: '{PARAMETERS}': {exc.message}") from None


def _assign(
    key: str,
    value: Any,
    specs: Mapping[str, TensorMetadata],
    tensors: dict[str, InferInput],
    parameters: dict[str, Any],
) -> None:
    spec = specs.get(key)
    if spec is None:
        parameters[key] = value
    elif key in tensors:
        raise InvalidArgument(f"input '{key}' already exists in request")
    else:
        tensors[key] = _tensor(spec, value)


def _tensor(spec: TensorMetadata, value: Any) -> InferInput:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(item, list) for item in values):
        raise InvalidArgument(
            f"Unable to parse input '{spec.name}': expected a scalar or a flat array, "
            "got a nested array"
        )
    shape = fit_shape(spec.name, spec.shape, len(values))
    data = array_from_json(spec.name, spec.datatype, shape, values)
    return InferInput(spec.name, spec.datatype, shape, data)


def _output_value(output: InferOutput) -> Any:
    data = memoryview(output.data)
    if data.format != "B" or data.ndim != 1:
        data = data.cast("B")
    values = json_from_output(output.name, output.datatype, output.shape, data)
    return values[0] if len(values) == 1 else values
