"""The CUDA memory pool, its IPC handles, and the peer side that maps them (optional).

Everything that touches CUDA goes through cupy, imported lazily: a process that never asks for a
GPU never imports it, so a machine without CUDA (or without cupy) runs the whole CPU path.

* ``CudaPool`` (the supervisor, one per device) grows in **chunks** of device memory up to a hard
  limit. Offsets inside the pool come from the arena allocator (``_alloc.RunAllocator``): a pool
  offset is ``chunk << SEGMENT_SHIFT | byte offset in the chunk``, the allocator's own run key,
  so ``CudaLocation(device, offset, nbytes)`` names a block without any table lookup.
* Each chunk is exported once with ``cudaIpcGetMemHandle``; ``CudaChunkAnnounce`` carries the
  64-byte handle to a stub before the first descriptor that points into the chunk.
* ``CudaPoolMap`` (a stub) opens a chunk's handle the first time a block in it is used
  (``cudaIpcOpenMemHandle``) and caches the pointer; blocks are wrapped as cupy arrays over
  ``UnownedMemory``, which export DLPack capsules (``torch.from_dlpack`` sees the same pointer).

Memory is reached through the small ``DeviceMemory`` protocol so that the pool's bookkeeping
(growth, limit, exhaustion, chunk retirement) does not depend on a GPU; ``CupyDeviceMemory`` is
the real implementation.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shoal.ipc._alloc import RunAllocator, align_up, cover, split_key
from shoal.ipc.tensor import CudaLocation

__all__ = [
    "IPC_HANDLE_BYTES",
    "CudaChunkAnnounce",
    "CudaPool",
    "CudaPoolExhausted",
    "CudaPoolMap",
    "CudaUnavailable",
    "CupyDeviceMemory",
    "DeviceMemory",
    "cuda_device_count",
    "cupy_module",
]

#: Size of a ``cudaIpcMemHandle_t``.
IPC_HANDLE_BYTES = 64
#: Default chunk size: large enough that a 256 MiB tensor needs one chunk.
DEFAULT_CHUNK_BYTES = 256 << 20
#: Block sizes (so offsets) are multiples of this: cudaMalloc's alignment, which vectorised
#: kernels expect of every tensor they are handed.
BLOCK_ALIGN = 256
# cudaIpcMemLazyEnablePeerAccess: the only flag cudaIpcOpenMemHandle accepts.
_LAZY_PEER_ACCESS = 1
# cudaMemcpyKind values.
MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 1, 2, 3


class CudaUnavailable(RuntimeError):
    """CUDA cannot be used here: cupy is not installed, or it sees no device. Says which."""


class CudaPoolExhausted(MemoryError):
    """A pool allocation does not fit under the device's limit: a per-request error
    (RESOURCE_EXHAUSTED), never a crash. Carries the sizes."""

    def __init__(
        self, device: int, requested: int, available: int, limit: int, device_error: str = ""
    ) -> None:
        if device_error:  # the device itself is full: a larger limit would not help
            text = (
                f"CUDA memory pool of device {device} could not grow by {requested} bytes: "
                f"{device_error}"
            )
        else:
            text = (
                f"CUDA memory pool of device {device} is exhausted: {requested} bytes requested, "
                f"{available} bytes available, limit {limit} bytes "
                f"(raise it with --cuda-memory-pool-byte-size {device}:<bytes>)"
            )
        super().__init__(text)
        self.device = device
        self.requested = requested
        self.available = available
        self.limit = limit


@functools.cache
def cupy_module() -> Any:
    """The cupy module; CudaUnavailable (with the reason) when it cannot be imported."""
    try:
        import cupy
    except ImportError as error:
        raise CudaUnavailable(
            f"cupy is not installed ({error}); install shoal[gpu] for GPU support"
        ) from None
    return cupy


@functools.cache
def cuda_device_count() -> int:
    """Visible CUDA devices; 0 when cupy is missing or the driver finds none (never raises)."""
    try:
        return int(cupy_module().cuda.runtime.getDeviceCount())
    except Exception:
        return 0


class DeviceMemory(Protocol):
    """Device memory as the pool needs it: chunks with IPC handles."""

    def allocate(self, device: int, nbytes: int) -> int:
        """A device pointer to ``nbytes`` fresh bytes (MemoryError when the device is full)."""
        ...

    def free(self, device: int, pointer: int) -> None: ...

    def ipc_handle(self, device: int, pointer: int) -> bytes:
        """The ``IPC_HANDLE_BYTES`` of ``cudaIpcGetMemHandle`` for an allocation."""
        ...


class CupyDeviceMemory:
    """``DeviceMemory`` through ``cupy.cuda.runtime`` (cudaMalloc, cudaIpcGetMemHandle)."""

    def __init__(self) -> None:
        self._cupy = cupy_module()

    def allocate(self, device: int, nbytes: int) -> int:
        runtime = self._cupy.cuda.runtime
        with self._cupy.cuda.Device(device):
            try:
                return int(runtime.malloc(nbytes))
            except runtime.CUDARuntimeError as error:
                raise MemoryError(
                    f"cudaMalloc of {nbytes} bytes on device {device}: {error}"
                ) from None

    def free(self, device: int, pointer: int) -> None:
        with self._cupy.cuda.Device(device):
            self._cupy.cuda.runtime.free(pointer)

    def ipc_handle(self, device: int, pointer: int) -> bytes:
        with self._cupy.cuda.Device(device):
            return bytes(self._cupy.cuda.runtime.ipcGetMemHandle(pointer))


@dataclass(frozen=True, slots=True)
class CudaChunkAnnounce:
    """A pool chunk for a peer to open: ``[device, chunk, nbytes, handle]`` on the wire."""

    device: int
    chunk: int
    nbytes: int
    handle: bytes

    def to_wire(self) -> list[Any]:
        return [self.device, self.chunk, self.nbytes, self.handle]

    @staticmethod
    def from_wire(obj: Any) -> CudaChunkAnnounce:
        if (
            not isinstance(obj, list)
            or len(obj) != 4
            or not all(type(value) is int and value >= 0 for value in obj[:3])
            or type(obj[3]) is not bytes
            or len(obj[3]) != IPC_HANDLE_BYTES
        ):
            raise ValueError(f"malformed CUDA chunk announcement on the wire: {obj!r}")
        return CudaChunkAnnounce(obj[0], obj[1], obj[2], obj[3])


@dataclass(slots=True)
class _Chunk:
    pointer: int
    nbytes: int
    handle: bytes


class CudaPool:
    """One device's pool, owned by the supervisor: only it allocates and frees.

    ``limit_bytes`` bounds the sum of live chunks. An allocation that fits no free run adds a
    chunk of ``chunk_bytes`` (or one sized for a larger request); when the limit is in the way,
    empty chunks are given back first, as the CPU arenas retire empty segments.
    ``on_new_chunk`` runs for each chunk before any block in it is handed out, so that its
    owner can announce it to the stubs; ``on_retired_chunk(device, chunk)`` for each chunk given
    back, so that they close their handles.
    """

    def __init__(
        self,
        device: int,
        limit_bytes: int,
        *,
        memory: DeviceMemory | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        on_new_chunk: Callable[[CudaChunkAnnounce], None] | None = None,
        on_retired_chunk: Callable[[int, int], None] | None = None,
    ) -> None:
        if limit_bytes < BLOCK_ALIGN or chunk_bytes <= 0:
            raise ValueError(
                f"CUDA pool of device {device}: the limit must be at least {BLOCK_ALIGN} bytes "
                f"and the chunk size positive, got {limit_bytes} and {chunk_bytes}"
            )
        self.device = device
        self.limit_bytes = limit_bytes // BLOCK_ALIGN * BLOCK_ALIGN
        self.chunk_bytes = align_up(chunk_bytes, BLOCK_ALIGN)
        self._memory = memory if memory is not None else CupyDeviceMemory()
        self._on_new_chunk = on_new_chunk
        self._on_retired_chunk = on_retired_chunk
        self._alloc = RunAllocator()
        self._chunks: dict[int, _Chunk] = {}
        self._next_chunk = 0

    @property
    def capacity(self) -> int:
        """Bytes of device memory the pool holds now."""
        return sum(chunk.nbytes for chunk in self._chunks.values())

    @property
    def used_bytes(self) -> int:
        return self._alloc.used_bytes

    def announcements(self) -> list[CudaChunkAnnounce]:
        """Every live chunk, for a stub that starts after the chunks were made."""
        return [
            CudaChunkAnnounce(self.device, index, chunk.nbytes, chunk.handle)
            for index, chunk in sorted(self._chunks.items())
        ]

    def announcement(self, chunk: int) -> CudaChunkAnnounce:
        """The announcement of one live chunk (KeyError for a chunk given back)."""
        found = self._chunks[chunk]
        return CudaChunkAnnounce(self.device, chunk, found.nbytes, found.handle)

    def allocate(self, nbytes: int) -> CudaLocation:
        """A block of ``nbytes``; CudaPoolExhausted when the limit does not allow it."""
        size = align_up(max(nbytes, 1), BLOCK_ALIGN)
        key = self._alloc.take(size)
        if key is None:
            self._grow(size)
            key = self._alloc.take(size)
            assert key is not None, "a fresh chunk always fits the request it was made for"
        return CudaLocation(self.device, key, nbytes)

    def free(self, location: CudaLocation) -> None:
        """Give a block back (ValueError for a block this pool did not hand out)."""
        if location.device != self.device or self._alloc.allocated_size(location.offset) is None:
            raise ValueError(f"{location} is not an allocated block of device {self.device}")
        self._alloc.give(location.offset)

    def pointer(self, location: CudaLocation) -> int:
        """The block's device pointer in this (the owning) process."""
        chunk, offset = split_key(location.offset)
        return self._chunks[chunk].pointer + offset

    def close(self) -> None:
        """Free every chunk. Stubs must have closed their handles first (cudaIpcCloseMemHandle)."""
        for chunk in self._chunks.values():
            self._memory.free(self.device, chunk.pointer)
        self._chunks.clear()

    def _grow(self, size: int) -> None:
        room = self.limit_bytes - self.capacity
        if size > room:
            self._retire_empty(size - room)
            room = self.limit_bytes - self.capacity
            if size > room:
                raise CudaPoolExhausted(self.device, size, self._available(), self.limit_bytes)
        # A chunk of chunk_bytes, or one sized for a larger request; the last may be smaller.
        wanted = min(max(self.chunk_bytes, size), room)
        try:
            pointer = self._memory.allocate(self.device, wanted)
        except MemoryError as error:
            raise CudaPoolExhausted(self.device, size, 0, self.limit_bytes, str(error)) from None
        index = self._next_chunk
        self._next_chunk += 1  # chunk ids are never reused: a stub's cache can never be stale
        chunk = _Chunk(pointer, wanted, self._memory.ipc_handle(self.device, pointer))
        self._chunks[index] = chunk
        self._alloc.add_segment(index, wanted)
        if self._on_new_chunk is not None:
            self._on_new_chunk(CudaChunkAnnounce(self.device, index, wanted, chunk.handle))

    def _retire_empty(self, deficit: int) -> None:
        empty = {i: c.nbytes for i, c in self._chunks.items() if self._alloc.is_empty(i)}
        for index in cover(empty, deficit) or ():
            self._alloc.remove_segment(index)
            # Peers that opened the chunk keep it alive until they close their handle.
            self._memory.free(self.device, self._chunks.pop(index).pointer)
            if self._on_retired_chunk is not None:
                self._on_retired_chunk(self.device, index)

    def _available(self) -> int:
        empty = sum(c.nbytes for i, c in self._chunks.items() if self._alloc.is_empty(i))
        return max(self._alloc.largest_free(), self.limit_bytes - self.capacity + empty)


