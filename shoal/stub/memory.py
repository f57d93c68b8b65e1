"""The stub's shared memory: its output arena (shared by threads) and where arrays live."""

from __future__ import annotations

import collections
import ctypes
import os
import threading
import weakref
from typing import Any

import numpy as np
import posix_ipc

from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.tensor import RegionLocation, TensorDesc, buffer_to_numpy


class RegionTooSmall(ValueError):
    """An output does not fit the client's shared-memory window for it: the client's mistake
    (INVALID_ARG, Triton's words), not the model's."""

    def __init__(self, output: str, available: int, needed: int) -> None:
        super().__init__(
            f"shared memory size specified with the request for output '{output}' "
            f"({available} bytes) should be at least {needed} bytes to hold the results"
        )


class SharedOutputArena:
    """The stub's output arena behind a lock: decoupled senders and BLS run on other threads."""

    def __init__(self, arena: OwnedArena) -> None:
        self.arena = arena
        self.arena_id = arena.arena_id
        self._lock = threading.Lock()

    def allocate(self, nbytes: int) -> Block:
        with self._lock:
            return self.arena.allocate(nbytes)

    def free(self, blocks: list[Block]) -> None:
        with self._lock:
            for block in blocks:
                self.arena.free(block)

    def view(self, block: Block) -> memoryview:
        return self.arena.view(block)

    def free_bytes(self) -> int:
        """Bytes still allocatable: up to the limit, whether or not segments exist yet."""
        with self._lock:
            return self.arena.limit_bytes - self.arena.used_bytes


class Locations:
    """Which shared-memory block a NumPy array is a view of, so it can be passed by descriptor.

    Inputs of the current batch and outputs of BLS responses are remembered; a model that
    returns or forwards such an array unchanged makes no copy.
    """

    def __init__(self) -> None:
        self._known: dict[int, tuple[TensorDesc, bool, weakref.ref[np.ndarray]]] = {}
        self._lock = threading.Lock()

    def remember(self, array: np.ndarray, desc: TensorDesc, *, returnable: bool) -> None:
        """``returnable``: the block may also back a response output (a request's input, whose
        ownership the supervisor can move to the response); BLS outputs may only be forwarded
        to other BLS calls, since their blocks go back when the model drops the response."""
        with self._lock:
            if len(self._known) > 4096:
                self._known = {k: v for k, v in self._known.items() if v[2]() is not None}
            self._known[id(array)] = (desc, returnable, weakref.ref(array))

    def lookup(self, array: np.ndarray, *, for_response: bool) -> TensorDesc | None:
        if not self._known:  # nothing remembered (small inputs come inline): no lock taken
            return None
        with self._lock:
            entry = self._known.get(id(array))
        if entry is None or entry[2]() is not array or (for_response and not entry[1]):
            return None
        return entry[0]


def kept_view(datatype: str, shape: tuple[int, ...], view: memoryview, keeper: Any) -> np.ndarray:
    """A read-only array over ``view`` that keeps ``keeper`` alive for as long as it (or any
    view of it) lives. The keeper's finalizer tells the supervisor the memory is free."""
    if view.nbytes == 0 or datatype == "BYTES":
        return buffer_to_numpy(datatype, shape, view, readonly=True)
    holder = (ctypes.c_char * view.nbytes).from_buffer(view)
    holder.keeper = keeper  # type: ignore[attr-defined]
    return buffer_to_numpy(datatype, shape, memoryview(holder).cast("B"), readonly=True)


class RegionShrunk(ValueError):
    """A client's shared-memory object no longer holds a window it registered (INVALID_ARG:
    the client's doing)."""


class _OpenRegion:
    """A client's object this stub opened, and the threads using its fd right now."""

    __slots__ = ("closed", "fd", "size", "users")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        #: The object's size when it was opened (the registered window lies within it).
        self.size = size
        self.users = 0
        #: Forgotten while in use: the last user closes the fd.
        self.closed = False


class RegionReplaced(ValueError):
    """The object a location names is not the one registered any more (INVALID_ARG)."""


