"""Triton's logging extension: settings read and changed at run time, and Triton's log lines.

The CLI configures the process's logging once from the ``--log-*`` flags (a
:class:`TritonFormatter` on stderr or ``--log-file``, and :func:`shoal_level`);
:class:`LogSettings` starts from the same flags and applies later changes.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import sys
from typing import TextIO

from shoal.core.errors import InvalidArgument, Unsupported
from shoal.core.types import ParamValue
from shoal.supervisor.options import ServerOptions

_BOOLS = ("log_info", "log_warning", "log_error")

#: Triton's ``--log-format`` values.
LOG_FORMATS = ("default", "ISO8601")

#: Triton's switch: ``0`` prints messages as they are, anything else (or unset) escapes them.
ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"

#: A record's text printed as it is under its (escaped) message, as Triton prints its tables:
#: ``log.info("models:", extra={LOG_BLOCK: table})``.
LOG_BLOCK = "log_block"

# What a JSON string must escape (quote, backslash, C0 controls), and what Triton's rapidjson
# leaves raw but shoal escapes too: DEL and C1 controls (terminal escapes: 0x9b is a CSI),
# the Unicode line separators some readers split lines on, and lone surrogates (undecodable
# bytes of a header, which a UTF-8 log file could not take). Each stays valid JSON.
_SPECIAL = re.compile(r'["\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT.get(char) or f"\\u{ord(char):04X}"


def json_string(text: str) -> str:
    """``text`` as a JSON string, as Triton escapes a log message (``TritonJson::SerializeString``:
    rapidjson's escapes, ``\\u001B`` in upper case): one line that no text can end early."""
    return '"' + _SPECIAL.sub(_escape, text) + '"'


def escape_wanted() -> bool:
    """Whether messages are escaped: Triton's default, unless ``TRITON_SERVER_ESCAPE_LOG_MESSAGES``
    is ``0``."""
    return os.environ.get(ESCAPE_VARIABLE) != "0"


class TritonFormatter(logging.Formatter):
    """Log lines with Triton's prefixes, timestamps in UTC as Triton's:

    * ``default``: ``I0215 21:04:11.572305 4242 server.py:123] message``
    * ``ISO8601``: ``2024-02-15T21:04:11Z I 4242 server.py:123] message``

    (level letter, time, process id, source file and line: a model's own log lines name its
    ``model.py`` line, given as the record's ``source``). Log tools that parse Triton's lines
    (its L0_logging regexes among them) read ``file:line]``. ``log_format`` may change while
    serving.

    With ``escape`` (Triton's default) the message, traceback included, is one JSON string: a
    client's text in it (a model or input name) cannot start a line that reads as a record of
    its own. A record's :data:`LOG_BLOCK` (a table) follows its escaped heading raw, on lines
    of its own, as Triton prints its tables and protobuf dumps.
    """

    def __init__(self, log_format: str = "default", escape: bool = True) -> None:
        super().__init__()
        self.log_format = log_format
        self.escape = escape

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        text = record.message
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        block = getattr(record, LOG_BLOCK, None)
        if self.escape and (text or block is None):
            text = json_string(text)
        if block is not None:
            text = f"{text}\n{block}"
        return f"{self._heading(record)}{text}"

    def _heading(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        level = _letter(record.levelno)
        if self.log_format == "ISO8601":
            prefix = f"{when:%Y-%m-%dT%H:%M:%SZ} {level}"
        else:
            prefix = f"{level}{when:%m%d %H:%M:%S.%f}"
        source = getattr(record, "source", None) or f"{record.filename}:{record.lineno}"
        return f"{prefix} {record.process} {source}] "


def _letter(levelno: int) -> str:
    """Triton's three letters: its verbose lines are I lines (a D would match no reader)."""
    if levelno >= logging.ERROR:
        return "E"
    return "W" if levelno >= logging.WARNING else "I"


def shoal_level(verbose: int, info: bool, warning: bool, error: bool) -> int:
    """The level of the ``shoal`` loggers for Triton's settings: the lowest level still on."""
    if verbose:
        return logging.DEBUG
    if info:
        return logging.INFO
    if warning:
        return logging.WARNING
    if error:
        return logging.ERROR
    return logging.CRITICAL + 1


class LogSettings:
    """The settings Triton exposes, applied to shoal's loggers."""

    def __init__(
        self,
        verbose: int = 0,
        log_file: str = "",
        log_format: str = "default",
        *,
        log_info: bool = True,
        log_warning: bool = True,
        log_error: bool = True,
    ) -> None:
        self._settings: dict[str, ParamValue] = {
            "log_file": log_file,
            "log_info": log_info,
            "log_warning": log_warning,
            "log_error": log_error,
            "log_verbose_level": verbose,
            "log_format": log_format,
        }

    @classmethod
    def from_options(cls, options: ServerOptions) -> LogSettings:
        """The settings the server started with (the ``--log-*`` flags)."""
        return cls(
            options.log_verbose,
            options.log_file,
            options.log_format,
            log_info=options.log_info,
            log_warning=options.log_warning,
            log_error=options.log_error,
        )

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
            if value not in LOG_FORMATS:
                raise InvalidArgument(f"log_format must be 'default' or 'ISO8601', got {value!r}")
        elif key == "log_file":
            if value != self._settings["log_file"]:
                raise Unsupported("log file location can not be updated through network protocol")
        else:
            raise InvalidArgument(f"unknown log setting '{key}'")

    def _apply(self) -> None:
        apply_log_settings(self._settings)


def apply_log_settings(settings: dict[str, ParamValue]) -> None:
    """Set this process's ``shoal`` loggers to ``settings`` (Triton's keys): the core applies
    a change, and each frontend worker applies what the core sends it."""
    level = shoal_level(
        int(settings["log_verbose_level"]),
        bool(settings["log_info"]),
        bool(settings["log_warning"]),
        bool(settings["log_error"]),
    )
    logging.getLogger("shoal").setLevel(level)
    _set_log_format(str(settings["log_format"]))


def _set_log_format(log_format: str) -> None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, TritonFormatter):
            handler.formatter.log_format = log_format


class ConsoleHandler(logging.StreamHandler[TextIO]):
    """Triton's console without ``--log-file``: INFO and verbose lines on stdout, warnings and
    errors on stderr (common's ``Logger::Log``), as are records marked ``stderr`` (a stub's
    stderr, which a Triton stub writes to the server's own stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        on_stderr = record.levelno >= logging.WARNING or getattr(record, "stderr", False)
        # Looked up at each line, not kept: whoever replaces sys.stdout/err is followed.
        self.stream = sys.stderr if on_stderr else sys.stdout
        super().emit(record)


def _log_handler(options: ServerOptions, opened: TextIO | None) -> logging.Handler:
    if opened is not None:
        return logging.StreamHandler(opened)
    if options.log_file:
        return logging.FileHandler(options.log_file, encoding="utf-8")
    return ConsoleHandler()


def configure_logging(options: ServerOptions, opened: TextIO | None = None) -> None:
    """Triton-style lines on stdout and stderr (:class:`ConsoleHandler`), or appended to
    ``--log-file`` (OSError if it cannot be opened; ``opened``: that file, opened already), at
    the level the ``--log-verbose/info/warning/error`` flags give. The core and every frontend
    worker configure their logging with it."""
    handler = _log_handler(options, opened)
    handler.setFormatter(TritonFormatter(options.log_format, escape_wanted()))
    level = shoal_level(
        options.log_verbose, options.log_info, options.log_warning, options.log_error
    )
    # Verbose is shoal's own lines, as Triton's: libraries' debug lines (hpack's, a few per
    # header of every gRPC call; grpcio's) would bury them and cost each request.
    logging.basicConfig(handlers=[handler], level=max(level, logging.INFO))
    logging.getLogger("shoal").setLevel(level)
