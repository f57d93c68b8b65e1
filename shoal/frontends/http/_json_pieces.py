"""Large JSON documents parsed in pieces, so that no single parser call holds the GIL for long.

A JSON parser reads a document in one C call that holds the GIL: 40 MB of numbers kept every
other client of the process waiting for 1-2 s, even with the parse in a thread. The bulk of a
large infer body is its tensors' ``data`` arrays of numbers. :func:`parse_in_pieces` finds those
arrays with C-speed ``bytes`` searches, parses the rest of the document (the skeleton: each
array replaced with a marker string) and then each array in slices of about :data:`PIECE` bytes
cut at its top-level commas, and puts the arrays back where the markers are. The result is the
document the parser returns for the whole (a parser reads a value the same wherever it stands),
and the GIL comes back between the calls. A document of another shape (no such array, an array
holding strings or objects, nested rows written with spaces between them) or one the parser
refuses anywhere gives None: the caller parses the whole as before, so that errors are the
whole parse's errors, word for word.

With ``numbers=True`` each such array comes back as a :class:`NumberArray`: every piece made a
NumPy array as soon as it is parsed, so that the tensor is never a list of millions of Python
numbers (each list then cost a call that held the GIL to convert, and another to free).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MIN_ARRAY", "PIECE", "NumberArray", "parse_in_pieces"]

#: Bytes of an array parsed by one call (a few milliseconds of the GIL).
PIECE = 1 << 17
#: Arrays shorter than this stay in the skeleton.
MIN_ARRAY = 1 << 16

_KEY = b'"data"'
_SPACE = frozenset(b" \t\r\n")
#: Whitespace skipped between the key, the colon and the array (more: not this shape).
_MAX_SPACE = 64
_BACKSLASH, _COLON, _OPEN = 0x5C, 0x3A, 0x5B

Parse = Callable[[bytes], Any]
#: Where an array is: its ``[``, the end of its last ``]``, and how deep its rows nest.
_Span = tuple[int, int, int]
#: What NumPy makes of a list of JSON numbers and booleans alone.
_NUMBER_KINDS = frozenset("biuf")


@dataclass(eq=False)
class NumberArray:
    """A large JSON array of numbers (a ``data`` value), parsed piece by piece.

    ``pieces``: ``np.asarray`` of each piece's list, in order, or None where some piece is not an
    array of numbers (uneven rows, a null). :meth:`tolist` is the list the parser reads.
    """

    source: bytes | bytearray
    span: _Span
    parse: Parse
    pieces: list[np.ndarray] | None

    def tolist(self) -> list[Any]:
        """The array as the parser reads it (parsed again, in pieces)."""
        values: list[Any] = []
        for piece in _pieces(self.source, self.span):
            values += self.parse(piece)
        return values


def parse_in_pieces(data: bytes | bytearray, parse: Parse, *, numbers: bool = False) -> Any | None:
    """``parse(data)``, in pieces; None where the document is not of that shape or ``parse``
    refuses any piece (ValueError). ``numbers``: the arrays as :class:`NumberArray`."""
    spans = _arrays(data)
    if not spans:
        return None
    nonce = secrets.token_hex(8)  # a client cannot send the markers of a request
    markers = {f"{nonce}:{index}": index for index in range(len(spans))}
    parts: list[bytes | bytearray] = []
    at = 0
    for marker, (start, end, _) in zip(markers, spans, strict=True):
        parts += [data[at:start], f'"{marker}"'.encode()]
        at = end
    parts.append(data[at:])
    try:
        skeleton = parse(b"".join(parts))
        read = _number_array if numbers else _parse_array
        arrays = [read(data, span, parse) for span in spans]
    except ValueError:
        return None
    # Each marker must be back in its place exactly once: a marker that is not there means a
    # "data" key the search misread (a duplicate key, say).
    if _put_back(skeleton, markers, arrays) != len(spans):
        return None
    return skeleton


def _arrays(data: bytes | bytearray) -> list[_Span]:
    """The large arrays of numbers that are values of ``"data"`` keys, in order."""
    spans = []
    at = data.find(_KEY)
    while at >= 0:
        span = _array_at(data, at)
        if span is None:
            at = data.find(_KEY, at + 1)
        else:
            spans.append(span)
            at = data.find(_KEY, span[1])
    return spans


def _array_at(data: bytes | bytearray, key: int) -> _Span | None:
    # An unescaped quote opens a string: "data" followed by a colon is a key. (A quote after an
    # escaped backslash is passed over: the whole parse takes that document.)
    if key > 0 and data[key - 1] == _BACKSLASH:
        return None
    colon = _skip_space(data, key + len(_KEY))
    if colon < 0 or data[colon] != _COLON:
        return None
    start = _skip_space(data, colon + 1)
    if start < 0 or data[start] != _OPEN:
        return None
    depth = 1
    while start + depth < len(data) and data[start + depth] == _OPEN:
        depth += 1
    # The rows of a tensor nest evenly: only its end closes ``depth`` brackets in a row.
    close = data.find(b"]" * depth, start)
    if close < 0:
        return None
    end = close + depth
    if end - start < MIN_ARRAY or data.find(b'"', start, end) >= 0:
        return None
    if data.find(b"{", start, end) >= 0:
        return None
    return start, end, depth


def _skip_space(data: bytes | bytearray, at: int) -> int:
    """The first byte at or after ``at`` that is not whitespace, or -1."""
    for index in range(at, min(at + _MAX_SPACE, len(data))):
        if data[index] not in _SPACE:
            return index
    return -1


def _pieces(data: bytes | bytearray, span: _Span) -> Iterator[bytes]:
    """The array at ``span`` in pieces of about :data:`PIECE` bytes, each an array of its own,
    cut at its top-level commas: where rows nest ``depth`` deep, a comma between two top-level
    elements stands between ``depth - 1`` closing and as many opening brackets. A cut anywhere
    else leaves a piece unbalanced, which the parser refuses."""
    start, end, depth = span
    separator = b"]" * (depth - 1) + b"," + b"[" * (depth - 1)
    at, stop = start + 1, end - 1
    while True:
        cut = data.find(separator, at + PIECE, stop) if at + PIECE < stop else -1
        if cut < 0:
            yield b"[" + data[at:stop] + b"]"
            return
        cut += depth - 1  # the comma
        yield b"[" + data[at:cut] + b"]"
        at = cut + 1


def _parse_array(data: bytes | bytearray, span: _Span, parse: Parse) -> list[Any]:
    values: list[Any] = []
    for piece in _pieces(data, span):
        values += parse(piece)
    return values


def _number_array(data: bytes | bytearray, span: _Span, parse: Parse) -> NumberArray:
    """The array at ``span`` with each piece made a NumPy array as soon as it is parsed (every
    piece is parsed, so that an error anywhere is found here, as in :func:`_parse_array`)."""
    pieces: list[np.ndarray] | None = []
    for piece in _pieces(data, span):
        os.sched_yield()  # the GIL to the event loop if it waits (as _json.yield_gil)
        values = parse(piece)
        if pieces is None:
            continue
        try:
            array = np.asarray(values)
        except (ValueError, TypeError, OverflowError):  # uneven rows
            pieces = None
            continue
        if array.dtype.kind in _NUMBER_KINDS:
            pieces.append(array)
        else:  # null, or integers past 64 bits NumPy keeps as objects
            pieces = None
    return NumberArray(data, span, parse, pieces)


def _put_back(node: Any, markers: dict[str, int], arrays: list[Any]) -> int:
    """Replace each marker that is the value of a ``"data"`` key; how many were."""
    found = 0
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "data" and isinstance(value, str) and value in markers:
                node[key] = arrays[markers[value]]
                found += 1
            elif isinstance(value, dict | list):
                found += _put_back(value, markers, arrays)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, dict | list):
                found += _put_back(item, markers, arrays)
    return found
