"""Tensor descriptors (what crosses a channel) and NumPy views over shared bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from shoal.ipc.arena import Block
from shoal.ipc.dtypes import (
    NUMPY_DTYPES,
    byte_size,
    deserialize_bytes,
    element_count,
    serialize_bytes_into,
    serialized_bytes_size,
)

__all__ = [
    "CudaLocation",
    "Location",
    "RegionLocation",
    "TensorDesc",
    "buffer_to_numpy",
    "numpy_to_buffer_size",
    "write_numpy",
]


@dataclass(frozen=True, slots=True)
class RegionLocation:
    """Bytes inside a client's registered system shared-memory region."""

    region: str
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class CudaLocation:
    """Bytes inside the CUDA memory pool of one device."""

    device: int
    offset: int
    nbytes: int


Location: TypeAlias = Block | RegionLocation | CudaLocation

# Location kind tags on the wire.
_ARENA, _REGION, _CUDA = 0, 1, 2


def _location_to_wire(location: Location) -> list[Any]:
    match location:
        case Block(arena_id, segment, offset, nbytes):
            return [_ARENA, arena_id, segment, offset, nbytes]
        case RegionLocation(region, offset, nbytes):
            return [_REGION, region, offset, nbytes]
        case CudaLocation(device, offset, nbytes):
            return [_CUDA, device, offset, nbytes]
    raise TypeError(f"not a tensor location: {location!r}")


def _location_from_wire(obj: Sequence[Any]) -> Location:
    match list(obj):
        case [0, int(arena_id), int(segment), int(offset), int(nbytes)]:
            return Block(arena_id, segment, offset, nbytes)
        case [1, str(region), int(offset), int(nbytes)]:
            return RegionLocation(region, offset, nbytes)
        case [2, int(device), int(offset), int(nbytes)]:
            return CudaLocation(device, offset, nbytes)
    raise ValueError(f"malformed tensor location on the wire: {obj!r}")


@dataclass(frozen=True, slots=True)
class TensorDesc:
    """A tensor by reference: its V2 name, datatype, shape and where its bytes are."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    location: Location

    def to_wire(self) -> list[Any]:
        """``[name, datatype, shape, kind, *location fields]``: compact for MessagePack."""
        return [self.name, self.datatype, list(self.shape), *_location_to_wire(self.location)]

    @staticmethod
    def from_wire(obj: list[Any]) -> TensorDesc:
        if len(obj) < 4 or not isinstance(obj[0], str) or not isinstance(obj[1], str):
            raise ValueError(f"malformed tensor descriptor on the wire: {obj!r}")
        shape = tuple(int(dim) for dim in obj[2])
        return TensorDesc(obj[0], obj[1], shape, _location_from_wire(obj[3:]))


def _dtype(datatype: str) -> np.dtype:
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        raise ValueError(f"unknown tensor datatype {datatype!r}") from None


def buffer_to_numpy(
    datatype: str,
    shape: Sequence[int],
    buf: memoryview | bytes,
    *,
    readonly: bool = True,
) -> np.ndarray:
    """An array of ``shape`` over ``buf``: a zero-copy view, or decoded objects for BYTES.

    With ``readonly=False`` the view is writable when ``buf`` is (never for ``bytes``).
    """
    dims = tuple(int(dim) for dim in shape)
    dtype = _dtype(datatype)
    if datatype == "BYTES":
        return deserialize_bytes(buf, count=element_count(dims)).reshape(dims)
    expected = byte_size(datatype, dims)
    actual = buf.nbytes if isinstance(buf, memoryview) else len(buf)
    if expected != actual:
        raise ValueError(
            f"{datatype} tensor of shape {list(dims)} needs {expected} bytes, "
            f"the buffer holds {actual}"
        )
    array = np.frombuffer(buf, dtype=dtype).reshape(dims)
    if readonly and array.flags.writeable:
        array.flags.writeable = False
    return array


def numpy_to_buffer_size(array: np.ndarray, datatype: str) -> int:
    """Bytes needed to store ``array`` as ``datatype`` in the V2 layout."""
    if datatype == "BYTES":
        return serialized_bytes_size(array)
    return _dtype(datatype).itemsize * int(array.size)


def write_numpy(array: np.ndarray, datatype: str, dest: memoryview) -> None:
    """Copy ``array`` into ``dest`` (exactly its V2 size) once, converting to ``datatype``."""
    if datatype == "BYTES":
        serialize_bytes_into(array, dest)
        return
    needed = numpy_to_buffer_size(array, datatype)
    if dest.nbytes != needed:
        raise ValueError(
            f"{datatype} tensor of shape {list(array.shape)} needs {needed} bytes, "
            f"the destination holds {dest.nbytes}"
        )
    if needed:
        target = np.frombuffer(dest, dtype=_dtype(datatype)).reshape(array.shape)
        np.copyto(target, array, casting="same_kind")