class CudaPoolMap:
    """A stub's view of the supervisor's pools: chunk handles opened lazily, then cached.

    Thread-safe: BLS threads and decoupled senders of one stub share it, and CUDA refuses to
    open one handle twice in a process.
    """

    def __init__(
        self,
        opener: Callable[[int, bytes], int] | None = None,
        closer: Callable[[int, int], None] | None = None,
    ) -> None:
        self._announced: dict[tuple[int, int], CudaChunkAnnounce] = {}
        self._opened: dict[tuple[int, int], int] = {}
        self._opener = opener if opener is not None else open_ipc_handle
        self._closer = closer if closer is not None else close_ipc_handle
        self._lock = threading.Lock()
        #: The device number this process knows the owner's ``device`` by (they differ when
        #: the process sees fewer GPUs than the owner).
        self.local_device: Callable[[int], int] = lambda device: device

    def add(self, announce: CudaChunkAnnounce) -> None:
        with self._lock:
            self._announced[(announce.device, announce.chunk)] = announce

    def has(self, location: CudaLocation) -> bool:
        """Whether the chunk of ``location`` has been announced to this process."""
        key = (location.device, split_key(location.offset)[0])
        with self._lock:
            return key in self._announced or key in self._opened

    def pointer(self, location: CudaLocation) -> int:
        """The block's device pointer in this process (opens its chunk on first use)."""
        chunk, offset = split_key(location.offset)
        key = (location.device, chunk)
        with self._lock:
            base = self._opened.get(key)
            if base is None:
                announce = self._announced.get(key)
                if announce is None:
                    raise KeyError(
                        f"CUDA pool chunk {chunk} of device {location.device} is unknown"
                    )
                if offset + location.nbytes > announce.nbytes:
                    raise ValueError(
                        f"{location} does not fit in its chunk of {announce.nbytes} bytes"
                    )
                base = self._opener(self.local_device(location.device), announce.handle)
                self._opened[key] = base
        return base + offset

    def as_array(
        self, location: CudaLocation, dtype: Any, shape: tuple[int, ...], owner: object = None
    ) -> Any:
        """A cupy array over the block, without a copy (DLPack-exportable); ``owner`` is kept
        alive for as long as the array (or any view of it) is."""
        pointer = self.pointer(location)
        device = self.local_device(location.device)
        return device_array(device, pointer, location.nbytes, dtype, shape, owner)

    def retire(self, device: int, chunk: int) -> None:
        """The owner gave a chunk back: close its handle now (ids are never reused)."""
        with self._lock:
            self._announced.pop((device, chunk), None)
            pointer = self._opened.pop((device, chunk), None)
        if pointer is not None:
            self._closer(self.local_device(device), pointer)

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, {}
        for (device, _), pointer in opened.items():
            self._closer(self.local_device(device), pointer)


