"""The stub's shared memory: its output arena (shared by threads) and where arrays live."""

from __future__ import annotations

import collections
import ctypes
import mmap
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


class ClientRegions:
    """Clients' registered shared-memory regions, mapped on first use and cached.

    Locations name a region as ``"<registration>:<key>"``: a new registration of the same key
    (the client may have re-created it) is mapped afresh. Views read the client's bytes in
    place: an input from client shared memory is never copied.
    """

    _KEEP = 64

    def __init__(self) -> None:
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()
        self._lock = threading.Lock()

    def view(self, location: RegionLocation) -> memoryview:
        with self._lock:
            mapping = self._maps.get(location.region)
            if mapping is None:
                mapping = self._map(location.region)
            self._maps.move_to_end(location.region)
        end = location.offset + location.nbytes
        if location.offset < 0 or end > len(mapping):
            raise ValueError(f"{location} lies outside the {len(mapping)}-byte region")
        return memoryview(mapping)[location.offset : end]

    def _map(self, region: str) -> mmap.mmap:
        key = region.split(":", 1)[1]
        shm = posix_ipc.SharedMemory(key)
        try:
            mapping = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        self._maps[region] = mapping
        while len(self._maps) > self._KEEP:
            _, old = self._maps.popitem(last=False)
            try:
                old.close()
            except BufferError:
                pass  # a view is alive; the mapping goes with it
        return mapping
