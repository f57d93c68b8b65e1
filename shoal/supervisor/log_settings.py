"""Triton's logging extension: settings read and changed at run time."""

from __future__ import annotations

import logging

from shoal.supervisor.errors import InvalidArgument, Unsupported
from shoal.supervisor.types import ParamValue

_BOOLS = ("log_info", "log_warning", "log_error")


class LogSettings:
    """The settings Triton exposes, applied to shoal's loggers."""

    def __init__(self, verbose: int = 0, log_file: str = "", log_format: str = "default") -> None:
        self._settings: dict[str, ParamValue] = {
            "log_file": log_file,
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": verbose,
            "log_format": log_format,
        }

    def current(self) -> dict[str, ParamValue]:
        return dict(self._settings)

    def update(self, changes: dict[str, ParamValue]) -> dict[str, ParamValue]:
        for key, value in changes.items():
            self._check(key, value)
        self._settings.update(changes)
        self._apply()
        return self.current()

    def _check(self, key: str, value: ParamValue) -> None:
        if key in _BOOLS:
            if not isinstance(value, bool):
                raise InvalidArgument(f"expect boolean for log setting '{key}', got {value!r}")
        elif key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(
                    f"expect a non-negative integer for 'log_verbose_level', got {value!r}"
                )
        elif key == "log_format":
            if value not in ("default", "ISO8601"):
                raise InvalidArgument(f"log_format must be 'default' or 'ISO8601', got {value!r}")
        elif key == "log_file":
            if value != self._settings["log_file"]:
                raise Unsupported("log file location can not be updated through network protocol")
        else:
            raise InvalidArgument(f"unknown log setting '{key}'")

    def _apply(self) -> None:
        s = self._settings
        if s["log_verbose_level"]:
            level = logging.DEBUG
        elif s["log_info"]:
            level = logging.INFO
        elif s["log_warning"]:
            level = logging.WARNING
        elif s["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 1
        logging.getLogger("shoal").setLevel(level)
