"""Triton's trace extension: the body of ``POST /v2[/models/{m}]/trace/setting``.

The request is an object of settings; ``null`` clears a model's setting (it follows the global
one again). ``trace_level`` is a list of strings (a single string is accepted); the other
settings are strings holding integers or paths. The core checks names and values.
"""

from __future__ import annotations

from shoal.core import InvalidArgument, TraceChange
from shoal.frontends.http._document import parse_object


def parse_trace_settings(body: bytes | bytearray | memoryview) -> dict[str, TraceChange]:
    """The settings to change; an empty body changes nothing."""
    changes: dict[str, TraceChange] = {}
    for key, value in parse_object(body).items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            changes[key] = [str(v) for v in value]
        elif value is None or (isinstance(value, str | int) and not isinstance(value, bool)):
            changes[key] = value
        else:
            raise InvalidArgument(
                f"Unable to parse '{key}': expected a string, a list of strings or null"
            )
    return changes
