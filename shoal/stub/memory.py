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


class ClientRegions:
    """Clients' registered shared-memory regions, opened on first use and cached.

    Locations name a region as ``"<registration>:<key>"``: a new registration of the same key
    (the client may have re-created it) is opened afresh. The stub never maps a client's
    object: the client may shrink it at any moment, and a mapping touched past the object's
    end would kill this stub with SIGBUS (while the model reads an input, say). Inputs are read
    with ``preadv`` into the stub's own memory and outputs written with ``pwrite``; neither can
    fault. A window the object no longer holds fails the request (:class:`RegionShrunk`).
    """

    _KEEP = 64

    def __init__(self) -> None:
        #: region -> (fd, the object's size when it was opened).
        self._fds: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def view(self, location: RegionLocation) -> memoryview:
        """A copy of the window, the stub's own (the model may write it)."""
        fd = self._checked(location)
        copy = memoryview(np.empty(location.nbytes, np.uint8))  # type: ignore[arg-type]
        got = os.preadv(fd, [copy], location.offset) if location.nbytes else 0
        if got < location.nbytes:  # shrunk after the check: the bytes are not all there
            raise self._shrunk(location, location.offset + got)
        return copy

    def private_view(self, location: RegionLocation) -> memoryview:
        """A view the model may write, that the client never sees: the copy :meth:`view` reads."""
        return self.view(location)

    def write(self, location: RegionLocation, data: memoryview) -> None:
        """Write ``data`` at the start of the window (the caller checked that it fits). Should
        the object shrink after the check, ``pwrite`` grows it back: it cannot fault."""
        _pwrite_all(self._checked(location), data.cast("B"), location.offset)

    def _checked(self, location: RegionLocation) -> int:
        """The region's fd, once the window is checked against the registered size and the
        object's size now."""
        with self._lock:
            entry = self._fds.get(location.region)
            if entry is None:
                entry = self._open(location.region)
            self._fds.move_to_end(location.region)
        fd, size = entry
        end = location.offset + location.nbytes
        if location.offset < 0 or end > size:
            raise ValueError(f"{location} lies outside the {size}-byte region")
        now = os.fstat(fd).st_size
        if end > now:
            raise self._shrunk(location, now)
        return fd

    @staticmethod
    def _shrunk(location: RegionLocation, size: int) -> RegionShrunk:
        return RegionShrunk(
            f"the client's shared-memory object '{location.region.split(':', 1)[1]}' was "
            f"shrunk to {size} bytes: bytes {location.offset} to "
            f"{location.offset + location.nbytes} are gone"
        )

    def _open(self, region: str) -> tuple[int, int]:
        key = region.split(":", 1)[1]
        shm = posix_ipc.SharedMemory(key)
        self._fds[region] = entry = (shm.fd, shm.size)
        while len(self._fds) > self._KEEP:
            _, (old, _size) = self._fds.popitem(last=False)
            os.close(old)
        return entry

    def close(self) -> None:
        with self._lock:
            for fd, _size in self._fds.values():
                os.close(fd)
            self._fds.clear()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data.nbytes:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written
