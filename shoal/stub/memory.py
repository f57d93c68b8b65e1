"""The stub's shared memory: its output arena (shared by threads) and where arrays live."""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

from shoal.ipc.arena import Block, OwnedArena
from shoal.ipc.tensor import TensorDesc, buffer_to_numpy


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
