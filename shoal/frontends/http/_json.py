"""JSON for the HTTP frontend: ``orjson``, with the standard library as a fallback.

``orjson`` is a dependency of shoal (several times faster than ``json`` on the request path); it
is looked up at import time through ``importlib`` so that shoal still works, more slowly, in an
environment that lacks it. orjson is stricter than ``json``: it refuses lone surrogate escapes
(``"\\ud800"``, not valid UTF-8 text) in a request as malformed JSON, and reads integer literals
beyond 64 bits as floats (:mod:`shoal.frontends.http._tensor_json` reports them as out of range).

Documents nested more than :data:`MAX_DEPTH` levels deep are refused before they are parsed
(:func:`check_depth`, at C speed with NumPy), on every Python version and with either parser.

NaN and infinities are written and read as Triton does (``NaN``, ``Infinity``, ``-Infinity``: not
standard JSON, but what Triton's rapidjson writes and reads, and what Python's ``json`` and
tritonclient read), instead of orjson's ``null``: see :func:`non_finite`.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from shoal.frontends.http._json_pieces import parse_in_pieces

#: The deepest nesting of arrays and objects accepted. A V2 request needs the document's four
#: levels plus one per dimension of a tensor written as nested lists, and NumPy has at most 64.
MAX_DEPTH = 100

_OPEN = 0x7B  # "{"; "[" is the same byte with 0x20 cleared
#: Every byte but brackets and quotes, for ``bytes.translate`` to delete.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
#: Passes of innermost-pair removal tried before NumPy measures the depth.
_LEAF_PASSES = 4
#: A string, once only brackets and unescaped quotes are left.
_STRINGS = re.compile(rb'"[^"]*"')


_T = TypeVar("_T")


class JsonDecodeError(ValueError):
    """The bytes are not valid JSON; ``str()`` says where and why."""


def _optional_orjson() -> Any:
    try:
        return importlib.import_module("orjson")
    except ImportError:
        return None


_ORJSON: Any = _optional_orjson()
#: orjson's parser, for a small document that needs none of :func:`loads`'s care (None
#: without orjson).
ORJSON_LOADS: Callable[[bytes], Any] | None = None if _ORJSON is None else _ORJSON.loads
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


#: Documents of this size or more are parsed in pieces where they can be
#: (:mod:`~shoal.frontends.http._json_pieces`): no single parser call then holds the GIL for
#: long, so that a large body decoded in a thread costs the other clients nothing.
LARGE = 1 << 20


def loads(data: bytes | bytearray | memoryview, *, numbers: bool = False) -> Any:
    """Parse UTF-8 JSON text. ``numbers``: in a large document, large arrays of numbers that are
    values of ``"data"`` keys come back as
    :class:`~shoal.frontends.http._json_pieces.NumberArray`, not lists."""
    check_depth(data)
    if len(data) >= LARGE:
        document = _loads_in_pieces(data, numbers)
        if document is not None:
            return document
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


def _loads_in_pieces(data: bytes | bytearray | memoryview, numbers: bool) -> Any | None:
    """What :func:`loads` returns, parsed in pieces (both parsers tried, as there); None
    where the document is not of that shape or is refused: the whole parse then says why."""
    data = _contents(data)
    if _ORJSON is not None:
        document = parse_in_pieces(data, _ORJSON.loads, numbers=numbers)
        if document is not None:
            return document
    return parse_in_pieces(data, _std_loads, numbers=numbers)


def _contents(data: bytes | bytearray | memoryview) -> bytes | bytearray:
    """``data`` as bytes or a bytearray: the object a view shows whole (a request body) as it
    is, since copying a large body is one call that holds the GIL."""
    if not isinstance(data, memoryview):
        return data
    whole = data.obj
    if isinstance(whole, bytes | bytearray) and data.contiguous and data.nbytes == len(whole):
        return whole
    return data.tobytes()


#: The GIL's switch interval while large JSON work runs in a thread (Python's default is 5 ms).
#: The event loop takes the GIL back at each of its callbacks and after each system call; with
#: a busy thread beside it, each such wait lasted up to the interval, and the few dozen waits of
#: one small request added up to 100-400 ms while a 40 MB JSON round trip ran (docs/hardening.md).
SWITCH_INTERVAL = 0.0002

_paused = 0
_was_enabled = False
_was_interval = 0.005
_pause_lock = threading.Lock()


def in_background(work: Callable[[], _T]) -> _T:
    """``work()`` (large JSON work, in a thread) with the cyclic garbage collector off and the
    GIL's switch interval at :data:`SWITCH_INTERVAL`, for the process, until the last such call
    ends. A full collection walks every element of every list in one call that holds the GIL,
    0.3 s for a document of 10 million values, and would stall every other client while a large
    body is decoded; reference counting still frees what is dropped, and cycles made meanwhile
    wait for the collector to be back on. The short interval hands the GIL back to the event
    loop soon after it asks."""
    global _paused
    with _pause_lock:
        if _paused == 0:
            _pause()
        _paused += 1
    try:
        return work()
    finally:
        with _pause_lock:
            _paused -= 1
            if _paused == 0:
                _resume()


def _pause() -> None:
    global _was_enabled, _was_interval
    _was_enabled, _was_interval = gc.isenabled(), sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(min(_was_interval, SWITCH_INTERVAL))


def _resume() -> None:
    sys.setswitchinterval(_was_interval)
    if _was_enabled:
        gc.enable()


def yield_gil() -> None:
    """Let the GIL go between two steps of large work in a thread, so that the event loop, if
    it waits for it, runs before the next step (each step is one C call that holds it)."""
    os.sched_yield()


def check_depth(data: bytes | bytearray | memoryview) -> None:
    """Refuse (JsonDecodeError) a document that nests arrays and objects past :data:`MAX_DEPTH`.

    The document is reduced, with C-speed bytes operations, to its brackets and quotes; fewer
    than the limit settle nearly every document at once. Otherwise the brackets outside strings
    are pruned of their innermost pairs a few times (the rows of a nested tensor), and only a
    document still deep after that is measured with NumPy: the depth is the highest running sum
    of openings and closings. Invalid JSON may be measured wrongly; the parser refuses it anyway.
    """
    data = _contents(data)
    if b"\\" in data:  # escaped backslashes and quotes are the only escapes that matter here
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = _structure(data)
    if len(structure) <= MAX_DEPTH:  # fewer brackets than the limit: nearly every document
        return
    structure = structure.replace(b'""', b"")  # strings without brackets: nearly all
    if b'"' in structure:
        structure = _STRINGS.sub(b"", structure)
    pruned = structure
    for passes in range(_LEAF_PASSES + 1):
        # Each pass drops innermost pairs (the rows of a nested tensor), "[]" then "{}": the
        # depth falls by at most two, so what is left after k passes bounds it, plus 2k.
        if pruned.count(b"[") + pruned.count(b"{") <= MAX_DEPTH - 2 * passes:
            return
        pruned = pruned.replace(b"[]", b"").replace(b"{}", b"")
    folded = np.frombuffer(structure, np.uint8) | 0x20  # "[" and "]" become "{" and "}"
    steps = (folded == _OPEN).astype(np.int64) * 2 - 1
    if int(np.cumsum(steps).max()) > MAX_DEPTH:
        raise JsonDecodeError(f"JSON nesting depth exceeds maximum allowed limit ({MAX_DEPTH})")


def _structure(data: bytes | bytearray) -> bytes | bytearray:
    """The brackets and quotes of ``data``; a large document a slice at a time (each call holds
    the GIL)."""
    if len(data) < LARGE:
        return data.translate(None, _NOT_STRUCTURE)
    return b"".join(
        data[at : at + LARGE].translate(None, _NOT_STRUCTURE) for at in range(0, len(data), LARGE)
    )


def _std_loads(data: bytes | bytearray | memoryview) -> Any:
    # The standard library does not take memoryviews; the copy is of the JSON header only.
    return json.loads(data.tobytes() if isinstance(data, memoryview) else data)


def array_pieces(chunks: Iterable[bytes]) -> list[bytes | memoryview] | None:
    """The pieces of a JSON array of the elements of ``chunks`` (each an array as :func:`dumps`
    writes it), in order, without joining them; None without orjson (``chunks`` is then not read).

    A large array is encoded a slice at a time this way: each call holds the GIL briefly."""
    if _ORJSON is None:
        return None
    parts: list[bytes | memoryview] = []
    for chunk in chunks:
        if len(chunk) > 2:  # "[]" adds nothing
            parts += [b",", memoryview(chunk)[1:-1]]
    parts[:1] = [b"["]  # in place of the first comma, if any
    parts.append(b"]")
    return parts


def fragment(pieces: list[bytes | memoryview]) -> Any:
    """``pieces`` (orjson's, :func:`array_pieces`) joined, to put in a document that
    :func:`dumps` writes as it is."""
    assert _ORJSON is not None
    return _ORJSON.Fragment(b"".join(pieces))


#: What stands in a document for an array given as pieces (:func:`dumps_around`): a NUL byte,
#: which orjson never writes raw (it escapes control characters in strings).
PLACEHOLDER: Any = _ORJSON.Fragment(b"\x00") if _ORJSON is not None else None


def dumps_around(document: Any, arrays: list[list[bytes | memoryview]]) -> list[bytes | memoryview]:
    """:func:`dumps` of ``document``, whose :data:`PLACEHOLDER` values stand for ``arrays`` in
    order, as pieces: the text around the arrays and the arrays' own pieces, none copied."""
    between = dumps(document).split(b"\x00")
    pieces: list[bytes | memoryview] = [between[0]]
    for array, after in zip(arrays, between[1:], strict=True):
        pieces += array
        pieces.append(after)
    return pieces


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
