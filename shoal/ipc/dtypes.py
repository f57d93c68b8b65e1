"""KServe V2 datatypes: NumPy mapping, element sizes and the BYTES codec.

BYTES tensors use Triton's serialized layout: for every element, a 4-byte little-endian length
followed by that many bytes. Encoding and decoding avoid per-element Python work beyond what
building Python ``bytes`` objects needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: V2 datatype name -> NumPy dtype (little-endian). BF16 travels as raw 16-bit words.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(np.object_),
}

DATATYPES: tuple[str, ...] = tuple(NUMPY_DTYPES)

_LENGTH = np.dtype("<u4")


class BytesFormatError(ValueError):
    """A serialized BYTES buffer is malformed (a length prefix runs past the end, or extra bytes)."""


def element_size(datatype: str) -> int | None:
    """Bytes per element, or ``None`` for BYTES (variable length)."""
    if datatype == "BYTES":
        return None
    return NUMPY_DTYPES[datatype].itemsize


def element_count(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of ``shape`` (1 for a scalar shape ``()``)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def byte_size(datatype: str, shape: Sequence[int]) -> int | None:
    """Byte size of a fixed-size tensor, or ``None`` for BYTES."""
    size = element_size(datatype)
    return None if size is None else size * element_count(shape)


def numpy_to_datatype(dtype: np.dtype) -> str:
    """V2 datatype of a NumPy dtype; object, bytes and str arrays are BYTES."""
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, candidate in NUMPY_DTYPES.items():
        if name != "BF16" and candidate == dtype.newbyteorder("<"):
            return name
    raise TypeError(f"NumPy dtype {dtype} has no KServe V2 datatype")


def _as_bytes_items(array: np.ndarray) -> list[bytes]:
    flat = array.reshape(-1)
    if array.dtype.kind == "S":
        return flat.tolist()  # type: ignore[no-any-return]
    if array.dtype.kind == "U":
        return [item.encode("utf-8") for item in flat.tolist()]
    items: list[bytes] = []
    for item in flat.tolist():
        if isinstance(item, bytes):
            items.append(item)
        elif isinstance(item, str):
            items.append(item.encode("utf-8"))
        else:
            items.append(str(item).encode("utf-8"))
    return items


def serialize_bytes(array: np.ndarray) -> bytes:
    """Serialize a BYTES array (object of bytes/str, ``S`` or ``U``) in row-major order."""
    items = _as_bytes_items(array)
    if not items:
        return b""
    lengths = np.fromiter(map(len, items), dtype=_LENGTH, count=len(items))
    # Interleave prefixes and payloads with one join: prefix_i + item_i for every element.
    prefixes = lengths.tobytes()
    parts: list[bytes] = [b""] * (2 * len(items))
    parts[0::2] = [prefixes[4 * i : 4 * i + 4] for i in range(len(items))]
    parts[1::2] = items
    return b"".join(parts)


def serialized_bytes_size(array: np.ndarray) -> int:
    """Size in bytes of :func:`serialize_bytes` of ``array``."""
    items = _as_bytes_items(array)
    return 4 * len(items) + sum(map(len, items))


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Decode a serialized BYTES buffer into a 1-D object array of ``bytes``.

    With ``count``, exactly that many elements must fill the whole buffer; otherwise the buffer is
    read to its end. Every length prefix is validated.
    """
    view = memoryview(buffer).cast("B")
    total = len(view)
    items: list[bytes] = []
    offset = 0
    raw = view.tobytes() if not isinstance(buffer, bytes) else buffer
    while offset < total and (count is None or len(items) < count):
        if offset + 4 > total:
            raise BytesFormatError(
                f"BYTES element {len(items)}: length prefix at byte {offset} is cut off "
                f"(buffer has {total} bytes)"
            )
        length = int.from_bytes(raw[offset : offset + 4], "little")
        start = offset + 4
        end = start + length
        if end > total:
            raise BytesFormatError(
                f"BYTES element {len(items)}: length {length} at byte {offset} runs past the end "
                f"of the {total}-byte buffer"
            )
        items.append(raw[start:end])
        offset = end
    if count is not None and len(items) != count:
        raise BytesFormatError(f"BYTES buffer holds {len(items)} elements, expected {count}")
    if offset != total:
        raise BytesFormatError(
            f"BYTES buffer has {total - offset} bytes left after {len(items)} elements"
        )
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result
