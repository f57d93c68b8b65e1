"""Writing pb_utils tensors into shared memory once, or passing them by descriptor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import numpy as np

from shoal.ipc.arena import Block
from shoal.ipc.dtypes import NUMPY_DTYPES
from shoal.ipc.tensor import (
    INLINE_REQUEST_MAX,
    INLINE_TENSOR_MAX,
    CudaLocation,
    InlineBytes,
    RegionLocation,
    TensorDesc,
    numpy_to_buffer_size,
    write_numpy,
)
from shoal.stub.memory import ClientRegions, Locations, RegionTooSmall, SharedOutputArena

if TYPE_CHECKING:
    from shoal.stub.gpu_tensors import GpuTensors
    from shoal.stub.lent_outputs import OutputLender

#: Memory a descriptor was written into, which goes back if the message is never sent.
Written = list[Block | CudaLocation]


class TensorWriter:
    """Turns ``pb_utils.Tensor`` objects into descriptors for the supervisor.

    CPU tensors are written once into the output arena; GPU tensors are copied once into a
    CUDA pool block (``gpu``), or to the host when there is no ``gpu`` (a unit test's writer).
    """

    def __init__(
        self,
        outputs: SharedOutputArena,
        locations: Locations,
        gpu: GpuTensors | None = None,
        regions: ClientRegions | None = None,
    ) -> None:
        self.outputs = outputs
        self.locations = locations
        self.gpu = gpu
        #: Clients' shared-memory regions, for outputs the client asked to receive in one.
        self.regions = regions if regions is not None else ClientRegions()
        #: Blocks lent to the model (``pb_utils.empty_output_tensor``): a response carries
        #: them by descriptor.
        self.lender: OutputLender | None = None
        #: Bytes of one response's outputs that may travel inside its record (set from the
        #: model's max_batch_size: a batch's Result must fit the ring; ``ipc/tensor.py``).
        self.inline_budget = INLINE_REQUEST_MAX

    def free(self, written: Written) -> None:
        """Give back what descriptors that will not be sent were written into."""
        blocks = [w for w in written if type(w) is Block]
        if self.lender is not None:
            blocks = self.lender.released(blocks)  # lent blocks: only no longer carried
        self.outputs.free(blocks)
        cuda = [w for w in written if type(w) is CudaLocation]
        if cuda and self.gpu is not None:
            self.gpu.give_back(cuda)

    def place(self, tensor: Any, target: RegionLocation) -> TensorDesc:
        """Write an output straight into the client's shared-memory region (``pwrite``: a
        client that shrinks its object meanwhile cannot make the stub fault)."""
        array = tensor._array()
        datatype = tensor._datatype()
        nbytes = numpy_to_buffer_size(array, datatype)
        if nbytes > target.nbytes:
            raise RegionTooSmall(tensor.name(), target.nbytes, nbytes)
        if (
            datatype != "BYTES"
            and array.dtype == NUMPY_DTYPES.get(datatype)
            and array.flags.c_contiguous
        ):
            data = memoryview(array).cast("B") if nbytes else memoryview(b"")
        else:
            staged = bytearray(nbytes)
            write_numpy(array, datatype, memoryview(staged))
            data = memoryview(staged)
        self.regions.write(RegionLocation(target.region, target.offset, nbytes), data)
        shape = tuple(int(d) for d in array.shape)
        location = RegionLocation(target.region, target.offset, nbytes)
        return TensorDesc(tensor.name(), datatype, shape, location)

    def describe(
        self, tensor: Any, written: Written, *, for_response: bool, inline_room: int = 0
    ) -> TensorDesc:
        """A descriptor for ``tensor``: its existing block if it is a view of one, else one
        copy of it: its bytes inline when it is small and ``inline_room`` bytes are left, else
        a new block (appended to ``written``): a CUDA pool block for a GPU tensor, an output
        arena block otherwise."""
        on_gpu = tensor._gpu
        if on_gpu is not None and self.gpu is not None and on_gpu.nbytes:
            desc = self.gpu.write(tensor, written, for_response=for_response)  # type: ignore[arg-type]
            if desc is not None:
                return desc
        # The tensor's fields, not its methods: each call of the interpreted layer costs ~600
        # instructions, and a host tensor of a fixed-size type is its array as it is.
        datatype: str = tensor._dtype
        array = tensor._data if on_gpu is None and datatype != "BYTES" else tensor._array()
        shape: tuple[int, ...] = array.shape  # a NumPy shape is a tuple of ints already
        name: str = tensor._name
        known = self.locations.lookup(array, for_response=for_response)
        if known is not None and known.datatype == datatype and known.shape == shape:
            location = known.location
            lender = self.lender
            if not (
                for_response
                and lender is not None
                and type(location) is Block
                and lender.is_lent(location)
            ):
                return TensorDesc(name, datatype, shape, location)
            if lender.carry(location):  # a lent block: the response takes it as it is
                written.append(location)
                return TensorDesc(name, datatype, shape, location)
            # another response carries it already: this one gets a copy
        if array.dtype is _WIRE_DTYPES.get(datatype):
            # The usual output: an array of the datatype's own dtype (the same object: NumPy
            # keeps one per type), whose bytes in C order are the wire layout: its size and
            # ``tobytes`` (which copies in C order, contiguous or not), without the generic
            # helpers' look-ups and tests (~1.1k instructions per small output).
            nbytes: int = array.nbytes
            if nbytes <= inline_room and nbytes <= INLINE_TENSOR_MAX:
                return TensorDesc(name, datatype, shape, InlineBytes(array.tobytes()))
        else:
            nbytes = numpy_to_buffer_size(array, datatype)
            if nbytes <= inline_room and nbytes <= INLINE_TENSOR_MAX:
                return TensorDesc(name, datatype, shape, _inline(array, datatype, nbytes))
        block = self.outputs.allocate(nbytes)
        written.append(block)
        _copy(array, datatype, self.outputs.view(block))
        return TensorDesc(name, datatype, shape, block)


#: Each fixed-size datatype's NumPy dtype (BYTES is serialized, elsewhere).
_WIRE_DTYPES: Final[dict[str, np.dtype]] = {
    name: dtype for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"
}


def _inline(array: np.ndarray, datatype: str, nbytes: int) -> InlineBytes:
    """The tensor's bytes in the wire layout, copied once, to travel inside the message."""
    if (
        datatype != "BYTES"
        and array.flags.c_contiguous
        and array.dtype == NUMPY_DTYPES.get(datatype)
    ):
        return InlineBytes(array.tobytes())
    staged = bytearray(nbytes)
    write_numpy(array, datatype, memoryview(staged))
    return InlineBytes(bytes(staged))


def _copy(array: np.ndarray, datatype: str, dest: memoryview) -> None:
    """``write_numpy``, with a plain byte copy for an array already in the wire layout (the
    usual output: C-contiguous, of the datatype's own dtype), which costs a fraction of NumPy's
    conversion machinery for a small tensor."""
    if (
        dest.nbytes
        and datatype != "BYTES"
        and array.flags.c_contiguous
        and array.dtype == NUMPY_DTYPES.get(datatype)
    ):
        dest[:] = memoryview(array).cast("B")  # type: ignore[arg-type]
    else:
        write_numpy(array, datatype, dest)