class ClientRegions:
    """Clients' registered shared-memory regions, opened on first use and cached.

    Locations name a region as ``"<registration>:<pid>:<fd>:<inode>:<key>"``: a new
    registration of the same key (the client may have re-created it) is opened afresh, through
    the core's own fd of the registered object (``/proc/<pid>/fd/<fd>``): the object the client
    registered, even when its name was unlinked or taken by another since (by the key when the
    core's fd cannot be reached: another user's ``/proc``, say). Whatever is opened must be
    that inode, or the request fails (:class:`RegionReplaced`). The stub never maps a client's
    object: the client may shrink it at any moment, and a mapping touched past the object's
    end would kill this stub with SIGBUS (while the model reads an input, say). Inputs are read
    with ``preadv`` into the stub's own memory and outputs written with ``pwrite``; neither can
    fault. A window the object no longer holds fails the request (:class:`RegionShrunk`).

    The supervisor says when a registration is gone and no request holds it (:meth:`forget`):
    its fd is closed then, so that an object the client unlinks is freed. An fd is closed only
    once no thread reads or writes through it (BLS callers and decoupled senders run beside
    the loop that forgets), so a closed number, reused by another open, is never written.
    """

    _KEEP = 64

    def __init__(self) -> None:
        self._open: collections.OrderedDict[str, _OpenRegion] = collections.OrderedDict()
        self._lock = threading.Lock()
        # POSIX shared memory lives on /dev/shm's file system: an inode number alone could be
        # matched by a file elsewhere that took the core's fd number after the region closed.
        self._device = os.stat("/dev/shm").st_dev

    def view(self, location: RegionLocation) -> memoryview:
        """A copy of the window, the stub's own (the model may write it)."""
        copy = memoryview(np.empty(location.nbytes, np.uint8))  # type: ignore[arg-type]
        entry = self._checked(location)
        try:
            got = os.preadv(entry.fd, [copy], location.offset) if location.nbytes else 0
        finally:
            self._done(entry)
        if got < location.nbytes:  # shrunk after the check: the bytes are not all there
            raise self._shrunk(location, location.offset + got)
        return copy

    def private_view(self, location: RegionLocation) -> memoryview:
        """A view the model may write, that the client never sees: the copy :meth:`view` reads."""
        return self.view(location)

    def write(self, location: RegionLocation, data: memoryview) -> None:
        """Write ``data`` at the start of the window (the caller checked that it fits). Should
        the object shrink after the check, ``pwrite`` grows it back: it cannot fault."""
        entry = self._checked(location)
        try:
            _pwrite_all(entry.fd, data.cast("B"), location.offset)
        finally:
            self._done(entry)

    def _checked(self, location: RegionLocation) -> _OpenRegion:
        """The region, in use until :meth:`_done`, once the window is checked against the
        registered size and the object's size now."""
        with self._lock:
            entry = self._open.get(location.region)
            if entry is None:
                entry = self._opened(location.region)
            self._open.move_to_end(location.region)
            entry.users += 1
        try:
            end = location.offset + location.nbytes
            if location.offset < 0 or end > entry.size:
                raise ValueError(f"{location} lies outside the {entry.size}-byte region")
            now = os.fstat(entry.fd).st_size
            if end > now:
                raise self._shrunk(location, now)
        except BaseException:
            self._done(entry)
            raise
        return entry

    def _done(self, entry: _OpenRegion) -> None:
        with self._lock:
            entry.users -= 1
            if entry.users == 0 and entry.closed:
                os.close(entry.fd)

    @staticmethod
    def _shrunk(location: RegionLocation, size: int) -> RegionShrunk:
        return RegionShrunk(
            f"the client's shared-memory object '{location.region.split(':', 4)[-1]}' was "
            f"shrunk to {size} bytes: bytes {location.offset} to "
            f"{location.offset + location.nbytes} are gone"
        )

    def _opened(self, region: str) -> _OpenRegion:
        _generation, pid, fd, inode, key = region.split(":", 4)
        try:
            opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            opened = posix_ipc.SharedMemory(key).fd
        stat = os.fstat(opened)
        if stat.st_ino != int(inode) or stat.st_dev != self._device:
            os.close(opened)
            raise RegionReplaced(
                f"the client's shared-memory object '{key}' is no longer the one registered "
                "(it was unregistered, or removed and made anew)"
            )
        self._open[region] = entry = _OpenRegion(opened, stat.st_size)
        while len(self._open) > self._KEEP:
            self._close(self._open.popitem(last=False)[1])
        return entry

    def _close(self, entry: _OpenRegion) -> None:
        """(Holding the lock.) Close now, or when its last user is done."""
        entry.closed = True
        if entry.users == 0:
            os.close(entry.fd)

    def forget(self, region: str) -> None:
        """The registration is gone (``RegionClosed``): close the object if opened here."""
        with self._lock:
            entry = self._open.pop(region, None)
            if entry is not None:
                self._close(entry)

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> None:
        with self._lock:
            for entry in self._open.values():
                self._close(entry)
            self._open.clear()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data.nbytes:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written
