"""``TritonError`` (an error value a model puts in a response) and ``TritonModelException``."""

from __future__ import annotations

import enum
from typing import Any


class _ErrorCode(enum.IntEnum):
    """Values of Triton's ``TRITONSERVER_Error_Code``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class _ReadOnlyCodes(type):
    """Metaclass that keeps ``TritonError``'s code attributes read-only, as in Triton."""

    def __setattr__(cls, name: str, value: Any) -> None:
        if name in _ErrorCode.__members__:
            raise AttributeError(f"TritonError.{name} is read-only")
        super().__setattr__(name, value)


class TritonModelException(Exception):
    """Raised by ``pb_utils`` when a model misuses the API (bad argument, sender misuse, ...).

    Models may raise it too. Recoverable: an exception escaping ``execute`` becomes an error
    response for the requests of that batch; the instance stays up.
    """


class TritonError(metaclass=_ReadOnlyCodes):
    """An error a model reports for one request: ``InferenceResponse(error=TritonError(...))``.

    Not an exception (as in Triton): models construct it and hand it to a response. The code
    reaches the client; it defaults to ``TritonError.INTERNAL``.
    """

    #: The enum type of the codes (Triton's ``TritonError.__ErrorCode``).
    ErrorCode = _ErrorCode
    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    __slots__ = ("_code", "_message")

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        if not isinstance(message, str):
            raise TypeError(f"TritonError message must be a str, not {type(message).__name__}")
        if isinstance(code, bool) or not isinstance(code, int):
            raise TypeError(f"TritonError code must be a TritonError code, not {code!r}")
        try:
            self._code = _ErrorCode(code)
        except ValueError:
            raise TypeError(f"TritonError code must be a TritonError code, not {code!r}") from None
        self._message = message

    def message(self) -> str:
        """The error message."""
        return self._message

    def code(self) -> _ErrorCode:
        """The error code (one of the ``TritonError`` code attributes)."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code=TritonError.{self._code.name})"

    def __str__(self) -> str:
        return self._message