def open_ipc_handle(device: int, handle: bytes) -> int:
    """``cudaIpcOpenMemHandle`` on ``device``: the pointer of another process's allocation."""
    if len(handle) != IPC_HANDLE_BYTES:
        raise ValueError(f"a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
    cupy = cupy_module()
    with cupy.cuda.Device(device):
        return int(cupy.cuda.runtime.ipcOpenMemHandle(handle, _LAZY_PEER_ACCESS))


def close_ipc_handle(device: int, pointer: int) -> None:
    cupy = cupy_module()
    with cupy.cuda.Device(device):
        cupy.cuda.runtime.ipcCloseMemHandle(pointer)


def device_array(
    device: int,
    pointer: int,
    nbytes: int,
    dtype: Any,
    shape: tuple[int, ...],
    owner: object = None,
) -> Any:
    """A cupy ndarray over device memory this process does not own (no copy); ``owner`` lives
    as long as the array does."""
    cupy = cupy_module()
    memory = cupy.cuda.UnownedMemory(pointer, nbytes, owner, device)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


def pinned_host_array(nbytes: int) -> np.ndarray:
    """``nbytes`` of page-locked host memory from cupy's pinned pool, as a uint8 array.

    Device-to-host copies into it run at the bus's speed, where a fresh pageable buffer pays a
    page fault per page first (measured on an H100 machine: 1.2 GB/s into fresh NumPy arrays).
    The pool reuses freed blocks, so it keeps as much pinned memory as the largest burst used.
    """
    memory = cupy_module().cuda.alloc_pinned_memory(max(nbytes, 1))
    return np.frombuffer(memory, dtype=np.uint8, count=nbytes)


def device_to_host(pointer: int, nbytes: int) -> np.ndarray:
    """A pinned host copy of ``nbytes`` of device memory (uint8)."""
    host = pinned_host_array(nbytes)
    if nbytes:
        memcpy(host.ctypes.data, pointer, nbytes, MEMCPY_DEVICE_TO_HOST)
    return host


def memcpy(dst: int, src: int, nbytes: int, kind: int) -> None:
    """``cudaMemcpy`` (synchronous); ``kind`` is one of the ``MEMCPY_*`` values."""
    cupy_module().cuda.runtime.memcpy(dst, src, nbytes, kind)
