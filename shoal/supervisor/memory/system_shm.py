"""Clients' system shared-memory regions (Triton's system shared-memory extension).

Regions are POSIX shared-memory objects the client created and names by key. The supervisor
keeps each registered object open but never maps it: the client owns the object and may shrink it
at any time, and touching a mapped page past the end of a shrunk object raises SIGBUS, which would
kill the server and every stub. So what the supervisor reads (BYTES inputs, whose elements it
checks) or writes (an ensemble's outputs) goes through ``pread``/``pwrite``, which report a short
object as a short count instead; and every window is checked against the object's size now
(``fstat``), not only against the size it had when registered: a request for a window the object
no longer holds fails with INVALID_ARGUMENT naming the region.

A region is held by each request in flight that names it (:meth:`SharedMemoryRegistry.hold`,
Triton's reference count): unregistering one that is held marks it instead, and it stays
listed, usable and its name taken, as in Triton, until the last of those requests ends (one
cancelled while a stub runs it: once the stub is done with it); then its fd is closed and the
stubs that opened it are told to close theirs.
"""

from __future__ import annotations

import itertools
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

import posix_ipc

from shoal.core.errors import (
    ErrorCode,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ShoalError,
    Unsupported,
)
from shoal.core.types import CudaSharedMemoryRegion, SharedMemoryRegion
from shoal.ipc import messages as msg
from shoal.ipc.tensor import RegionLocation
from shoal.supervisor.memory.cuda_shm import CudaRegistration, CudaSharedMemoryRegistry
from shoal.supervisor.memory.windows import window_fault

#: Triton's words for a register or unregister call while ``--allow-client-shm=false``.
CLIENT_SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


def registration_limit() -> int:
    """How many regions (both kinds) may be registered at once: each system region keeps an
    fd open, and a server out of fds accepts no connection and restarts no stub. Half the
    open-file limit (raised to the hard one at start) stays for those; and at most 65,530,
    what Triton's mappings of its regions meet first (Linux's default ``vm.max_map_count``),
    which also bounds the registry's memory."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_REGIONS
    return max(16, min(MAX_REGIONS, soft // 2))


MAX_REGIONS = 65530


class AlreadyExists(ShoalError):
    """A region with that name is already registered."""

    code = ErrorCode.ALREADY_EXISTS


@dataclass
class _Opened:
    region: SharedMemoryRegion
    #: The object, open for the life of the registration (never mapped here: see above).
    fd: int
    #: Unique per registration: a stub's cached mapping of an older registration of the same
    #: key (the client may have re-created the object) is never reused for a new one.
    generation: int
    #: The object's inode, which names it whatever its name is now (:func:`_stub_name`).
    inode: int
    #: Requests in flight that hold it (:meth:`SharedMemoryRegistry.hold`).
    users: int = 0
    #: Unregistered while held: dropped when the last of them ends.
    unregistered: bool = False
    #: Its location went to a stub, which may hold the object open until told it is gone.
    handed: bool = False


#: What a request holds until it ends: its regions of either kind.
Held = list["_Opened | CudaRegistration"]


class SharedMemoryRegistry:
    """Registered regions by name; each object open for the life of its registration.

    ``cuda`` holds the clients' CUDA regions; a name is unique across both kinds, as in Triton.
    ``allow_client=False`` (``--allow-client-shm=false``) refuses every register and unregister
    call, as Triton does; status calls still answer (with nothing registered).
    """

    def __init__(
        self,
        cuda: CudaSharedMemoryRegistry | None = None,
        *,
        allow_client: bool = True,
        tell_stubs: Callable[[msg.RegionClosed | msg.CudaRegionClosed], None] | None = None,
    ) -> None:
        self._regions: dict[str, _Opened] = {}
        self._generations = itertools.count(1)
        self.cuda = cuda if cuda is not None else CudaSharedMemoryRegistry()
        self.allow_client = allow_client
        #: How a dropped region reaches the stubs (every live one; None: no stubs, in tests).
        self._tell_stubs = tell_stubs

    def _check_allowed(self) -> None:
        if not self.allow_client:
            raise Unsupported(CLIENT_SHM_DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        _check_reserved(name, key)  # Triton's order: the key, the name, the object's bounds
        self._check_new(name)
        self._check_room(name)
        if offset < 0 or byte_size < 0:
            raise InvalidArgument(
                f"shared memory region '{name}': offset and byte_size must not be negative "
                f"(got offset {offset}, byte_size {byte_size})"
            )
        # glibc's shm_open (Triton's) skips every leading slash: "//k" names the object "/k"
        posix_name = "/" + key.lstrip("/")
        _check_key(name, key, posix_name)
        shm = _open(key, posix_name)
        try:
            stat = os.fstat(shm.fd)
            _check_size(name, key, offset, byte_size, stat.st_size)
            if byte_size == 0:  # Triton maps byte_size bytes, and mmap refuses a length of 0
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': byte_size must be "
                    "positive (got 0)"
                )
        except BaseException:
            shm.close_fd()
            raise
        region = SharedMemoryRegion(name, key, offset, byte_size)
        self._regions[name] = _Opened(region, shm.fd, next(self._generations), stat.st_ino)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register a client's CUDA IPC handle (INVALID_ARGUMENT without GPUs, as Triton)."""
        self._check_allowed()
        self._check_room(name)
        self.cuda.register(name, raw_handle, device_id, byte_size, taken=name in self._regions)

    def unregister_cuda(self, name: str = "") -> None:
        self._check_allowed()
        for entry in self.cuda.unregister(name):
            self._cuda_dropped(entry)

    def cuda_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return self.cuda.status(name)

    def _check_room(self, name: str) -> None:
        limit = registration_limit()  # (now: an operator may lower it while serving)
        if len(self._regions) + len(self.cuda) >= limit:
            raise ResourceExhausted(
                f"failed to register shared memory region '{name}': {limit} regions are "
                "registered, the most this server holds at once; unregister some first"
            )

    def _check_new(self, name: str) -> None:
        if name in self._regions or name in self.cuda:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")

    def unregister(self, name: str = "") -> None:
        """Drop ``name`` (every system region when empty) now, or when the last request
        holding it ends: until then it stays listed and usable, as in Triton."""
        self._check_allowed()
        for each in [name] if name else list(self._regions):
            entry = self._regions.get(each)
            if entry is None:
                continue
            if entry.users:
                entry.unregistered = True
            else:
                self._drop(entry)

    def _drop(self, entry: _Opened) -> None:
        if self._regions.get(entry.region.name) is not entry:
            return  # dropped already (at shutdown, with requests still holding it)
        del self._regions[entry.region.name]
        os.close(entry.fd)
        if entry.handed and self._tell_stubs is not None:
            self._tell_stubs(msg.RegionClosed(_stub_name(entry)))

    def _cuda_dropped(self, entry: CudaRegistration) -> None:
        if self._tell_stubs is not None:
            self._tell_stubs(msg.CudaRegionClosed(entry.region.device_id, entry.handle))

    def any_registered(self) -> bool:
        return bool(self._regions) or bool(self.cuda)

    def hold(self, name: str, held: Held) -> None:
        """Keep region ``name`` (when registered) for a request until :meth:`release`."""
        entry: _Opened | CudaRegistration | None = self._regions.get(name)
        if entry is None:
            entry = self.cuda.entry(name)
            if entry is None:
                return  # the request fails on it, naming it, where it is used
        entry.users += 1
        held.append(entry)

    def release(self, held: Held) -> None:
        """A request ended (answered, failed or cancelled): drop what it alone still held."""
        for entry in held:
            entry.users -= 1
            if entry.users or not entry.unregistered:
                continue
            if isinstance(entry, _Opened):
                self._drop(entry)
            else:
                self.cuda.drop(entry)
                self._cuda_dropped(entry)
        held.clear()

    def status(self, name: str = "") -> list[SharedMemoryRegion]:
        if not name:
            return [entry.region for entry in self._regions.values()]
        entry = self._regions.get(name)
        if entry is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [entry.region]

    def read(self, name: str, offset: int, byte_size: int, *, what: str) -> memoryview:
        """A copy of a window of a region; ``offset`` is relative to the registered offset."""
        entry, start = self._present(name, offset, byte_size, what)
        data = bytearray(byte_size)
        view = memoryview(data)
        done = 0
        while done < byte_size:
            count = os.preadv(entry.fd, [view[done:]], start + done)
            if count == 0:  # shrunk since the check: the end of the object came first
                raise self._shrunk(entry, name, start, byte_size, what)
            done += count
        return view

    def write(self, name: str, offset: int, data: memoryview, *, what: str) -> None:
        """Copy ``data`` into a window of a region. Should the client shrink the object between
        the size check and the copy, ``pwrite`` grows it back where a mapping would fault."""
        entry, start = self._present(name, offset, data.nbytes, what)
        source = data.cast("B") if data.ndim != 1 or data.format != "B" else data
        done = 0
        while done < source.nbytes:
            done += os.pwrite(entry.fd, source[done:], start + done)

    def location(self, name: str, offset: int, byte_size: int, *, what: str) -> RegionLocation:
        """Where a window of a region is, for a stub to map it itself (no copy)."""
        entry, start = self._present(name, offset, byte_size, what)
        entry.handed = True
        return RegionLocation(_stub_name(entry), start, byte_size)

    def _present(self, name: str, offset: int, byte_size: int, what: str) -> tuple[_Opened, int]:
        """The registration and the absolute start of a window that fits the registered region
        and the object as it is now."""
        entry = self._regions.get(name)
        if entry is None:  # Triton's words and code (NOT_FOUND), then which tensor asked
            raise NotFound(
                f"Unable to find shared memory region: '{name}' (a system shared memory region "
                f"named by {what})"
            )
        region = entry.region
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"{window_fault(name, offset, byte_size, region.byte_size)}: {what}: offset "
                f"{offset} and byte size {byte_size} do not fit in shared memory region '{name}' "
                f"of {region.byte_size} bytes"
            )
        start = region.offset + offset
        if start + byte_size > os.fstat(entry.fd).st_size:
            raise self._shrunk(entry, name, start, byte_size, what)
        return entry, start

    @staticmethod
    def _shrunk(
        entry: _Opened, name: str, start: int, byte_size: int, what: str
    ) -> InvalidArgument:
        size = os.fstat(entry.fd).st_size
        return InvalidArgument(
            f"{what}: shared memory region '{name}' no longer holds bytes {start} to "
            f"{start + byte_size}: its object '{entry.region.key}' was shrunk to {size} bytes "
            "after it was registered"
        )

    def close(self) -> None:
        """At shutdown, after the stubs: close every region, held or not."""
        for entry in list(self._regions.values()):
            self._drop(entry)
        self.cuda.close()


def _stub_name(entry: _Opened) -> str:
    """How stubs name a registration: ``"<generation>:<pid>:<fd>:<inode>:<key>"``. A stub opens
    the object through this process's fd (``/proc/<pid>/fd/<fd>``): the one registered, even
    when the client has unlinked its name since or another object took it (as Triton's mapping
    of it). The fd is open while a request that holds it is in flight; the inode lets the stub
    refuse whatever else it finds there (a cancelled request's Execute read late, after the
    number was reused)."""
    key = "/" + entry.region.key.lstrip("/")
    return f"{entry.generation}:{os.getpid()}:{entry.fd}:{entry.inode}:{key}"


def _open(key: str, posix_name: str) -> posix_ipc.SharedMemory:
    try:
        return posix_ipc.SharedMemory(posix_name)
    except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError) as error:
        raise InvalidArgument(f"Unable to open shared memory region: '{key}': {error}") from None
    except OSError as error:  # posix_ipc's word for out of fds (the process's or the system's)
        raise ResourceExhausted(f"Unable to open shared memory region: '{key}': {error}") from None


def _check_size(name: str, key: str, offset: int, byte_size: int, size: int) -> None:
    if offset + byte_size > size:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': invalid args: offset {offset} + "
            f"byte_size {byte_size} exceeds the size of '{key}' ({size} bytes)"
        )


#: Where Triton's own python backend keeps its shared memory: no client may register a key
#: there (Triton's refusal, whatever the leading slashes).
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"


def _check_reserved(name: str, key: str) -> None:
    """Triton's checks of a key before it opens anything, in its words."""
    bare = key.lstrip("/")
    if not bare:
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    if bare.startswith(RESERVED_KEY_PREFIX):
        raise InvalidArgument(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_KEY_PREFIX}'"
        )


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
