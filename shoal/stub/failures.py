"""How a model's exception is told: a one-line summary for clients, a traceback for the log.

A client learns what went wrong (the exception and where in the model) without the server's
file paths; the log gets the traceback once, with shoal's own frames and importlib's left out,
so that it starts and ends in the model's code.
"""

from __future__ import annotations

import importlib
import os
import traceback

_SHOAL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__))


def _is_internal(filename: str) -> bool:
    """A frame of shoal itself or of the import machinery: noise in a model's traceback."""
    if filename.startswith("<frozen importlib"):
        return True
    path = os.path.abspath(filename)
    return any(path.startswith(d + os.sep) for d in (_SHOAL_DIR, _IMPORTLIB_DIR))


def _user_frames(error: BaseException) -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_tb(error.__traceback__) if not _is_internal(f.filename)]


def summary(error: BaseException) -> str:
    """``NameError: name 'x' is not defined (model.py line 3, in initialize)``: the exception
    and the innermost frame of the model's code, by file name only."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    frames = _user_frames(error)
    if frames and not isinstance(error, SyntaxError):  # a SyntaxError names its line itself
        last = frames[-1]
        text += f" ({os.path.basename(last.filename)} line {last.lineno}, in {last.name})"
    return text


def user_traceback(error: BaseException) -> str:
    """The traceback of ``error`` without shoal's and importlib's frames."""
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(_user_frames(error))
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines).rstrip()
