"""The checks of ``InferenceRequest``'s arguments (a model's BLS requests), in Triton's words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from shoal.stub._pb_errors import TritonModelException
from shoal.stub._pb_tensor import Tensor

_T = TypeVar("_T")

#: The default of a required argument (Triton names the one missing).
MISSING: Any = object()


def required(value: Any, name: str) -> Any:
    if value is MISSING:
        raise TypeError(f"InferenceRequest() missing required argument: '{name}'")
    return value


def check_str(value: Any, name: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")


def check_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


def instance_of(value: _T, cls: type, message: str) -> _T:
    """``value``; TypeError with ``message`` unless it is a ``cls``."""
    if not isinstance(value, cls):
        raise TypeError(message)
    return value


def check_correlation_id(correlation_id: object) -> int | str:
    if correlation_id is None:  # Triton refuses None before looking at the value
        raise TypeError("correlation_id must be an int or a str, not None")
    if isinstance(correlation_id, str):
        return correlation_id
    if isinstance(correlation_id, int):
        if correlation_id < 0:
            raise TritonModelException("Correlation ID must be a non-negative integer or string")
        return int(correlation_id)
    raise TritonModelException("Correlation ID must be integer or string")


def check_inputs(inputs: object, request_id: str, model_name: str) -> list[Tensor]:
    if inputs is None or isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
        raise TypeError("inputs must be a list of pb_utils.Tensor")
    return [checked_input(tensor, request_id, model_name) for tensor in inputs]


def checked_input(tensor: object, request_id: str, model_name: str) -> Tensor:
    if tensor is None:
        raise TritonModelException(
            f"Input tensor for request with id '{request_id}' and model name "
            f"'{model_name}' should not be empty."
        )
    if not isinstance(tensor, Tensor):
        raise TypeError(f"inputs must hold pb_utils.Tensor objects, not {type(tensor).__name__}")
    return tensor


def check_output_names(names: object, request_id: str, model_name: str) -> list[str]:
    if names is None or isinstance(names, str | bytes) or not isinstance(names, Sequence | set):
        raise TypeError("requested_output_names must be a list of str")
    return [checked_output_name(name, request_id, model_name) for name in names]


def checked_output_name(name: object, request_id: str, model_name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"requested output names must be str, not {type(name).__name__}")
    if not name:
        raise TritonModelException(
            f"Requested output name for request with id '{request_id}' and model name "
            f"'{model_name}' should not be empty."
        )
    return name
