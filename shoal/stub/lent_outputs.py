"""Output-arena blocks lent to the model as writable arrays: outputs built in place, not copied.

``pb_utils.empty_output_tensor(name, shape, dtype)`` hands the model a ``pb_utils.Tensor`` whose
array is a block of the stub's output arena. A response that carries it passes the block by
descriptor (the writer finds the array in :class:`~shoal.stub.memory.Locations`), so the copy
into the arena that every other output costs disappears.

A lent block has two holders: the model (through the array and any view of it) and, once a
response carried it, the supervisor (until it sends ``Release``). It goes back to the arena when
both are done: the array's keeper is finalized when the last view dies, ``Release`` arrives when
the frontend has written the response. So a model that keeps the array after returning it reads
stable memory, never a block another response reuses. A block carried by one response is not
carried by a second one: that second output is copied, as any other.
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from shoal.ipc.arena import Block
from shoal.ipc.dtypes import byte_size, numpy_to_datatype
from shoal.ipc.tensor import TensorDesc
from shoal.stub.memory import Locations, SharedOutputArena


class _Loan:
    """Referenced by the lent array's buffer: finalized once no view of the block is left."""

    __slots__ = ("__weakref__",)


class OutputLender:
    """Lends blocks of the output arena and takes them back when both holders are done."""

    def __init__(self, outputs: SharedOutputArena, locations: Locations) -> None:
        self._outputs = outputs
        self._locations = locations
        self._lock = threading.Lock()
        #: Lent blocks -> [held by the model, carried by a response (the supervisor holds it)].
        self._lent: dict[Block, list[bool]] = {}

    def lend(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A writable, uninitialised array of ``shape`` and ``dtype`` in the output arena."""
        datatype = numpy_to_datatype(dtype)
        nbytes = byte_size(datatype, shape)
        if nbytes is None:
            raise TypeError("BYTES outputs have no fixed size: build them with pb_utils.Tensor")
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        block = self._outputs.allocate(nbytes)
        loan = _Loan()
        with self._lock:
            self._lent[block] = [True, False]
        weakref.finalize(loan, self._dropped, block)
        holder = (ctypes.c_char * nbytes).from_buffer(self._outputs.view(block))
        holder.loan = loan  # type: ignore[attr-defined]
        array: np.ndarray = np.frombuffer(memoryview(holder).cast("B"), dtype=dtype)
        array = array.reshape(shape)
        self._locations.remember(array, TensorDesc(name, datatype, shape, block), returnable=True)
        return array

    def is_lent(self, block: Block) -> bool:
        with self._lock:
            return block in self._lent

    def carry(self, block: Block) -> bool:
        """A response is about to carry ``block``; False when one already does (copy it)."""
        with self._lock:
            state = self._lent.get(block)
            if state is None or state[1]:
                return False
            state[1] = True
            return True

    def uncarry(self, block: Block) -> None:
        """The response that was to carry ``block`` was not sent."""
        self._set(block, 1)

    def released(self, blocks: list[Block]) -> list[Block]:
        """The supervisor gave ``blocks`` back; returns those that are not lent (free them)."""
        others = []
        for block in blocks:
            if not self.is_lent(block):
                others.append(block)
            else:
                self._set(block, 1)
        return others

    def _dropped(self, block: Block) -> None:
        self._set(block, 0)

    def _set(self, block: Block, holder: int) -> None:
        """One holder is done with ``block``; the last one gives it back to the arena."""
        with self._lock:
            state = self._lent.get(block)
            if state is None:
                return
            state[holder] = False
            if state[0] or state[1]:
                return
            del self._lent[block]
        self._outputs.free([block])

    @property
    def lent_count(self) -> int:
        with self._lock:
            return len(self._lent)


__all__ = ["OutputLender"]
