"""Core values on the worker link as plain MessagePack values: errors as ``[class, code, message,
reason, http_message]``, dataclasses of ``core.types`` as arrays of their fields (decoded
generically from their type hints). Off the per-request path: answers of the synchronous calls
(metadata, statistics, settings) and failures."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from functools import cache
from typing import Any

from shoal.core import errors
from shoal.core.types import (
    BatchStatistics,
    MemoryUsage,
    ModelMetadata,
    ModelStatistics,
    ResponseStatistics,
    ServerMetadata,
    TensorMetadata,
)

__all__ = ["as_shoal_error", "error_from_wire", "error_to_wire", "from_plain", "to_plain"]


# --- errors ---------------------------------------------------------------------------------


def error_to_wire(error: BaseException) -> list[Any]:
    if isinstance(error, errors.ShoalError):
        return [
            type(error).__name__,
            error.code.value,
            error.message,
            error.reason,
            getattr(error, "http_message", None),
        ]
    if isinstance(error, NotImplementedError):
        return ["NotImplementedError", "", str(error), "", None]
    return [
        "InternalError",
        errors.ErrorCode.INTERNAL.value,
        f"internal error: {error}",
        "OTHER",
        None,
    ]


def error_from_wire(fields: Sequence[Any]) -> BaseException:
    name, code, message, reason, http_message = fields
    if name == "NotImplementedError":
        return NotImplementedError(message)
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ShoalError)):
        cls = errors.ShoalError
    error: errors.ShoalError = cls.__new__(cls)
    errors.ShoalError.__init__(error, message, errors.ErrorCode(code))
    error.reason = reason
    if http_message is not None:
        error.http_message = http_message  # type: ignore[attr-defined]
    return error


def as_shoal_error(error: BaseException) -> errors.ShoalError:
    if isinstance(error, errors.ShoalError):
        return error
    return errors.InternalError(str(error))


# --- plain values: dataclasses of core.types ------------------------------------------------


def to_plain(value: Any) -> Any:
    """A dataclass (nested) as arrays of field values; containers recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [to_plain(getattr(value, f.name)) for f in _fields(type(value))]
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def from_plain(kind: Any, value: Any) -> Any:
    """The inverse of :func:`to_plain` for the type ``kind`` (a type hint)."""
    origin = typing.get_origin(kind)
    if origin is list:
        item = typing.get_args(kind)[0]
        return [from_plain(item, v) for v in value]
    if origin is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], v) for v in value)
        return tuple(from_plain(a, v) for a, v in zip(args, value, strict=True))
    if origin is dict:
        _, item = typing.get_args(kind)
        return {k: from_plain(item, v) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        if isinstance(value, list):  # a sequence member of the union: rebuild it
            for member in typing.get_args(kind):
                if typing.get_origin(member) in (list, tuple):
                    return from_plain(member, value)
        return value
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        return kind(
            *(from_plain(hints[f.name], v) for f, v in zip(_fields(kind), value, strict=True))
        )
    return value


@cache
def _fields(kind: type) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(f for f in dataclasses.fields(kind) if not f.name.startswith("_"))


@cache
def _hints(kind: type) -> dict[str, Any]:
    return {**typing.get_type_hints(kind), **_GENERIC_FIELDS.get(kind, {})}


#: The generic fields of the compiled core types: mypyc keeps ``tuple`` of ``tuple[str, ...]``
#: in the annotations it leaves, so the item types are written here.
_GENERIC_FIELDS: dict[type, dict[str, Any]] = {
    ServerMetadata: {"extensions": tuple[str, ...]},
    TensorMetadata: {"shape": tuple[int, ...]},
    ModelMetadata: {
        "versions": tuple[str, ...],
        "inputs": tuple[TensorMetadata, ...],
        "outputs": tuple[TensorMetadata, ...],
    },
    ModelStatistics: {
        "batch_stats": list[BatchStatistics],
        "response_stats": dict[str, ResponseStatistics],
        "memory_usage": list[MemoryUsage],
        "failure_reasons": dict[str, int],
    },
}
