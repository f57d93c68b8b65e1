"""JSON for the HTTP frontend: ``orjson`` when it is installed, the standard library otherwise.

``orjson`` is optional (shoal does not depend on it); it is looked up at import time through
``importlib`` so that type checking does not depend on whether it is installed.
"""

from __future__ import annotations

import importlib
import json
from typing import Any


class JsonDecodeError(ValueError):
    """The bytes are not valid JSON; ``str()`` says where and why."""


def _optional_orjson() -> Any:
    try:
        return importlib.import_module("orjson")
    except ImportError:
        return None


_ORJSON: Any = _optional_orjson()


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Parse UTF-8 JSON text."""
    try:
        if _ORJSON is not None:
            return _ORJSON.loads(data)
        # The standard library does not take memoryviews; the copy is of the JSON header only.
        return json.loads(data.tobytes() if isinstance(data, memoryview) else data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise JsonDecodeError(str(exc)) from exc
    except RecursionError:
        raise JsonDecodeError("the JSON nests too deeply") from None


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (no spaces: responses are parsed by programs, not read by people)."""
    if _ORJSON is not None:
        encoded: bytes = _ORJSON.dumps(value)
        return encoded
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a client's string: escape it instead
        return json.dumps(value, separators=(",", ":")).encode("ascii")
