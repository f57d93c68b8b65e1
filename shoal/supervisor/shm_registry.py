"""Clients' system shared-memory regions (Triton's system shared-memory extension).

Regions are POSIX shared-memory objects the client created and names by key. The supervisor maps
each registered region once; request inputs are read from it and outputs written into it, with
every offset and size checked against the registered window.
"""

from __future__ import annotations

import itertools
import mmap
from dataclasses import dataclass

import posix_ipc

from shoal.ipc.tensor import RegionLocation
from shoal.supervisor.cuda_shm import CudaSharedMemoryRegistry
from shoal.supervisor.errors import ErrorCode, InvalidArgument, NotFound, ShoalError, Unsupported
from shoal.supervisor.types import CudaSharedMemoryRegion, SharedMemoryRegion

#: Triton's words for a register or unregister call while ``--allow-client-shm=false``.
CLIENT_SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


class AlreadyExists(ShoalError):
    """A region with that name is already registered."""

    code = ErrorCode.ALREADY_EXISTS


@dataclass
class _Mapped:
    region: SharedMemoryRegion
    mapping: mmap.mmap
    #: Unique per registration: a stub's cached mapping of an older registration of the same
    #: key (the client may have re-created the object) is never reused for a new one.
    generation: int


class SharedMemoryRegistry:
    """Registered regions by name; each mapped once for the life of its registration.

    ``cuda`` holds the clients' CUDA regions; a name is unique across both kinds, as in Triton.
    ``allow_client=False`` (``--allow-client-shm=false``) refuses every register and unregister
    call, as Triton does; status calls still answer (with nothing registered).
    """

    def __init__(
        self, cuda: CudaSharedMemoryRegistry | None = None, *, allow_client: bool = True
    ) -> None:
        self._regions: dict[str, _Mapped] = {}
        self._generations = itertools.count(1)
        self.cuda = cuda if cuda is not None else CudaSharedMemoryRegistry()
        self.allow_client = allow_client

    def _check_allowed(self) -> None:
        if not self.allow_client:
            raise Unsupported(CLIENT_SHM_DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        self._check_new(name)
        if offset < 0 or byte_size < 0:
            raise InvalidArgument(
                f"shared memory region '{name}': offset and byte_size must not be negative"
            )
        posix_name = key if key.startswith("/") else "/" + key
        _check_key(name, key, posix_name)
        try:
            shm = posix_ipc.SharedMemory(posix_name)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError) as error:
            raise InvalidArgument(
                f"Unable to open shared memory region: '{key}': {error}"
            ) from None
        try:
            if offset + byte_size > shm.size:
                raise InvalidArgument(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                    f"exceeds the size of '{key}' ({shm.size} bytes)"
                )
            mapping = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        region = SharedMemoryRegion(name, key, offset, byte_size)
        self._regions[name] = _Mapped(region, mapping, next(self._generations))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register a client's CUDA IPC handle (INVALID_ARGUMENT without GPUs, as Triton)."""
        self._check_allowed()
        self.cuda.register(name, raw_handle, device_id, byte_size, taken=name in self._regions)

    def unregister_cuda(self, name: str = "") -> list[tuple[int, bytes]]:
        self._check_allowed()
        return self.cuda.unregister(name)

    def cuda_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return self.cuda.status(name)

    def _check_new(self, name: str) -> None:
        if name in self._regions or name in self.cuda:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")

    def unregister(self, name: str = "") -> None:
        self._check_allowed()
        self._unmap([name] if name else list(self._regions))

    def _unmap(self, names: list[str]) -> None:
        for each in names:
            entry = self._regions.pop(each, None)
            if entry is not None:
                _close(entry.mapping)

    def status(self, name: str = "") -> list[SharedMemoryRegion]:
        if not name:
            return [entry.region for entry in self._regions.values()]
        entry = self._regions.get(name)
        if entry is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [entry.region]

    def view(self, name: str, offset: int, byte_size: int, *, what: str) -> memoryview:
        """A window of a region; ``offset`` is relative to the registered offset."""
        entry = self._regions.get(name)
        if entry is None:  # Triton's words and code (NOT_FOUND), then which tensor asked
            raise NotFound(
                f"Unable to find shared memory region: '{name}' (a system shared memory region "
                f"named by {what})"
            )
        region = entry.region
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            lead = (
                f"Invalid offset for shared memory region: '{name}': "
                if offset >= region.byte_size
                else ""
            )
            raise InvalidArgument(
                f"{lead}{what}: offset {offset} and byte size {byte_size} do not fit in shared "
                f"memory region '{name}' of {region.byte_size} bytes"
            )
        start = region.offset + offset
        return memoryview(entry.mapping)[start : start + byte_size]

    def location(self, name: str, offset: int, byte_size: int, *, what: str) -> RegionLocation:
        """Where a window of a region is, for a stub to map it itself (no copy)."""
        self.view(name, offset, byte_size, what=what)  # bounds checks
        entry = self._regions[name]
        key = entry.region.key if entry.region.key.startswith("/") else "/" + entry.region.key
        return RegionLocation(f"{entry.generation}:{key}", entry.region.offset + offset, byte_size)

    def close(self) -> None:
        self._unmap(list(self._regions))
        self.cuda.close()


def _close(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:
        pass  # a view is still alive; the mapping goes when it does


def _check_key(name: str, key: str, posix_name: str) -> None:
    """Refuse keys POSIX cannot name (posix_ipc crashes the process on some of them)."""
    try:
        encoded = posix_name.encode("utf-8")
    except UnicodeEncodeError:
        encoded = b""
    if not encoded or b"\0" in encoded or "/" in posix_name[1:] or len(encoded) > 255:
        raise InvalidArgument(
            f"Unable to open shared memory region: '{key}' (region '{name}'): a key is one "
            "POSIX name of at most 255 UTF-8 bytes, without NUL or '/' after the first character"
        )
