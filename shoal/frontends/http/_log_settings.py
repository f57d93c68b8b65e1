"""Triton's logging extension: the body of ``POST /v2/logging``.

The request is an object of settings (``log_file``, ``log_info``, ``log_warning``, ``log_error``,
``log_verbose_level``, ``log_format``). A ``null`` value leaves that setting as it is, as in Triton;
every other value must be a boolean, an integer or a string and goes to the core, which checks the
names and values and applies them.
"""

from __future__ import annotations

from shoal.core import InvalidArgument, ParamValue
from shoal.frontends.http._document import parse_object


def parse_log_settings(body: bytes | bytearray | memoryview) -> dict[str, ParamValue]:
    """The settings to change; an empty body changes nothing."""
    settings: dict[str, ParamValue] = {}
    for key, value in parse_object(body).items():
        if value is None:
            continue
        if not isinstance(value, bool | int | str):
            raise InvalidArgument(
                f"Unable to parse '{key}': expected a boolean, an integer or a string"
            )
        settings[key] = value
    return settings
