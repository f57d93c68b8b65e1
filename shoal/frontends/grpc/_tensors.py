"""Typed tensor contents (``InferTensorContents``) -> NumPy arrays of the input's datatype.

Each datatype has one field: BOOL ``bool_contents``; INT8, INT16, INT32 ``int_contents``; INT64
``int64_contents``; UINT8, UINT16, UINT32 ``uint_contents``; UINT64 ``uint64_contents``; FP32
``fp32_contents``; FP64 ``fp64_contents``; BYTES ``bytes_contents`` (an object array of ``bytes``,
as the HTTP frontend makes from JSON). FP16 and BF16 have no typed form and must be sent raw.
Values of the narrow integer types must fit them (Triton would keep the low bytes silently).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from shoal.core import NUMPY_DTYPES, InvalidArgument, element_count
from shoal.protos import grpc_service_pb2 as pb

#: The ``InferTensorContents`` field of each datatype that has one.
CONTENTS_FIELD: Final[dict[str, str]] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

# Wide dtype each field is read into before narrowing to the datatype.
_FIELD_DTYPE: Final = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}


def array_from_contents(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    contents: pb.InferTensorContents,
    model_name: str,
) -> np.ndarray:
    """The input's values as an array of ``shape`` and ``datatype``."""
    field = _field_for(name, datatype, contents, model_name)
    values = getattr(contents, field)
    _check_count(name, field, shape, len(values), model_name)
    array = _flat_array(name, datatype, field, values)
    try:
        return array.reshape(shape)
    except ValueError as exc:  # e.g. [0, 2**62]: no elements, but no array has that shape
        raise InvalidArgument(
            f"input '{name}' for model '{model_name}' has an impossible shape {list(shape)}: {exc}"
        ) from None


def _check_count(name: str, field: str, shape: tuple[int, ...], count: int, model: str) -> None:
    expected = element_count(shape)
    if count != expected:
        raise InvalidArgument(
            f"unexpected number of elements in '{field}' for input '{name}' for model "
            f"'{model}': shape {list(shape)} has {expected} elements, got {count}"
        )


def _flat_array(name: str, datatype: str, field: str, values: Any) -> np.ndarray:
    """The values of a contents field as a one-dimensional array of ``datatype``."""
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=np.object_)
        array[:] = list(values)
        return array
    array = np.fromiter(values, dtype=_FIELD_DTYPE[field], count=len(values))
    return _narrowed(name, datatype, array)


def _field_for(name: str, datatype: str, contents: pb.InferTensorContents, model_name: str) -> str:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(
            f"{datatype} data cannot be sent in 'contents' (input '{name}' for model "
            f"'{model_name}'): send it in raw_input_contents"
        )
    present = [descriptor.name for descriptor, _ in contents.ListFields()]
    if present and present != [field]:
        raise InvalidArgument(
            f"unexpected explicit tensor data for input tensor '{name}' for model "
            f"'{model_name}' of type '{datatype}': got {', '.join(present)}, expected {field}"
        )
    return field


def _narrowed(name: str, datatype: str, array: np.ndarray) -> np.ndarray:
    target = NUMPY_DTYPES[datatype]
    if target == array.dtype:
        return array
    info = np.iinfo(target)
    if array.size and (int(array.min()) < info.min or int(array.max()) > info.max):
        raise InvalidArgument(
            f"a value of input '{name}' is out of range for {datatype} [{info.min}, {info.max}]"
        )
    return array.astype(target)
