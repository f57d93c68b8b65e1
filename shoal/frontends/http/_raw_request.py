"""A raw binary request: ``Inference-Header-Content-Length: 0``, the body being the bytes of the
model's only input, without a JSON header (the binary data extension's "Raw Binary Request").

The input's name, datatype and shape come from the model's configuration, as Triton's core
deduces them (``InferenceRequest::Normalize``): a batching model gets a batch of 1, the one
variable-sized dimension takes what the byte size leaves, a BYTES input must have shape [1] and
its bytes become one element. Every output comes back binary. The error texts are Triton's.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

from shoal.core import InferInput, InferRequest, InvalidArgument, byte_size
from shoal.frontends._binary import check_binary_input

#: Triton's ``LogRequest()`` prefix: a raw request has no id.
_PREFIX: Final = "[request id: <id_unknown>] "
_LENGTH: Final = struct.Struct("<I")


def raw_request(
    body: memoryview, model_name: str, model_version: str, config: Mapping[str, Any]
) -> InferRequest:
    """The request whose only input is all of ``body``; ``config`` is the model's (JSON form)."""
    inputs = config.get("input") or []
    if len(inputs) != 1:
        raise InvalidArgument(
            f"{_PREFIX}Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(inputs)} inputs in '{model_name}' model configuration"
        )
    name = str(inputs[0]["name"])
    datatype = _datatype(str(inputs[0]["data_type"]))
    shape = _shape(inputs[0], datatype, len(body), int(config.get("max_batch_size", 0)))
    data = body
    if datatype == "BYTES":
        # One element: Triton prepends its length, as a serialized BYTES tensor has it.
        data = memoryview(_LENGTH.pack(len(body)) + body)
    check_binary_input(name, datatype, shape, data, model_name)
    return InferRequest(model_name, model_version, "", [InferInput(name, datatype, shape, data)])


def _datatype(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    short = config_type.removeprefix("TYPE_")
    return "BYTES" if short == "STRING" else short


def _shape(
    spec: Mapping[str, Any], datatype: str, size: int, max_batch_size: int
) -> tuple[int, ...]:
    """The input's shape: the configured dims, a batch of 1 first for a batching model, and the
    one variable-sized dimension from ``size`` (Triton's integer division: a size that does not
    divide then fails the byte-size check)."""
    shape = [1] if max_batch_size > 0 else []
    variable = -1
    elements = 1
    for dim in (int(d) for d in spec.get("dims") or []):
        if dim == -1:
            if variable != -1:
                raise InvalidArgument(
                    f"{_PREFIX}The shape of the raw input '{spec['name']}' can not be deduced "
                    "because there are more than one variable-sized dimension"
                )
            variable = len(shape)
        else:
            elements *= dim
        shape.append(dim)
    if datatype == "BYTES":
        if variable != -1 or elements != 1:
            raise InvalidArgument(
                f"{_PREFIX}For BYTE datatype raw input '{spec['name']}', the model must have "
                "input shape [1]"
            )
    elif variable != -1:
        per_row = byte_size(datatype, (elements,)) or 0
        shape[variable] = size // per_row if per_row else 0
    return tuple(shape)
