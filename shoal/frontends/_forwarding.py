"""``--http-header-forward-pattern`` and ``--grpc-header-forward-pattern``: the headers (gRPC
metadata) of an inference request whose names match become string parameters of the request,
which a model reads with ``request.parameters()``, as in Triton (docs/protocol/
extension_parameters.md there). Both frontends use :class:`HeaderForward` alike."""

from __future__ import annotations

import re
from collections.abc import Iterable

from shoal.core import InvalidArgument

#: Parameters Triton keeps for itself (``kReservedParameterKeys``): a header of one of these
#: names, or starting with ``triton_``, is refused rather than forwarded.
RESERVED = frozenset(
    (
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
    )
)

#: Turns case-insensitive matching off, in RE2's syntax (Triton's), at the pattern's start.
CASE_SENSITIVE = "(?-i)"


def compile_header_pattern(pattern: str) -> re.Pattern[str]:
    """The pattern as Triton reads it: case-insensitive (header names are), unless it starts
    with ``(?-i)``, which Python's ``re`` does not take as a global flag."""
    if pattern.startswith(CASE_SENSITIVE):
        return re.compile(pattern[len(CASE_SENSITIVE) :])
    return re.compile(pattern, re.IGNORECASE)


class HeaderForward:
    """The headers one frontend forwards; a pattern found anywhere in a name matches it (RE2's
    PartialMatch, as Triton)."""

    def __init__(self, pattern: str) -> None:
        self._regex = compile_header_pattern(pattern)

    def matching(self, headers: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
        """The parameters ``headers`` give; InvalidArgument for a reserved name."""
        found: dict[str, str] = {}
        for name, value in headers:
            if not self._regex.search(name):
                continue
            if name.lower() in RESERVED or name.lower().startswith("triton_"):
                raise InvalidArgument(
                    f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
                )
            found[name] = value.decode("latin-1") if isinstance(value, bytes) else value
        return found


def header_forward(pattern: str) -> HeaderForward | None:
    """The forwarding of a ``--*-header-forward-pattern`` ("" forwards nothing)."""
    return HeaderForward(pattern) if pattern else None
