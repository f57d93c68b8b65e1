"""Tensor data in JSON: the ``data`` lists of inputs and outputs.

Inputs: a nested or flat list becomes a NumPy array of the tensor's datatype (BYTES: an object array
of ``bytes``). Each value must suit the datatype, as in Triton: booleans for BOOL, integers in range
for integer types, numbers for floating-point types, strings for BYTES. NumPy does the work for the
common case; Python walks the values only to find the offending one for an error message.

Outputs: the raw V2 bytes become a flat list in row-major order, as Triton returns them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from shoal.core import (
    NUMPY_DTYPES,
    BytesFormatError,
    InternalError,
    InvalidArgument,
    deserialize_bytes,
    element_count,
)
from shoal.frontends.http import _json
from shoal.frontends.http._json_pieces import NumberArray

_INTEGER_TYPES = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")
)
_FLOAT_TYPES = frozenset(("FP16", "FP32", "FP64"))

#: What a JSON value of each kind of datatype must be, for error messages.
_EXPECTED = {"BOOL": "a boolean", "BYTES": "a string"}

_INT64_MAX = 2**63 - 1

# Marks "no offending value found"; None cannot, since JSON null is a possible offender.
_NOTHING = object()


def array_from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """Convert an input's JSON ``data`` into an array of ``shape`` and ``datatype``.

    ``data`` may be a :class:`NumberArray` (a large body's): its pieces are converted one by
    one, and only where they cannot say what the list would (a value the datatype refuses,
    uneven rows) is the list read, so that errors are the same. A large ``data`` list is
    emptied as it is converted (the caller's document gives it up): its values are freed in
    slices, not all in one call when the document goes.
    """
    _check_size(name, datatype, shape)
    if isinstance(data, NumberArray):
        values = _from_pieces(name, datatype, data.pieces)
        if values is not None:
            return _shaped(name, shape, values)
        data = data.tolist()
    try:
        return _array_from_json(name, datatype, shape, data)
    finally:
        if isinstance(data, list) and len(data) > _SLICE:
            _free_in_slices(data)


def _check_size(name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """Triton's checks (and words) of a JSON input's shape before its data is read: elements,
    and bytes, that an int64 cannot count."""
    count = element_count(shape)
    if count <= _INT64_MAX >> 4:  # every request but a hostile one: no element is 16 bytes
        return
    if count > _INT64_MAX:
        dims = ",".join(map(str, shape))
        raise InvalidArgument(
            f"invalid shape for input '{name}': shape [{dims}] causes total element count to "
            f"exceed maximum size of {_INT64_MAX}"
        )
    dtype = NUMPY_DTYPES.get(datatype)
    size = 0 if dtype is None or datatype == "BYTES" else np.dtype(dtype).itemsize
    if size > 1 and count > _INT64_MAX // size:
        raise InvalidArgument(
            f"byte size overflow for input '{name}': element count ({count}) * data type size "
            f"({size}) exceeds maximum allowed size ({_INT64_MAX})"
        )


def _array_from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidArgument(f"Unable to parse 'data' for input '{name}': expected a JSON array")
    if datatype == "BF16":
        # As Triton: JSON numbers cannot say how to round to bfloat16.
        raise InvalidArgument(
            "receiving BF16 data via JSON is not supported. Please use the binary data format "
            f"for input {name}"
        )
    if datatype == "BYTES":
        values = _bytes_array(name, data)
    else:
        values = _numeric_array(name, datatype, data)
    return _shaped(name, shape, values)


def _shaped(name: str, shape: tuple[int, ...], values: np.ndarray) -> np.ndarray:
    expected = element_count(shape)
    if values.size != expected:
        raise InvalidArgument(
            "Unable to parse 'data': Shape does not match true shape of 'data' field for input "
            f"'{name}': shape {list(shape)} has {expected} elements, 'data' has {values.size}"
        )
    try:
        return values.reshape(shape)
    except ValueError as exc:  # e.g. [0, 2**62]: no elements, but no array has that shape
        raise InvalidArgument(
            f"input '{name}' has an impossible shape {list(shape)}: {exc}"
        ) from None


def _from_pieces(name: str, datatype: str, pieces: list[np.ndarray] | None) -> np.ndarray | None:
    """The flat array the pieces make, checked as :func:`_numeric_array` checks the whole
    list's; None where that takes the list (a value to name in an error, uneven rows)."""
    if pieces is None or datatype in ("BYTES", "BF16") or len({p.shape[1:] for p in pieces}) > 1:
        return None
    # What NumPy makes of the whole list: the pieces' types promoted, as when it concatenates.
    common = functools.reduce(np.promote_types, {piece.dtype for piece in pieces})
    if datatype == "BOOL":
        if common.kind != "b":
            return None
    elif datatype in _INTEGER_TYPES:
        if common.kind not in "iu":
            return None
        low = min((int(piece.min()) for piece in pieces if piece.size), default=0)
        high = max((int(piece.max()) for piece in pieces if piece.size), default=0)
        _check_range(name, datatype, low, high)
    elif common.kind not in "iuf":
        return None
    values = np.empty(sum(piece.size for piece in pieces), dtype=NUMPY_DTYPES[datatype])
    at = 0
    with np.errstate(over="ignore"):  # like Triton, 1e6 as FP16 becomes inf
        for piece in pieces:
            # Through the common type, as the whole list goes: an integer piece among floats
            # becomes float64 first (rounded once more on the way to FP32, as the list is).
            values[at : at + piece.size] = piece.reshape(-1).astype(common, copy=False)
            at += piece.size
    return values


def _numeric_array(name: str, datatype: str, data: list[Any]) -> np.ndarray:
    target = NUMPY_DTYPES[datatype]
    values = _as_array(data)
    if values.size == 0:
        return np.empty(0, dtype=target)
    kind = values.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise _bad_value(name, datatype, data)
        return values.reshape(-1)
    if datatype in _INTEGER_TYPES:
        if kind in "iu":
            _check_range(name, datatype, int(values.min()), int(values.max()))
        else:
            # NumPy turns [0, 2**64 - 1] into float64; check such lists value by value.
            values = _exact_integers(name, datatype, data)
    elif kind not in "iuf":
        raise _bad_value(name, datatype, data)
    with np.errstate(over="ignore"):  # like Triton, 1e6 as FP16 becomes inf
        return values.astype(target, copy=False).reshape(-1)


#: Elements of a JSON list converted by one NumPy call. A large list goes in slices: each call
#: holds the GIL, and a request decoded in a thread (large JSON bodies) lets the event loop run
#: between them.
_SLICE = 1 << 16


def _free_in_slices(data: list[Any]) -> None:
    """Empty ``data`` about :data:`_SLICE` values at a time: freeing 10 million values is one
    call that holds the GIL for a few hundred milliseconds."""
    row = 1
    first = data[0]
    while isinstance(first, list) and first:
        row *= len(first)
        first = first[0]
    step = max(1, _SLICE // row)
    while data:
        del data[-step:]


def _as_array(data: list[Any]) -> np.ndarray:
    try:
        if len(data) <= _SLICE:
            return np.asarray(data)
        return np.concatenate(
            [np.asarray(data[start : start + _SLICE]) for start in range(0, len(data), _SLICE)]
        )
    except (ValueError, TypeError):
        # Ragged nesting such as [[1, 2], [3]]: Triton only counts elements, so flatten first.
        return np.asarray(_flatten(data))


def _exact_integers(name: str, datatype: str, data: list[Any]) -> np.ndarray:
    # orjson reads an integer literal beyond 64 bits as a float: such a value is out of range
    # of every integer datatype, and is reported as the integer the client wrote.
    flat = [_beyond_64_bits(value) for value in _flatten(data)]
    if not all(type(value) is int for value in flat):
        raise _bad_value(name, datatype, flat)
    _check_range(name, datatype, min(flat), max(flat))
    return np.array(flat, dtype=NUMPY_DTYPES[datatype])


def _beyond_64_bits(value: Any) -> Any:
    if type(value) is float and abs(value) >= 2.0**64 and value.is_integer():
        return int(value)
    return value


def _check_range(name: str, datatype: str, low: int, high: int) -> None:
    info = np.iinfo(NUMPY_DTYPES[datatype])
    if low < info.min or high > info.max:
        value = low if low < info.min else high
        raise InvalidArgument(
            f"Unable to parse 'data' for input '{name}': value {value} is out of range for "
            f"{datatype} [{info.min}, {info.max}]"
        )


def _bytes_array(name: str, data: list[Any]) -> np.ndarray:
    flat = _flatten(data)
    if not all(type(value) is str for value in flat):
        raise _bad_value(name, "BYTES", flat)
    try:
        encoded = [value.encode("utf-8") for value in flat]
    except UnicodeEncodeError as exc:  # a lone surrogate escape such as "\ud800"
        raise InvalidArgument(f"Unable to parse 'data' for input '{name}': {exc}") from exc
    array = np.empty(len(encoded), dtype=np.object_)
    array[:] = encoded
    return array


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major flattening of nested lists, without recursion (depth is client-controlled)."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _fits(datatype: str, value: Any) -> bool:
    if datatype == "BOOL":
        return type(value) is bool
    if datatype == "BYTES":
        return type(value) is str
    if datatype in _INTEGER_TYPES:
        return type(value) is int
    return type(value) in (int, float)


def _bad_value(name: str, datatype: str, data: list[Any]) -> InvalidArgument:
    expected = _EXPECTED.get(datatype, "an integer" if datatype in _INTEGER_TYPES else "a number")
    offenders = (value for value in _flatten(data) if not _fits(datatype, value))
    offender = next(offenders, _NOTHING)
    got = "" if offender is _NOTHING else f", got {_json_repr(offender)}"
    return InvalidArgument(
        f"Unable to parse 'data' for input '{name}': {_triton_words(datatype)}: expected "
        f"{expected} for datatype {datatype}{got}"
    )


def _triton_words(datatype: str) -> str:
    """What Triton's JSON reader says of a value of the wrong kind (clients match it)."""
    if datatype in _INTEGER_TYPES:
        kind = "unsigned-integer" if datatype.startswith("U") else "signed-integer"
    else:
        kind = {"BOOL": "boolean", "BYTES": "string"}.get(datatype, "number")
    return f"attempt to access JSON non-{kind} as {'double' if kind == 'number' else kind}"


def _json_repr(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value[:40]}"'
    return "an object" if isinstance(value, dict) else repr(value)


def json_from_output(name: str, datatype: str, shape: tuple[int, ...], data: memoryview) -> Any:
    """An output's raw V2 bytes as a flat JSON-ready list (BYTES as UTF-8 strings); a large one
    (more than :data:`_SLICE` values, numbers) as the array's JSON text, encoded a slice at a
    time (:func:`json_pieces_from_output`) so that no call holds the GIL for long."""
    pieces = json_pieces_from_output(name, datatype, shape, data)
    if pieces is not None:
        return _json.fragment(pieces)
    if datatype == "BYTES":
        return _strings_from_output(name, data, element_count(shape))
    if data.nbytes != NUMPY_DTYPES[datatype].itemsize * element_count(shape):
        raise _size_mismatch(name)
    return _values(datatype, data)


def json_pieces_from_output(
    name: str, datatype: str, shape: tuple[int, ...], data: memoryview
) -> list[bytes | memoryview] | None:
    """A large numeric output (more than :data:`_SLICE` values) as its JSON array's pieces,
    encoded a slice at a time (:func:`_json.array_pieces`); None for any other output, or
    without orjson."""
    count = element_count(shape)
    if datatype == "BYTES" or count <= _SLICE:
        return None
    dtype = NUMPY_DTYPES[datatype]
    if data.nbytes != dtype.itemsize * count:
        raise _size_mismatch(name)
    step = _SLICE * dtype.itemsize
    chunks = (_slice_json(datatype, data[at : at + step]) for at in range(0, data.nbytes, step))
    return _json.array_pieces(chunks)


def _slice_json(datatype: str, data: memoryview) -> bytes:
    _json.yield_gil()
    return _json.dumps(_values(datatype, data))


def _values(datatype: str, data: memoryview) -> list[Any]:
    """The values of a numeric tensor's bytes, as a list."""
    if datatype == "BOOL" or datatype == "BF16":
        return _without_numpy_view(datatype, data)
    array = np.frombuffer(data, dtype=NUMPY_DTYPES[datatype])
    if array.dtype.kind == "f":
        return _floats(array)
    values: list[Any] = array.tolist()  # typed Any or a list by the numpy version: no ignore
    return values


def _without_numpy_view(datatype: str, data: memoryview) -> list[Any]:
    """BOOL and BF16 values: NumPy has no view of their bytes that reads them right."""
    if datatype == "BOOL":
        # Any non-zero byte is true; a bool view of such bytes would be undefined.
        return (np.frombuffer(data, dtype=np.uint8) != 0).tolist()  # type: ignore[no-any-return]
    # bfloat16 is the upper half of a float32: widening the bits is exact.
    words = np.frombuffer(data, dtype="<u2").astype("<u4") << 16
    return _floats(words.view("<f4"))


def _floats(array: np.ndarray) -> list[Any]:
    """Floats as JSON values, NaN and infinities written as Triton writes them."""
    values: list[Any] = array.tolist()
    if not np.isfinite(array).all():
        values = [v if math.isfinite(v) else _json.non_finite(v) for v in values]
    return values


def _strings_from_output(name: str, data: memoryview, count: int) -> list[str]:
    try:
        items = deserialize_bytes(data, count)
    except BytesFormatError as exc:
        raise InternalError(f"{_size_mismatch(name)}: {exc}") from exc
    strings: list[str] = []
    for index, item in enumerate(items.tolist()):
        try:
            strings.append(item.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidArgument(
                f"output '{name}' element {index} is not valid UTF-8 and cannot be sent as JSON; "
                "request the output with binary_data=true"
            ) from exc
    return strings


def _size_mismatch(name: str) -> InternalError:
    return InternalError(f"output tensor shape does not match size of output for '{name}'")
