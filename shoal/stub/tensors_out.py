"""Writing pb_utils tensors into shared memory once, or passing them by descriptor."""

from __future__ import annotations

from typing import Any

from shoal.ipc.arena import Block
from shoal.ipc.tensor import RegionLocation, TensorDesc, numpy_to_buffer_size, write_numpy
from shoal.stub.memory import Locations, SharedOutputArena


class TensorWriter:
    """Turns ``pb_utils.Tensor`` objects into descriptors for the supervisor."""

    def __init__(self, outputs: SharedOutputArena, locations: Locations) -> None:
        self.outputs = outputs
        self.locations = locations

    def place(self, tensor: Any, target: RegionLocation, view: memoryview) -> TensorDesc:
        """Write an output straight into the client's shared-memory region (``view``)."""
        array = tensor._array()
        datatype = tensor._datatype()
        nbytes = numpy_to_buffer_size(array, datatype)
        if nbytes > target.nbytes:
            raise ValueError(
                f"shared memory size specified with the request for output '{tensor.name()}' "
                f"({target.nbytes} bytes) should be at least {nbytes} bytes to hold the results"
            )
        write_numpy(array, datatype, view[:nbytes])
        shape = tuple(int(d) for d in array.shape)
        location = RegionLocation(target.region, target.offset, nbytes)
        return TensorDesc(tensor.name(), datatype, shape, location)

    def describe(self, tensor: Any, written: list[Block], *, for_response: bool) -> TensorDesc:
        """A descriptor for ``tensor``: its existing block if it is a view of one, else a new
        block of the output arena (appended to ``written``) holding one copy of it."""
        array = tensor._array()
        datatype = tensor._datatype()
        shape = tuple(int(d) for d in array.shape)
        known = self.locations.lookup(array, for_response=for_response)
        if known is not None and known.datatype == datatype and known.shape == shape:
            return TensorDesc(tensor.name(), datatype, shape, known.location)
        block = self.outputs.allocate(numpy_to_buffer_size(array, datatype))
        written.append(block)
        write_numpy(array, datatype, self.outputs.view(block))
        return TensorDesc(tensor.name(), datatype, shape, block)
