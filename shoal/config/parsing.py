"""Text-format parsing of ``config.pbtxt`` into a ModelConfig message, with located errors."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from google.protobuf import text_format

from shoal.protos import model_config_pb2 as pb

from .errors import ConfigError

_PACKAGE = pb.DESCRIPTOR.package + "."
_POSITION = re.compile(r"^\d+:\d+ : ")
_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
# Spellings people reach for instead of Triton's DataType names.
_DTYPE_ALIASES = {
    "BYTES": "TYPE_STRING",
    "STRING": "TYPE_STRING",
    "STR": "TYPE_STRING",
    "FLOAT": "TYPE_FP32",
    "FLOAT32": "TYPE_FP32",
    "FLOAT16": "TYPE_FP16",
    "HALF": "TYPE_FP16",
    "DOUBLE": "TYPE_FP64",
    "FLOAT64": "TYPE_FP64",
    "BFLOAT16": "TYPE_BF16",
    "INT": "TYPE_INT32",
    "LONG": "TYPE_INT64",
}


def parse_config_text(text: str, *, path: str | Path | None = None) -> pb.ModelConfig:
    """Parse text-format ModelConfig ``text`` (the contents of a ``config.pbtxt``).

    Only parses: no defaults are filled and nothing is validated. A syntax error, an unknown
    field or enum value, or a value of the wrong type raises :class:`ConfigError` with the
    ``path``, line and column of the problem and, where it can, the name that was meant.
    """
    message = pb.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise _parse_error(exc, text, path) from None
    return message


def _parse_error(exc: text_format.ParseError, text: str, path: str | Path | None) -> ConfigError:
    line, column = exc.GetLine(), exc.GetColumn()
    detail = _POSITION.sub("", str(exc), count=1)
    if line is not None and detail.startswith("'"):
        detail = _without_source(detail, text, line)
    detail = detail.replace(_PACKAGE, "").rstrip(".")
    message = f"{detail}{_hint(detail)}"
    return ConfigError(message, path=path, line=line, column=column)


def _without_source(detail: str, text: str, line: int) -> str:
    """``detail`` without the quoted source line protobuf puts in front of some messages."""
    lines = text.splitlines()
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    quoted = f"'{source}': "
    return detail[len(quoted) :] if detail.startswith(quoted) else detail


def _hint(detail: str) -> str:
    if match := _NO_FIELD.search(detail):
        descriptor = pb.DESCRIPTOR.pool.FindMessageTypeByName(_PACKAGE + match.group(1))
        fields = [field.name for field in descriptor.fields]
        return _suggest(match.group(2), fields, "fields", quote=True)
    if match := _NO_VALUE.search(detail):
        enum = pb.DESCRIPTOR.pool.FindEnumTypeByName(_PACKAGE + match.group(1))
        names = [v.name for v in enum.values]
        wrong = match.group(2)
        if enum.full_name == _PACKAGE + "DataType":
            alias = _DTYPE_ALIASES.get(wrong.upper().removeprefix("TYPE_"))
            alias = alias or ("TYPE_" + wrong.upper() if "TYPE_" + wrong.upper() in names else None)
            if alias == "TYPE_STRING":
                return '; did you mean TYPE_STRING? (TYPE_STRING is the type of "BYTES" tensors)'
            if alias is not None and alias != "TYPE_INVALID":
                return f"; did you mean {alias}?"
            names = [name for name in names if name != "TYPE_INVALID"]
        return _suggest(wrong, names, "values")
    return ""


def _suggest(wrong: str, names: list[str], what: str, *, quote: bool = False) -> str:
    mark = '"' if quote else ""
    close = difflib.get_close_matches(wrong, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {mark}{close[0]}{mark}?"
    return f"; the {what} are: {', '.join(names)}"


__all__ = ["parse_config_text"]
