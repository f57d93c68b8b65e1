"""The request size limit (``--http-max-input-size``) and its error.

Triton answers an oversized request with HTTP 400 and a message that names the limit and the flag
that raises it; clients and tests match on "exceeds the maximum allowed value".
"""

from __future__ import annotations

from shoal.core import InvalidArgument

#: Triton's default ``--http-max-input-size``: 64 MiB.
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024


def too_large(limit: int, size: int | None = None, *, what: str = "Request") -> InvalidArgument:
    """The error for a body over ``limit`` bytes (``size`` when it is known)."""
    size_text = "" if size is None else f" of {size} bytes"
    return InvalidArgument(
        f"{what} size{size_text} exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )
