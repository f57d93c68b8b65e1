"""Parameter maps of the gRPC messages <-> the core's ``dict[str, ParamValue]``.

``InferParameter`` is a oneof: bool, int64, uint64 (both become ``int``), double (``float``) or
string. Going out, ``bool`` is checked before ``int`` (a ``bool`` is an ``int`` in Python) and an
``int`` above the int64 range uses ``uint64_param``. After conversion the values are checked by the
same rules as the HTTP frontend's (:mod:`shoal.frontends._params`), so both frontends accept the
same parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Final

from shoal.core import InvalidArgument, ParamValue
from shoal.frontends._params import input_parameters, output_parameters, request_parameters
from shoal.protos import grpc_service_pb2 as pb

_Parameters = Mapping[str, pb.InferParameter]
#: The frontends' shared parameter check of an input or an output (``name``, raw values).
_Decode = Callable[[str, Any], tuple[dict[str, ParamValue], Any]]

__all__ = [
    "EMPTY_FINAL_RESPONSE",
    "FINAL_RESPONSE",
    "decode_input_parameters",
    "decode_output_parameters",
    "decode_request_parameters",
    "encode_parameters",
    "param_value",
]

#: Request parameter of ModelStreamInfer (tritonclient's ``enable_empty_final_response``).
EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"
#: Response parameter that marks the last response of a request, when the client asked for it.
FINAL_RESPONSE: Final = "triton_final_response"

_INT64_MAX: Final = (1 << 63) - 1


def param_value(key: str, parameter: pb.InferParameter) -> ParamValue:
    """The Python value of one ``InferParameter``."""
    choice = parameter.WhichOneof("parameter_choice")
    if choice is None:
        raise InvalidArgument(
            f"invalid value type for '{key}' parameter: no value is set, expected bool_param, "
            "int64_param, uint64_param, double_param or string_param"
        )
    value: ParamValue = getattr(parameter, choice)
    return value


def _values(parameters: Mapping[str, pb.InferParameter]) -> dict[str, ParamValue]:
    return {key: param_value(key, parameter) for key, parameter in parameters.items()}


def decode_request_parameters(
    parameters: Mapping[str, pb.InferParameter],
) -> tuple[dict[str, ParamValue], bool]:
    """The request's parameters for the core, and whether it asked for a final-response flag."""
    if not parameters:  # the usual case, and checking an empty map finds nothing
        return {}, False
    values = _values(parameters)
    final = values.pop(EMPTY_FINAL_RESPONSE, False)
    if not isinstance(final, bool):
        raise InvalidArgument(
            f"invalid value type for '{EMPTY_FINAL_RESPONSE}' parameter, expected bool_param."
        )
    decoded, _ = request_parameters(values)  # binary_data_output means nothing over gRPC
    return decoded, final


def decode_input_parameters(
    name: str, parameters: Mapping[str, pb.InferParameter]
) -> dict[str, ParamValue]:
    """An input's parameters for the core."""
    return _decoded(name, parameters, input_parameters)


def decode_output_parameters(
    name: str, parameters: Mapping[str, pb.InferParameter]
) -> dict[str, ParamValue]:
    """A requested output's parameters for the core."""
    return _decoded(name, parameters, output_parameters)


def _decoded(name: str, parameters: _Parameters, decode: _Decode) -> dict[str, ParamValue]:
    if not parameters:
        return {}
    decoded, _ = decode(name, _values(parameters))
    return decoded


def encode_parameters(
    target: MutableMapping[str, pb.InferParameter], values: Mapping[str, ParamValue]
) -> None:
    """Write ``values`` into the message map ``target``."""
    for key, value in values.items():
        parameter = target[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                parameter.uint64_param = value
            else:
                parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)
