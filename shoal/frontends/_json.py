"""JSON for the HTTP frontend: ``orjson``, with the standard library as a fallback.

``orjson`` is a dependency of shoal (several times faster than ``json`` on the request path); it
is looked up at import time through ``importlib`` so that shoal still works, more slowly, in an
environment that lacks it. orjson is stricter than ``json``: it refuses lone surrogate escapes
(``"\\ud800"``, not valid UTF-8 text) in a request as malformed JSON, and reads integer literals
beyond 64 bits as floats (:mod:`shoal.frontends._tensor_json` reports them as out of range).
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
        try:
            encoded: bytes = _ORJSON.dumps(value)
            return encoded
        except TypeError:  # orjson.JSONEncodeError: e.g. a lone surrogate quoted from a client
            pass
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a client's string: escape it instead
        return json.dumps(value, separators=(",", ":")).encode("ascii")
