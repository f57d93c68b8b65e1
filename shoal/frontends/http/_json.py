"""JSON for the HTTP frontend: ``orjson``, with the standard library as a fallback.

``orjson`` is a dependency of shoal (several times faster than ``json`` on the request path); it
is looked up at import time through ``importlib`` so that shoal still works, more slowly, in an
environment that lacks it. orjson is stricter than ``json``: it refuses lone surrogate escapes
(``"\\ud800"``, not valid UTF-8 text) in a request as malformed JSON, and reads integer literals
beyond 64 bits as floats (:mod:`shoal.frontends.http._tensor_json` reports them as out of range).

Documents nested more than 1,024 levels deep are refused (orjson's limit), on every Python version.

NaN and infinities are written and read as Triton does (``NaN``, ``Infinity``, ``-Infinity``: not
standard JSON, but what Triton's rapidjson writes and reads, and what Python's ``json`` and
tritonclient read), instead of orjson's ``null``: see :func:`non_finite`.
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
#: How orjson's message begins for a document nested more than 1,024 levels deep.
_DEPTH_LIMIT = "depth limit exceeded"

_NON_FINITE_TEXT = {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}
#: What :func:`non_finite` returns, by ``repr`` of the float: orjson writes a Fragment as is.
_NON_FINITE: dict[str, Any] = {
    key: (_ORJSON.Fragment(text) if _ORJSON is not None else float(key))
    for key, text in _NON_FINITE_TEXT.items()
}
#: The same values as floats, for the standard library's encoder (which writes them alike).
_AS_FLOAT = {id(token): float(key) for key, token in _NON_FINITE.items()}


def non_finite(value: float) -> Any:
    """The JSON value to put in a document for a NaN or infinite ``value``."""
    return _NON_FINITE[repr(value)]


def _plain(value: Any) -> Any:
    if id(value) in _AS_FLOAT:
        return _AS_FLOAT[id(value)]
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Parse UTF-8 JSON text."""
    try:
        if _ORJSON is not None:
            try:
                return _ORJSON.loads(data)
            except ValueError as exc:
                if str(exc).startswith(_DEPTH_LIMIT):
                    # Refused here, not handed on: how deep the standard library's parser goes
                    # depends on the Python version (about 1,000 levels on 3.11, 1,500 on 3.12.1,
                    # 10,000 on 3.13).
                    raise
                # NaN and Infinity literals (Triton reads them): the standard library reads
                # those, and refuses the same other input orjson does.
                try:
                    return _std_loads(data)
                except ValueError:
                    raise exc from None
        return _std_loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise JsonDecodeError(str(exc)) from exc
    except RecursionError:
        raise JsonDecodeError("the JSON nests too deeply") from None


def _std_loads(data: bytes | bytearray | memoryview) -> Any:
    # The standard library does not take memoryviews; the copy is of the JSON header only.
    return json.loads(data.tobytes() if isinstance(data, memoryview) else data)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (no spaces: responses are parsed by programs, not read by people)."""
    if _ORJSON is not None:
        try:
            encoded: bytes = _ORJSON.dumps(value)
            return encoded
        except TypeError:  # orjson.JSONEncodeError: e.g. a lone surrogate quoted from a client
            pass
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_plain)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a client's string: escape it instead
        return json.dumps(value, separators=(",", ":"), default=_plain).encode("ascii")
