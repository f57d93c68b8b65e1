"""KServe V2 datatypes: NumPy mapping, element sizes and the BYTES codec.

BYTES tensors use Triton's serialized layout: for every element, a 4-byte little-endian length
followed by that many bytes. Encoding and decoding avoid per-element Python work beyond what
building Python ``bytes`` objects needs: prefixes and payloads are placed with NumPy scatter
operations, and a tensor whose elements all have one length is decoded without any Python loop.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

#: V2 datatype name -> NumPy dtype (little-endian). BF16 travels as raw 16-bit words.
NUMPY_DTYPES: Final[dict[str, np.dtype]] = {
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

DATATYPES: Final[tuple[str, ...]] = tuple(NUMPY_DTYPES)

#: Bytes per element of each fixed-size datatype: read per input of every request, where a
#: NumPy dtype's ``itemsize`` is a generic attribute lookup.
_ITEM_SIZES: Final[dict[str, int]] = {
    name: dtype.itemsize for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"
}

_LENGTH: Final = np.dtype("<u4")


class BytesFormatError(ValueError):
    """A serialized BYTES buffer is malformed: a length prefix runs past the end, or bytes are
    left over."""


def element_size(datatype: str) -> int | None:
    """Bytes per element, or ``None`` for BYTES (variable length)."""
    if datatype == "BYTES":
        return None
    return _ITEM_SIZES[datatype]


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
    # Every output tensor of every response asks: remember the answer per dtype.
    found = _DATATYPE_OF.get(dtype)
    if found is None:
        found = _DATATYPE_OF[dtype] = _lookup_datatype(dtype)
    return found


_DATATYPE_OF: Final[dict[np.dtype, str]] = {}


def _lookup_datatype(dtype: np.dtype) -> str:
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, candidate in NUMPY_DTYPES.items():
        if name != "BF16" and candidate == dtype.newbyteorder("<"):
            return name
    raise TypeError(f"NumPy dtype {dtype} has no KServe V2 datatype")


_U32: Final = struct.Struct("<I")
# Below this many elements, or above this mean element length, per-element slice copies are cheaper
# than building the NumPy index arrays of the vectorised paths.
_SMALL_COUNT: Final = 64
_LARGE_ITEM: Final = 1024


def _as_bytes_items(array: np.ndarray) -> list[bytes]:
    flat = array.reshape(-1)
    if array.dtype.kind == "S":
        return flat.tolist()
    if array.dtype.kind == "U":
        return [item.encode("utf-8") for item in flat.tolist()]
    items: list[Any] = flat.tolist()  # objects of any type until checked
    if set(map(type, items)) <= {bytes}:
        return items
    return [_to_bytes(item) for item in items]


def _to_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    return str(item).encode("utf-8")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Serialize a BYTES array (object of bytes/str, ``S`` or ``U``) in row-major order."""
    items = _as_bytes_items(array)
    out = bytearray(4 * len(items) + sum(map(len, items)))
    _place(items, np.frombuffer(out, dtype=np.uint8))
    return bytes(out)


def serialize_bytes_into(array: np.ndarray, dest: memoryview) -> None:
    """Serialize a BYTES array straight into ``dest``, which must be exactly the right size."""
    items = _as_bytes_items(array)
    needed = 4 * len(items) + sum(map(len, items))
    if dest.nbytes != needed:
        raise ValueError(
            f"BYTES tensor of shape {list(array.shape)} needs {needed} bytes serialized, "
            f"the destination holds {dest.nbytes}"
        )
    if needed:
        _place(items, np.frombuffer(dest, dtype=np.uint8))


