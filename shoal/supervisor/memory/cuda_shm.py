"""Clients' CUDA shared-memory regions (Triton's CUDA shared-memory extension).

A client registers a ``cudaIpcMemHandle_t`` of its own device allocation (the 64 raw bytes that
``tritonclient.utils.cuda_shared_memory`` produces), a device id and a size. The supervisor opens
the handle once per registration (``cudaIpcOpenMemHandle``, which also checks it) and closes it on
unregister. Requests reach the region by descriptor (``location``): the stub that runs the model
opens the handle itself and reads inputs or writes outputs in place. Without
CUDA, registering fails as it does in a ``tritonserver`` built without GPU support (INVALID_ARG,
"GPUs not supported"), while status and unregister work and see no regions.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shoal.core.errors import ErrorCode, InvalidArgument, NotFound, ShoalError
from shoal.core.types import CudaSharedMemoryRegion
from shoal.ipc import cuda
from shoal.ipc.cuda import close_ipc_handle, cuda_device_count, open_ipc_handle
from shoal.ipc.tensor import CudaRegionLocation
from shoal.supervisor.memory.windows import window_fault


@dataclass
class CudaRegistration:
    region: CudaSharedMemoryRegion
    pointer: int
    handle: bytes
    #: Unique per registration, so that a stub never reuses its handle of an older one.
    generation: int
    #: Requests in flight that hold it (``SharedMemoryRegistry.hold``).
    users: int = 0
    #: Unregistered while held: closed when the last of them ends.
    unregistered: bool = False


class CudaSharedMemoryRegistry:
    """Registered CUDA regions by name, each handle opened once for its registration.

    Names are unique across system and CUDA regions, as in Triton: ``SharedMemoryRegistry``
    passes ``taken`` for a name a system region holds. ``device_count``, ``opener`` and
    ``closer`` are cupy's unless a test injects others.
    """

    def __init__(
        self,
        *,
        device_count: Callable[[], int] = cuda_device_count,
        opener: Callable[[int, bytes], int] = open_ipc_handle,
        closer: Callable[[int, int], None] = close_ipc_handle,
    ) -> None:
        self._regions: dict[str, CudaRegistration] = {}
        self._generations = itertools.count(1)
        self._device_count = device_count
        self._opener = opener
        self._closer = closer

    def register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, *, taken: bool = False
    ) -> None:
        """Open and remember a client's handle; ``taken``: a system region has the name."""
        self._check_registration(name, raw_handle, device_id, byte_size, taken)
        try:
            pointer = self._opener(device_id, raw_handle)
        except Exception as error:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': {error}"
            ) from None
        region = CudaSharedMemoryRegion(name, device_id, byte_size)
        generation = next(self._generations)
        self._regions[name] = CudaRegistration(region, pointer, bytes(raw_handle), generation)

    def _check_registration(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, taken: bool
    ) -> None:
        devices = self._device_count()
        if devices == 0:  # first, as in a tritonserver built without GPU support
            raise InvalidArgument(
                f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
            )
        if taken or name in self._regions:
            raise ShoalError(
                f"shared memory region '{name}' already in manager", ErrorCode.ALREADY_EXISTS
            )
        if len(raw_handle) != cuda.IPC_HANDLE_BYTES:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': raw_handle must be "
                f"{cuda.IPC_HANDLE_BYTES} bytes (a cudaIpcMemHandle_t), got {len(raw_handle)}"
            )
        if not 0 <= device_id < devices or byte_size < 0:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': device_id {device_id} "
                f"must name one of the {devices} visible GPUs and byte_size must not be negative"
            )

    def unregister(self, name: str = "") -> list[CudaRegistration]:
        """Close ``name`` (every region when empty) now, or mark it when requests in flight
        hold it (closed when the last ends, as in Triton); returns those closed, for the
        stubs that may have opened them too."""
        closed = []
        for each in [name] if name else list(self._regions):
            entry = self._regions.get(each)
            if entry is None:
                continue
            if entry.users:
                entry.unregistered = True
            else:
                self.drop(entry)
                closed.append(entry)
        return closed

    def drop(self, entry: CudaRegistration) -> None:
        """Forget a registration and close its handle (once)."""
        if self._regions.get(entry.region.name) is not entry:
            return
        del self._regions[entry.region.name]
        self._closer(entry.region.device_id, entry.pointer)

    def entry(self, name: str) -> CudaRegistration | None:
        return self._regions.get(name)

    def status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        if not name:
            return [entry.region for entry in self._regions.values()]
        entry = self._regions.get(name)
        if entry is None:
            raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
        return [entry.region]

    def __len__(self) -> int:
        return len(self._regions)

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    def pointer(self, name: str, offset: int, byte_size: int, *, what: str) -> tuple[int, int]:
        """``(device, device pointer)`` of a window of a region, bounds checked."""
        entry = self._opened(name, what)
        size = entry.region.byte_size
        if offset < 0 or byte_size < 0 or offset + byte_size > size:
            raise InvalidArgument(
                f"{window_fault(name, offset, byte_size, size)}: {what}: offset {offset} and "
                f"byte size {byte_size} do not fit in CUDA shared memory region '{name}' of "
                f"{size} bytes"
            )
        return entry.region.device_id, entry.pointer + offset

    def location(self, name: str, offset: int, byte_size: int, *, what: str) -> CudaRegionLocation:
        """Where a window of a region is, for the stub to open and use in place."""
        self.pointer(name, offset, byte_size, what=what)  # bounds checks
        entry = self._regions[name]
        key = f"{entry.generation}:{name}"
        return CudaRegionLocation(key, entry.region.device_id, offset, byte_size, entry.handle)

    def _opened(self, name: str, what: str) -> CudaRegistration:
        entry = self._regions.get(name)
        if entry is None:
            raise InvalidArgument(f"Unable to find cuda shared memory region: '{name}' ({what})")
        return entry

    def read(self, name: str, offset: int, byte_size: int, *, what: str) -> memoryview:
        """A host copy of a window (one device-to-host copy)."""
        device, pointer = self.pointer(name, offset, byte_size, what=what)
        host = np.empty(byte_size, dtype=np.uint8)
        if byte_size:
            with cuda.cupy_module().cuda.Device(device):
                cuda.memcpy(host.ctypes.data, pointer, byte_size, cuda.MEMCPY_DEVICE_TO_HOST)
        return host.data

    def write(self, name: str, offset: int, data: memoryview, *, what: str) -> None:
        """Copy host bytes into a window (one host-to-device copy, straight from ``data``)."""
        device, pointer = self.pointer(name, offset, data.nbytes, what=what)
        if data.nbytes:
            host = np.frombuffer(data, dtype=np.uint8)  # no copy, read-only views included
            with cuda.cupy_module().cuda.Device(device):
                cuda.memcpy(pointer, host.ctypes.data, data.nbytes, cuda.MEMCPY_HOST_TO_DEVICE)

    def close(self) -> None:
        for entry in list(self._regions.values()):
            self.drop(entry)
