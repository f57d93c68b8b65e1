"""Model-configuration data types (``TYPE_FP32``) and their KServe V2 names (``"FP32"``)."""

from __future__ import annotations

from shoal.protos import model_config_pb2 as pb

from .errors import ConfigError

_CONFIG_TO_V2: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
_V2_TO_CONFIG: dict[str, str] = {v2: name for name, v2 in _CONFIG_TO_V2.items()}

#: The V2 datatype names a configuration can express, in DataType enum order.
V2_DATATYPES: tuple[str, ...] = tuple(_CONFIG_TO_V2.values())


def config_dtype_to_v2(data_type: str | int) -> str:
    """``"TYPE_FP32"`` (or its enum number 11) -> ``"FP32"``; ``TYPE_STRING`` -> ``"BYTES"``.

    Raises :class:`ConfigError` for ``TYPE_INVALID`` and unknown names or numbers.
    """
    name = _type_name(data_type) if isinstance(data_type, int) else data_type
    v2 = _CONFIG_TO_V2.get(str(name))
    if v2 is None:
        choices = ", ".join(_CONFIG_TO_V2)
        raise ConfigError(f"data type {name!s} has no tensor datatype; use one of {choices}")
    return v2


def _type_name(number: int) -> str:
    try:
        return pb.DataType.Name(number)
    except ValueError:
        raise ConfigError(f"data type number {number} is not a DataType") from None


def v2_to_config_dtype(datatype: str) -> str:
    """``"FP32"`` -> ``"TYPE_FP32"``; ``"BYTES"`` -> ``"TYPE_STRING"``.

    Raises :class:`ConfigError` for names that are not V2 datatypes.
    """
    name = _V2_TO_CONFIG.get(datatype)
    if name is None:
        raise ConfigError(
            f"{datatype!r} is not a tensor datatype; use one of {', '.join(V2_DATATYPES)}"
        )
    return name


__all__ = ["V2_DATATYPES", "config_dtype_to_v2", "v2_to_config_dtype"]
