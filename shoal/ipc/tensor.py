"""Tensor descriptors (what crosses a channel) and NumPy views over shared bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

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
    "INLINE_KIND",
    "INLINE_MESSAGE_MAX",
    "INLINE_REQUEST_MAX",
    "INLINE_TENSOR_MAX",
    "CudaLocation",
    "CudaRegionLocation",
    "InlineBytes",
    "Location",
    "RegionLocation",
    "TensorDesc",
    "buffer_to_numpy",
    "numpy_to_buffer_size",
    "write_numpy",
]


@dataclass(slots=True)
class RegionLocation:
    """Bytes inside a client's registered system shared-memory region.

    Immutable; methods written out for the compiled hot path (see :class:`~shoal.ipc.arena.Block`).
    """

    region: Final[str]
    offset: Final[int]
    nbytes: Final[int]

    def __init__(self, region: str, offset: int, nbytes: int) -> None:
        self.region = region
        self.offset = offset
        self.nbytes = nbytes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RegionLocation):
            return NotImplemented
        return (
            self.region == other.region
            and self.offset == other.offset
            and self.nbytes == other.nbytes
        )

    def __hash__(self) -> int:
        return hash((self.region, self.offset, self.nbytes))


@dataclass(frozen=True, slots=True)
class CudaLocation:
    """Bytes inside the CUDA memory pool of one device."""

    device: int
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class CudaRegionLocation:
    """Bytes inside a client's registered CUDA shared-memory region.

    ``region`` is unique per registration (``"<generation>:<name>"``); ``handle`` is the
    client's ``cudaIpcMemHandle_t``, which the stub opens itself (once per registration) to
    read an input or write an output in place; ``offset`` counts from the start of the
    client's allocation.
    """

    region: str
    device: int
    offset: int
    nbytes: int
    handle: bytes


@dataclass(slots=True)
class InlineBytes:
    """A small tensor's bytes carried inside the message itself (a MessagePack ``bin``): no
    arena block is allocated, viewed, freed or released for it.

    Immutable; methods written out for the compiled hot path (see :class:`~shoal.ipc.arena.Block`).
    """

    data: Final[bytes]
    nbytes: Final[int]

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.nbytes = len(data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InlineBytes):
            return NotImplemented
        return self.data == other.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"InlineBytes(<{self.nbytes} bytes>)"


Location: TypeAlias = Block | RegionLocation | CudaLocation | CudaRegionLocation | InlineBytes

#: The largest tensor whose bytes travel inside a message rather than in an arena block.
#: Below it a block costs more than the bytes: allocate, view, write, free and a ``Release``
#: per output against one copy into the packer and one out of it (BENCHMARKS.md, "Small
#: tensors inline"); a 64 KiB tensor still takes a block, read in place.
INLINE_TENSOR_MAX: Final = 4 << 10
#: The most inline bytes of one request's inputs (or one response's outputs) ...
INLINE_REQUEST_MAX: Final = 16 << 10
#: ... and of one message: a batch's Execute or Result must fit the stub's ring (1 MiB) with
#: room to spare for its descriptors and for the messages behind it.
INLINE_MESSAGE_MAX: Final = 256 << 10


def inline_budget(max_batch_size: int) -> int:
    """Inline bytes one request (or response) of a model may carry: a batch holds at most
    ``max(1, max_batch_size)`` of them, and all together stay within ``INLINE_MESSAGE_MAX``."""
    return min(INLINE_REQUEST_MAX, INLINE_MESSAGE_MAX // max(1, max_batch_size))


# Location kind tags on the wire.
_ARENA, _REGION, _CUDA, _CUDA_REGION, _INLINE = 0, 1, 2, 3, 4
#: The inline kind, for readers of a record's bytes outside this module (a worker's whole answers).
INLINE_KIND: Final = _INLINE


def location_to_wire(location: Location) -> list[Any]:
    # Type tests rather than a match statement: this runs for every tensor of every message.
    kind = type(location)
    if kind is Block:
        block: Block = location  # type: ignore[assignment]
        return [_ARENA, block.arena_id, block.segment, block.offset, block.nbytes]
    if kind is InlineBytes:
        inline: InlineBytes = location  # type: ignore[assignment]
        return [_INLINE, inline.data]
    if kind is RegionLocation:
        region: RegionLocation = location  # type: ignore[assignment]
        return [_REGION, region.region, region.offset, region.nbytes]
    if kind is CudaLocation:
        cuda: CudaLocation = location  # type: ignore[assignment]
        return [_CUDA, cuda.device, cuda.offset, cuda.nbytes]
    if kind is CudaRegionLocation:
        client: CudaRegionLocation = location  # type: ignore[assignment]
        return [
            _CUDA_REGION,
            client.region,
            client.device,
            client.offset,
            client.nbytes,
            client.handle,
        ]
    raise TypeError(f"not a tensor location: {location!r}")


def location_from_wire(obj: Sequence[Any], at: int = 0) -> Location:
    """The location whose wire fields start at ``obj[at]`` (a descriptor's come after its
    name, datatype and shape: read in place, not sliced out)."""
    # Indexing and exact type tests: a match statement with class patterns costs several
    # microseconds a tensor, and a batch's Result carries one location per response.
    size = len(obj) - at
    kind = obj[at] if size > 0 else None
    if size == 5 and kind == _ARENA:
        arena_id, segment, offset, nbytes = obj[at + 1], obj[at + 2], obj[at + 3], obj[at + 4]
        if (
            type(arena_id) is int
            and type(segment) is int
            and type(offset) is int
            and type(nbytes) is int
        ):
            return Block(arena_id, segment, offset, nbytes)
    elif size == 2 and kind == _INLINE:
        data = obj[at + 1]
        if type(data) is bytes and len(data) <= INLINE_MESSAGE_MAX:
            return InlineBytes(data)
        raise ValueError(
            f"malformed inline tensor on the wire: its bytes must be a bin of at most "
            f"{INLINE_MESSAGE_MAX} bytes, got {type(data).__name__} "
            f"of {len(data) if isinstance(data, bytes | str | list) else '?'}"
        )
    elif size == 4 and kind == _REGION:
        if type(obj[at + 1]) is str and _all_ints(obj[at + 2], obj[at + 3]):
            return RegionLocation(obj[at + 1], obj[at + 2], obj[at + 3])
    elif size == 4 and kind == _CUDA:
        if _all_ints(obj[at + 1], obj[at + 2], obj[at + 3]):
            return CudaLocation(obj[at + 1], obj[at + 2], obj[at + 3])
    elif (
        size == 6
        and kind == _CUDA_REGION
        and type(obj[at + 1]) is str
        and _all_ints(obj[at + 2], obj[at + 3], obj[at + 4])
        and type(obj[at + 5]) is bytes
    ):
        return CudaRegionLocation(obj[at + 1], obj[at + 2], obj[at + 3], obj[at + 4], obj[at + 5])
    raise ValueError(f"malformed tensor location on the wire: {list(obj[at:])!r}")


def _all_ints(*values: Any) -> bool:
    # A loop, not all() over a generator: about half the cost on this per-tensor path.
    for value in values:  # noqa: SIM110
        if type(value) is not int:
            return False
    return True


def _int_list(values: list[Any]) -> bool:
    """Every item is an int (a shape on the wire; no tuple made of it, as ``*values`` does)."""
    for value in values:  # noqa: SIM110
        if type(value) is not int:
            return False
    return True


@dataclass(slots=True)
class TensorDesc:
    """A tensor by reference: its V2 name, datatype, shape and where its bytes are.

    Immutable; methods written out for the compiled hot path (see :class:`~shoal.ipc.arena.Block`).
    """

    name: Final[str]
    datatype: Final[str]
    shape: Final[tuple[int, ...]]
    location: Final[Location]

    def __init__(
        self, name: str, datatype: str, shape: tuple[int, ...], location: Location
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.location = location

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorDesc):
            return NotImplemented
        return (
            self.name == other.name
            and self.datatype == other.datatype
            and self.shape == other.shape
            and self.location == other.location
        )

    def __hash__(self) -> int:
        return hash((self.name, self.datatype, self.shape, self.location))

    def to_wire(self) -> list[Any]:
        """``[name, datatype, shape, kind, *location fields]``: compact for MessagePack, which
        packs the shape's tuple as the array a list would be (no copy of it per message)."""
        location = self.location
        if type(location) is Block:  # nearly every tensor: one list, not two
            return [
                self.name,
                self.datatype,
                self.shape,
                _ARENA,
                location.arena_id,
                location.segment,
                location.offset,
                location.nbytes,
            ]
        if type(location) is InlineBytes:
            return [self.name, self.datatype, self.shape, _INLINE, location.data]
        return [self.name, self.datatype, self.shape, *location_to_wire(location)]

    @staticmethod
    def from_wire(obj: list[Any]) -> TensorDesc:
        if len(obj) < 4 or type(obj[0]) is not str or type(obj[1]) is not str:
            raise ValueError(f"malformed tensor descriptor on the wire: {obj!r}")
        shape = obj[2]
        if type(shape) is not list or not _int_list(shape):
            raise ValueError(f"malformed tensor shape on the wire: {shape!r}")
        return TensorDesc(obj[0], obj[1], tuple(shape), location_from_wire(obj, 3))


def _dtype(datatype: str) -> np.dtype:
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        raise ValueError(f"unknown tensor datatype {datatype!r}") from None


#: Bound once: a look-up in the module ``np`` costs a dict search per call.
_frombuffer: Final = np.frombuffer


def buffer_to_numpy(
    datatype: str,
    shape: Sequence[int],
    buf: memoryview | bytes | bytearray,
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
    # The dtype by position, and no reshape to the 1-D shape frombuffer gives already (the
    # usual input): a keyword costs ~500 instructions here, a reshape ~1.6k.
    array = _frombuffer(buf, dtype)
    if len(dims) != 1:
        array = array.reshape(dims)
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