def _place(items: list[bytes], out: np.ndarray) -> None:
    """Write prefix + payload for every item into ``out`` (exactly the serialized size)."""
    count = len(items)
    if not count:
        return
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=count)
    if int(np.max(lengths)) >= 1 << 32:
        raise ValueError("a BYTES element is longer than a 4-byte length prefix allows")
    payload = np.frombuffer(b"".join(items), dtype=np.uint8)
    prefixes = lengths.astype(_LENGTH).view(np.uint8).reshape(count, 4)
    first = int(lengths[0])
    if bool((lengths == first).all()):
        rows = out.reshape(count, 4 + first)
        rows[:, :4] = prefixes
        rows[:, 4:] = payload.reshape(count, first)
        return
    starts = np.zeros(count, dtype=np.int64)
    np.cumsum(lengths[:-1] + 4, out=starts[1:])
    if count <= _SMALL_COUNT or payload.size >= _LARGE_ITEM * count:
        _place_each(items, starts, prefixes, out)
        return
    prefix_at = (starts[:, None] + np.arange(4)).reshape(-1)
    out[prefix_at] = prefixes.reshape(-1)
    is_payload = np.ones(out.size, dtype=np.bool_)
    is_payload[prefix_at] = False
    out[is_payload] = payload


def _place_each(
    items: list[bytes], starts: np.ndarray, prefixes: np.ndarray, out: np.ndarray
) -> None:
    view = out.data
    for index, (start, item) in enumerate(zip(starts.tolist(), items, strict=True)):
        view[start : start + 4] = prefixes[index].tobytes()
        view[start + 4 : start + 4 + len(item)] = item


def serialized_bytes_size(array: np.ndarray) -> int:
    """Size in bytes of :func:`serialize_bytes` of ``array``."""
    items = _as_bytes_items(array)
    return 4 * len(items) + sum(map(len, items))


def deserialize_bytes(
    buffer: bytes | bytearray | memoryview, count: int | None = None
) -> np.ndarray:
    """Decode a serialized BYTES buffer into a 1-D object array of ``bytes``.

    With ``count``, exactly that many elements must fill the whole buffer; otherwise the buffer is
    read to its end. Every length prefix is validated.
    """
    raw = buffer if isinstance(buffer, bytes) else memoryview(buffer).cast("B").tobytes()
    items = _decode_uniform(raw, count)
    if items is None:
        items = _decode_walk(raw, count)
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def _decode_uniform(raw: bytes, count: int | None) -> list[bytes] | None:
    """Vectorised decode when every element has the first element's length; else None."""
    total = len(raw)
    if total < 4 or (count is not None and count < _SMALL_COUNT):
        return None
    first = _U32.unpack_from(raw, 0)[0]
    record = 4 + first
    if total % record or (count is not None and total // record != count):
        return None
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(total // record, record)
    prefixes = np.ascontiguousarray(rows[:, :4]).view(_LENGTH).reshape(-1)
    if not bool((prefixes == first).all()):
        return None
    if first == 0:
        return [b""] * len(prefixes)
    payloads = np.ascontiguousarray(rows[:, 4:]).view(f"V{first}").reshape(-1)
    return payloads.tolist()


def _decode_walk(raw: bytes, count: int | None) -> list[bytes]:
    total = len(raw)
    unpack = _U32.unpack_from
    items: list[bytes] = []
    append = items.append
    offset = 0
    # Every element takes at least its 4-byte prefix, which bounds an unknown count.
    for index in range((total + 3) // 4 if count is None else count):
        if offset == total:
            break
        if offset + 4 > total:
            raise BytesFormatError(
                f"BYTES element {index}: length prefix at byte {offset} is cut off "
                f"(buffer has {total} bytes)"
            )
        length = unpack(raw, offset)[0]
        end = offset + 4 + length
        if end > total:
            raise BytesFormatError(
                f"BYTES element {index}: length {length} at byte {offset} runs past the end "
                f"of the {total}-byte buffer"
            )
        append(raw[offset + 4 : end])
        offset = end
    if count is not None and len(items) != count:
        raise BytesFormatError(f"BYTES buffer holds {len(items)} elements, expected {count}")
    if offset != total:
        raise BytesFormatError(
            f"BYTES buffer has {total - offset} bytes left after {len(items)} elements"
        )
    return items
