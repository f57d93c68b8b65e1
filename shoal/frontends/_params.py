"""The ``parameters`` objects of an infer request: of the request, of each input, of each output.

The frontend consumes the binary-extension parameters (``binary_data_output``, ``binary_data``,
``binary_data_size``) and passes everything else to the core, after checking the types of the
parameters Triton defines. Messages use Triton's "Unable to parse '<key>'" form.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.core import InvalidArgument, ParamValue

_NON_NEGATIVE_INTS: Final = (
    "priority",
    "timeout",
    "shared_memory_offset",
    "shared_memory_byte_size",
)
_BOOLS: Final = ("sequence_start", "sequence_end")
#: The integers a parameter can hold: Triton's are int64 (JSON) or uint64 (gRPC's
#: ``uint64_param``); a wider one cannot reach the model and is the client's error, not a 500.
_INT_MIN: Final = -(1 << 63)
_INT_END: Final = 1 << 64


def request_parameters(raw: Any) -> tuple[dict[str, ParamValue], bool]:
    """The request's parameters for the core, and its ``binary_data_output`` flag."""
    items = _as_object(raw, "parameters")
    binary_output = False
    parameters: dict[str, ParamValue] = {}
    for key, value in items.items():
        if key == "binary_data_output":
            binary_output = _parse_bool(key, value)
        elif key.startswith("triton_"):
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should "
                f"not be specified ('{key}')"
            )
        else:
            parameters[key] = _parse_value(key, value)
    return parameters, binary_output


def input_parameters(name: str, raw: Any) -> tuple[dict[str, ParamValue], int | None]:
    """An input's parameters for the core, and its ``binary_data_size`` if it has one."""
    items = _as_object(raw, f"parameters' of input '{name}")
    parameters: dict[str, ParamValue] = {}
    binary_size: int | None = None
    for key, value in items.items():
        if key == "binary_data_size":
            binary_size = _parse_non_negative(key, value)
        else:
            parameters[key] = _parse_value(key, value)
    return parameters, binary_size


def output_parameters(name: str, raw: Any) -> tuple[dict[str, ParamValue], bool | None]:
    """A requested output's parameters for the core, and its ``binary_data`` flag if set."""
    items = _as_object(raw, f"parameters' of output '{name}")
    parameters: dict[str, ParamValue] = {}
    binary: bool | None = None
    for key, value in items.items():
        if key == "binary_data":
            binary = _parse_bool(key, value)
        else:
            parameters[key] = _parse_value(key, value)
    if "shared_memory_region" in parameters:
        # Triton's rules: shared-memory outputs are neither in the body nor post-processed.
        conflict = (
            "binary_data" if binary else "classification" if "classification" in parameters else ""
        )
        if conflict:
            raise InvalidArgument(
                f"Output can't set both 'shared_memory_region' and '{conflict}' (output '{name}')"
            )
    return parameters, binary


def _as_object(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidArgument(f"Unable to parse '{what}': expected a JSON object")
    return raw


def _parse_value(key: str, value: Any) -> ParamValue:
    if key == "sequence_id":
        if isinstance(value, str):
            return value
        return _parse_non_negative(key, value)
    if key in _NON_NEGATIVE_INTS:
        return _parse_non_negative(key, value)
    if key in _BOOLS:
        return _parse_bool(key, value)
    if key == "shared_memory_region" and not isinstance(value, str):
        raise InvalidArgument(f"Unable to parse '{key}': expected a string")
    if not isinstance(value, bool | int | float | str):
        raise InvalidArgument(
            f"parameter '{key}' has invalid type. It should be either 'int', 'float', 'bool', "
            "or 'string'."
        )
    if type(value) is int and not _INT_MIN <= value < _INT_END:
        raise InvalidArgument(_out_of_range(key, value))
    return value


def _out_of_range(key: str, value: int) -> str:
    return (
        f"parameter '{key}' is out of range: {value} does not fit in 64 bits "
        f"(int64 from {_INT_MIN}, uint64 up to {_INT_END - 1})"
    )


def _parse_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"Unable to parse '{key}': expected a boolean")
    return value


def _parse_non_negative(key: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"Unable to parse '{key}': expected a non-negative integer")
    if value >= _INT_END:
        raise InvalidArgument(_out_of_range(key, value))
    return value
