"""The stub's shared memory: its output arena (shared by threads) and where arrays live."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np
import posix_ipc

from shoal.ipc.arena import Block, OwnedArena, private_view
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
    """Clients' registered shared-memory regions, mapped on first use and cached.

    Locations name a region as ``"<registration>:<key>"``: a new registration of the same key
    (the client may have re-created it) is mapped afresh. Views read the client's bytes in
    place: an input from client shared memory is never copied.
    """

    _KEEP = 64

    def __init__(self) -> None:
        # The fd stays open beside the mapping: private views of an input map it again.
        self._maps: collections.OrderedDict[str, tuple[mmap.mmap, int]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def view(self, location: RegionLocation) -> memoryview:
        mapping = self._mapping(location)[0]
        return memoryview(mapping)[location.offset : location.offset + location.nbytes]

    def private_view(self, location: RegionLocation) -> memoryview:
        """A copy-on-write view: the model may write it, the client's bytes stay as they are."""
        fd = self._mapping(location)[1]
        return private_view(fd, location.offset, location.nbytes)

    def _mapping(self, location: RegionLocation) -> tuple[mmap.mmap, int]:
        with self._lock:
            entry = self._maps.get(location.region)
            if entry is None:
                entry = self._map(location.region)
            self._maps.move_to_end(location.region)
        size = len(entry[0])
        end = location.offset + location.nbytes
        if location.offset < 0 or end > size:
            raise ValueError(f"{location} lies outside the {size}-byte region")
        # The client may have shrunk its object since: touching the mapping past the object's
        # end now would kill this stub with SIGBUS. (It can still shrink it while the model
        # reads: then only this stub dies, and restarts; the supervisor never maps it.)
        now = os.fstat(entry[1]).st_size
        if end > now:
            raise RegionShrunk(
                f"the client's shared-memory object '{location.region.split(':', 1)[1]}' was "
                f"shrunk to {now} bytes: bytes {location.offset} to {end} are gone"
            )
        return entry

    def _map(self, region: str) -> tuple[mmap.mmap, int]:
        key = region.split(":", 1)[1]
        shm = posix_ipc.SharedMemory(key)
        try:
            mapping = mmap.mmap(shm.fd, shm.size)
        except BaseException:
            shm.close_fd()
            raise
        self._maps[region] = (mapping, shm.fd)
        while len(self._maps) > self._KEEP:
            _, (old, fd) = self._maps.popitem(last=False)
            os.close(fd)
            try:
                old.close()
            except BufferError:
                pass  # a view is alive; the mapping goes with it
        return mapping, shm.fd

    def close(self) -> None:
        with self._lock:
            for mapping, fd in self._maps.values():
                os.close(fd)
                with contextlib.suppress(BufferError):
                    mapping.close()
            self._maps.clear()
