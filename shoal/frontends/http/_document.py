"""The small JSON bodies of the extension endpoints (repository, shared memory, logging).

Each is a JSON object, and an empty body means an empty object, as Triton reads them. Fields are
read with Triton's "Unable to parse '<field>'" wording.
"""

from __future__ import annotations

from typing import Any

from shoal.core import InvalidArgument
from shoal.frontends.http import _json


def parse_object(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The body's JSON object; ``{}`` for an empty body."""
    if not len(body):
        return {}
    try:
        document = _json.loads(body)
    except _json.JsonDecodeError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("failed to parse the request JSON buffer: expected a JSON object")
    return document


def optional_bool(document: dict[str, Any], key: str, default: bool = False) -> bool:
    value = document.get(key, default)
    if not isinstance(value, bool):
        raise InvalidArgument(f"Unable to parse '{key}': expected a boolean")
    return value


def optional_object(document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise InvalidArgument(f"Unable to parse '{key}': expected a JSON object")
    return value


def non_negative_int(document: dict[str, Any], key: str, default: int = 0) -> int:
    value = document.get(key, default)
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"Unable to parse '{key}': expected a non-negative integer")
    return value
