"""The binary section of an infer body: slicing it per input and checking each slice.

Slices are views of the request body, never copies: the core copies them once, into shared memory.
Fixed-size tensors must hold exactly shape x element size bytes; BYTES tensors stay serialized
(4-byte little-endian length + bytes per element) but every length prefix is checked here, so a
malformed buffer is a 400 for the client and never reaches a model.
"""

from __future__ import annotations

import struct
from typing import Final

from shoal.core import InvalidArgument, byte_size, element_count

_LENGTH: Final = struct.Struct("<I")


class BinarySection:
    """The bytes after the JSON header, handed out in input order."""

    def __init__(self, data: memoryview, model_name: str, *, has_header: bool) -> None:
        self.model_name = model_name
        self._data = data
        self._offset = 0
        self._has_header = has_header

    def take(self, name: str, size: int) -> memoryview:
        """The next ``size`` bytes, for input ``name``."""
        if size > 0 and not self._has_header:
            raise InvalidArgument(
                "must specify valid 'Infer-Header-Content-Length' in request header and "
                f"'binary_data_size' when passing inputs in binary data format (input '{name}')"
            )
        start, end = self._offset, self._offset + size
        if end > len(self._data):
            raise InvalidArgument(
                f"unexpected size for input '{name}', expecting {end - len(self._data)} "
                f"additional bytes for model '{self.model_name}'"
            )
        self._offset = end
        return self._data[start:end]

    def finish(self) -> None:
        """Every byte must belong to an input."""
        extra = len(self._data) - self._offset
        if extra:
            raise InvalidArgument(
                f"unexpected additional input data for model '{self.model_name}': "
                f"{extra} bytes after the last binary input"
            )


def check_binary_input(
    name: str, datatype: str, shape: tuple[int, ...], data: memoryview, model_name: str
) -> None:
    """Check that ``data`` is a well-formed V2 tensor of ``datatype`` and ``shape``."""
    expected = byte_size(datatype, shape)
    if expected is None:
        _check_serialized_bytes(name, shape, data, model_name)
    elif len(data) != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {expected}, got {len(data)}"
        )


def _check_serialized_bytes(
    name: str, shape: tuple[int, ...], data: memoryview, model_name: str
) -> None:
    expected = element_count(shape)
    count = count_serialized_elements(data)
    if count is None:
        raise InvalidArgument(
            f"element byte size indicator exceeds the end of the buffer for input '{name}' "
            f"for model '{model_name}'"
        )
    where = f"for inference input '{name}' for model '{model_name}'"
    if count > expected:  # Triton stops at the first element too many and counts it
        raise InvalidArgument(
            f"unexpected number of string elements {expected + 1} {where}, expecting {expected}"
        )
    if count != expected:
        raise InvalidArgument(f"expected {expected} string elements {where}, got {count}")


def count_serialized_elements(data: memoryview) -> int | None:
    """Elements in a serialized BYTES buffer, or ``None`` if a length runs past its end.

    Walks the length prefixes only; no element is copied.
    """
    total = len(data)
    offset = count = 0
    while offset < total:
        if offset + _LENGTH.size > total:
            return None
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size + length
        if offset > total:
            return None
        count += 1
    return count
