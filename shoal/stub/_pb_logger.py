"""``pb_utils.Logger``: model log messages forwarded to the server log."""

from __future__ import annotations

import datetime
import enum
import os
import sys
from collections.abc import Callable

#: ``sink(level, message, filename, lineno)``, installed by the stub runtime.
LogSink = Callable[[int, str, str, int], None]

_sink: LogSink | None = None


class LogLevel(enum.IntEnum):
    """Levels of ``Logger.log`` (Triton's ``Logger.LogLevel``)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LETTERS = {LogLevel.INFO: "I", LogLevel.WARNING: "W", LogLevel.ERROR: "E", LogLevel.VERBOSE: "I"}


def _set_log_sink(sink: LogSink | None) -> None:
    """Send log records to ``sink`` (``None``: back to Triton-format lines on stderr)."""
    global _sink
    _sink = sink


def _emit(message: object, level: object, depth: int) -> None:
    text, known = _checked(message, level)
    frame = sys._getframe(depth)
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    sink = _sink
    if sink is not None:
        sink(int(known), text, filename, lineno)
        return
    _to_stderr(known, text, filename, lineno)


def _checked(message: object, level: object) -> tuple[str, LogLevel]:
    if not isinstance(message, str):
        raise TypeError(f"log message must be a str, not {type(message).__name__}")
    if not isinstance(level, LogLevel):  # Triton's levels are an enum: a plain int is refused
        raise TypeError(f"log level must be a pb_utils.Logger level, not {level!r}")
    return message, level


def _to_stderr(level: LogLevel, message: str, filename: str, lineno: int) -> None:
    now = datetime.datetime.now()
    sys.stderr.write(
        f"{_LETTERS[level]}{now:%m%d %H:%M:%S.%f} {os.getpid()} "
        f"{os.path.basename(filename)}:{lineno}] {message}\n"
    )


class Logger:
    """Writes to the server log, tagged with the caller's file and line.

    Verbose messages are shown only when the server runs with verbose logging.
    """

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at ``level`` (``Logger.INFO`` by default)."""
        _emit(message, level, 2)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _emit(message, LogLevel.INFO, 2)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _emit(message, LogLevel.WARNING, 2)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _emit(message, LogLevel.ERROR, 2)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at VERBOSE."""
        _emit(message, LogLevel.VERBOSE, 2)
