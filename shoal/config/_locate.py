"""Where each field of a ``config.pbtxt`` is written, so validation errors can name a line.

text_format in Python reports positions only for syntax errors. This module scans the text once
more (after text_format has accepted it) and records the line on which every field starts,
keyed by its field path (``("input", 1, "dims")``). Repeated fields are indexed in the order
they appear, which is the order text_format stores them in.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from .errors import FieldPath

_TOKEN = re.compile(
    r"""
    (?P<newline>\n)
  | (?P<space>[ \t\r\f\v]+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?)
  | (?P<word>[\w.+\-]+)
  | (?P<punct>.)
    """,
    re.VERBOSE,
)
_OPEN = {"{": "}", "<": ">"}


@dataclass(frozen=True)
class _Token:
    text: str
    line: int
    is_string: bool


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    line = 1
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind == "newline":
            line += 1
        elif kind not in ("space", "comment"):
            tokens.append(_Token(match.group(), line, kind == "string"))
    return tokens


class FieldLocations:
    """Line numbers of the fields of one parsed text-format message."""

    def __init__(self, text: str, descriptor: Descriptor) -> None:
        self._lines: dict[FieldPath, int] = {}
        self._tokens = _tokenize(text)
        self._pos = 0
        with contextlib.suppress(IndexError):  # text text_format rejected: keep what was indexed
            self._message(descriptor, (), closing=None)

    def line(self, field_path: FieldPath) -> int | None:
        """Line of ``field_path``, or of its nearest enclosing field that is written out.

        ``None`` when the path names an element of a repeated field that the text does not
        have (one added after parsing, say): no line of the file is about it.
        """
        for end in range(len(field_path), 0, -1):
            line = self._lines.get(field_path[:end])
            if line is not None:
                return line
            if isinstance(field_path[end - 1], int):
                return None
        return None

    def _peek(self) -> str:
        return self._tokens[self._pos].text

    def _take(self) -> _Token:
        token = self._tokens[self._pos]
        self._pos += 1
        return token

    def _message(self, descriptor: Descriptor, prefix: FieldPath, closing: str | None) -> None:
        counts: dict[str, int] = {}
        while self._pos < len(self._tokens):
            if self._peek() == closing:
                self._pos += 1
                return
            name = self._take()
            field = descriptor.fields_by_name.get(name.text)
            if field is None:  # extension syntax or a name text_format rejected: stop here
                self._pos = len(self._tokens)
                return
            if self._peek() == ":":
                self._pos += 1
            index = counts.get(field.name, 0)
            self._lines.setdefault((*prefix, field.name), name.line)
            if field.message_type is not None:
                counts[field.name] = self._message_values(
                    field, field.message_type, prefix, index, name.line
                )
            else:
                self._scalar_values()
            if self._pos < len(self._tokens) and self._peek() in (",", ";"):
                self._pos += 1

    def _message_values(
        self,
        field: FieldDescriptor,
        descriptor: Descriptor,
        prefix: FieldPath,
        index: int,
        line: int,
    ) -> int:
        listed = self._peek() == "["
        if listed:
            self._pos += 1
        while True:
            if listed and self._peek() == "]":
                self._pos += 1
                return index
            opening = self._take()
            path = (*prefix, field.name, index) if field.is_repeated else (*prefix, field.name)
            self._lines.setdefault(path, opening.line if listed else line)
            self._message(descriptor, path, closing=_OPEN.get(opening.text, "}"))
            index += 1
            if not listed:
                return index
            if self._peek() == ",":
                self._pos += 1

    def _scalar_values(self) -> None:
        if self._peek() == "[":
            while self._take().text != "]":
                pass
            return
        first = self._take()
        if first.is_string:  # adjacent string literals concatenate
            while self._pos < len(self._tokens) and self._tokens[self._pos].is_string:
                self._pos += 1
        elif first.text == "-":  # "- 1" written with a space
            self._pos += 1
