"""Triton's JSON form of a ModelConfig (``GET /v2/models/{m}/config``, ``args["model_config"]``).

Triton prints the completed configuration with protobuf's JSON printer using the proto field
names and printing fields that hold default values, then rewrites 64-bit integers (which the
printer writes as strings) as JSON numbers. The result therefore has every scalar, repeated and
map field of each message that is present (``"optional": false``, ``"batch_input": []``,
``"parameters": {}``), enum values by name (``"TYPE_FP32"``), and no key for an unset message
field (``dynamic_batching`` only when configured). Keys follow the order of the proto.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from shoal.protos import model_config_pb2 as pb

from .errors import ConfigError
from .model_config import ModelConfig

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
_MODEL_CONFIG: Descriptor = pb.DESCRIPTOR.message_types_by_name["ModelConfig"]


def config_to_json(
    config: ModelConfig | pb.ModelConfig, *, include_defaults: bool = True
) -> dict[str, Any]:
    """The JSON object Triton serves for ``config`` (a typed config or a ModelConfig message).

    ``include_defaults=False`` prints only the fields that are set."""
    message = config.proto if isinstance(config, ModelConfig) else config
    printed = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=include_defaults,
    )
    return _as_triton(printed, _MODEL_CONFIG)


def json_to_config(data: Mapping[str, Any]) -> pb.ModelConfig:
    """Parse Triton's JSON form (as :func:`config_to_json` writes it, or as a client sends it
    in a load request's ``config`` parameter) into a ModelConfig message.

    64-bit integers may be numbers or strings, enum names are matched ignoring case and a
    repeated field may be given one element instead of a list of one, as Triton's parser
    (protobuf's ``JsonStringToMessage``, which keeps that legacy syntax) takes them. Unknown
    fields are errors. Defaults are not filled and nothing is validated.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"a model configuration must be a JSON object, not {type(data).__name__}")
    message = pb.ModelConfig()
    try:
        json_format.ParseDict(_as_protobuf(data, _MODEL_CONFIG), message)
    except json_format.ParseError as exc:
        detail = str(exc).replace(pb.DESCRIPTOR.package + ".", "")
        raise ConfigError(f"the configuration JSON does not fit ModelConfig: {detail}") from None
    return message


def _map_value(field: FieldDescriptor) -> FieldDescriptor | None:
    """The value field of a map field's entry, or ``None`` when ``field`` is not a map."""
    entry = field.message_type
    if entry is None or not entry.GetOptions().map_entry:
        return None
    return entry.fields_by_name["value"]


def _as_triton(printed: Mapping[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    return {
        field.name: _triton_value(field, printed[field.name])
        for field in descriptor.fields  # declaration order, as Triton's printer writes them
        if field.name in printed
    }


def _triton_value(field: FieldDescriptor, value: Any) -> Any:
    value_field = _map_value(field)
    if value_field is not None:
        return {key: _scalar(value_field, item) for key, item in value.items()}
    if field.is_repeated:
        return [_scalar(field, item) for item in value]
    return _scalar(field, value)


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return _as_triton(value, field.message_type)
    if field.type in _INT64_TYPES:
        return int(value)
    if field.type in _FLOAT_TYPES and isinstance(value, float) and value.is_integer():
        return int(value)  # C++'s printer writes 1.0 as 1
    return value


def _as_protobuf(data: Mapping[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """``data`` as Python's strict parser takes it: enum names upper-cased, one element given
    for a repeated field made a list of one."""
    result = dict(data)
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        value_field = _map_value(field)
        if value_field is not None and isinstance(value, Mapping):
            result[name] = {key: _upper_value(value_field, item) for key, item in value.items()}
        elif field.is_repeated and value_field is None and value is not None:
            items = value if isinstance(value, list) else [value]
            result[name] = [_upper_value(field, item) for item in items]
        else:
            result[name] = _upper_value(field, value)
    return result


def _upper_value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and isinstance(value, Mapping):
        return _as_protobuf(value, field.message_type)
    if field.enum_type is not None and isinstance(value, str):
        return value.upper()
    return value


__all__ = ["config_to_json", "json_to_config"]
