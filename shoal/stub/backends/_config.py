"""What every built-in backend reads from the configuration: tensors, parameters, datatypes.

Nothing here imports a framework, so the pieces are testable alone and shared by the
onnxruntime and TorchScript backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class BackendModelError(Exception):
    """A built-in backend cannot load or run the model as configured; the message says what to
    change. At load it becomes the load error; while running, the error of the requests."""


@dataclass(frozen=True)
class ConfigTensor:
    """An input or output of the configuration, in the shape the model sees (its ``reshape``
    when it has one) and the shape the client sees (``dims``); both without the batch dim."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    model_dims: tuple[int, ...]
    has_reshape: bool


def config_tensors(config: Mapping[str, Any], key: str) -> list[ConfigTensor]:
    """The ``input`` or ``output`` entries of a configuration in Triton's JSON form."""
    return [_config_tensor(entry) for entry in config.get(key, []) or []]


def _config_tensor(entry: Mapping[str, Any]) -> ConfigTensor:
    data_type = str(entry.get("data_type", ""))
    datatype = "BYTES" if data_type == "TYPE_STRING" else data_type.removeprefix("TYPE_")
    dims = tuple(int(d) for d in entry.get("dims", []))
    name, reshape = str(entry.get("name", "")), entry.get("reshape")
    if not isinstance(reshape, Mapping):
        return ConfigTensor(name, datatype, dims, dims, False)
    model_dims = tuple(int(d) for d in reshape.get("shape", []))
    return ConfigTensor(name, datatype, dims, model_dims, True)


def sequence_tensors(config: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The sequence batcher's control inputs, implicit-state inputs and implicit-state outputs:
    tensors the model gets and gives without the configuration listing them."""
    sequence = config.get("sequence_batching") or {}
    controls = [str(c.get("name", "")) for c in sequence.get("control_input", []) or []]
    states = sequence.get("state", []) or []
    state_inputs = [str(s.get("input_name", "")) for s in states]
    state_outputs = [str(s.get("output_name", "")) for s in states]
    return controls, state_inputs, state_outputs


def config_type(datatype: str | None) -> str:
    """The configuration's name of a V2 datatype (``FP32`` -> ``TYPE_FP32``)."""
    if datatype is None:
        return "an unsupported type"
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


# -- parameters ------------------------------------------------------------------------------


def parameter(config: Mapping[str, Any], key: str) -> str | None:
    """The ``string_value`` of the model parameter ``key``, if the configuration sets it."""
    value = (config.get("parameters") or {}).get(key)
    if isinstance(value, Mapping):
        value = value.get("string_value")
    return None if value is None else str(value)


def int_parameter(config: Mapping[str, Any], key: str, model: str) -> int | None:
    raw = parameter(config, key)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise BackendModelError(
            f"unable to load model '{model}': parameter {key} must be an integer, got '{raw}'"
        ) from None


def bool_parameter(config: Mapping[str, Any], key: str) -> bool | None:
    raw = parameter(config, key)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip().lower() in ("1", "true", "yes", "on")


__all__ = [
    "BackendModelError",
    "ConfigTensor",
    "bool_parameter",
    "config_tensors",
    "config_type",
    "int_parameter",
    "parameter",
    "sequence_tensors",
]
