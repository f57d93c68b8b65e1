"""GPU tensors between processes: through the supervisor's CUDA pools, by descriptor.

* **Out** (a response output, a BLS input): the stub asks the supervisor for a pool block on the
  tensor's device (``CUDA_ALLOCATE``), copies the tensor into it device-to-device once, and sends
  a ``CudaLocation``. The block is lent to this stub until the supervisor sees the descriptor in
  a response; a BLS input's block is given back (``CUDA_FREE``) once the call's response is
  dropped, as the CPU output arena's blocks are.
* **In** (a request input, a BLS output): the block is opened through its chunk's IPC handle
  (announced on the socket before the first descriptor into it) and wrapped as a cupy array:
  no copy. With ``FORCE_CPU_ONLY_INPUT_TENSORS`` (Triton's default, ``"yes"``) a request input
  is copied to the host once instead, as Triton does; BLS outputs stay on the GPU unless the
  call's ``preferred_memory`` asks for the CPU.

* **Clients' CUDA shared memory**: a request input or output in a client's registered CUDA region
  comes as a ``CudaRegionLocation`` carrying the client's IPC handle; the stub opens it (once per
  registration, cached) and reads the input in place (a GPU tensor, or one copy to the host when
  CPU inputs are forced) or writes the output there (device-to-device from a GPU tensor,
  host-to-device from a CPU one).

Device numbers on the wire are the server's. A stub started with ``CUDA_VISIBLE_DEVICES``
narrowed to its GPU (``SHOAL_NARROW_CUDA_VISIBLE_DEVICES``) sees that GPU as device 0;
``SHOAL_SERVER_CUDA_DEVICE`` tells it the server's number for it.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from shoal.ipc.call_messages import ControlOp
from shoal.ipc.cuda import (
    MEMCPY_DEVICE_TO_DEVICE,
    MEMCPY_HOST_TO_DEVICE,
    CudaPoolMap,
    close_ipc_handle,
    device_array,
    device_to_host,
    memcpy,
    open_ipc_handle,
    pinned_host_array,
)
from shoal.ipc.dtypes import NUMPY_DTYPES
from shoal.ipc.tensor import (
    CudaLocation,
    CudaRegionLocation,
    Location,
    TensorDesc,
    numpy_to_buffer_size,
    write_numpy,
)
from shoal.stub import pb_utils
from shoal.stub.control import ControlClient, ControlError
from shoal.stub.memory import RegionTooSmall

#: Set by the supervisor for a narrowed stub: the server's number of the stub's device 0.
SERVER_DEVICE_VARIABLE = "SHOAL_SERVER_CUDA_DEVICE"


class CudaPoolRefused(Exception):
    """The supervisor could not lend a pool block (the pool's limit, say); the text says why."""


class GpuTensors:
    """Moves this stub's GPU tensors into the pools, and wraps pool blocks it receives."""

    def __init__(
        self,
        control: ControlClient,
        pools: CudaPoolMap,
        wait_for_chunk: Callable[[CudaLocation], None],
        *,
        force_cpu_inputs: bool,
        environ: dict[str, str] | os._Environ[str] = os.environ,
    ) -> None:
        self._control = control
        self._pools = pools
        self._wait_for_chunk = wait_for_chunk
        self.force_cpu_inputs = force_cpu_inputs
        server = environ.get(SERVER_DEVICE_VARIABLE, "")
        self._server_device = int(server) if server.isdigit() else None
        pools.local_device = self._to_local
        #: BLS outputs in pool blocks, by device pointer here: (block, its call's keeper).
        self._known: dict[int, tuple[CudaLocation, weakref.ref[Any]]] = {}
        self._known_lock = threading.Lock()
        self.regions = ClientCudaRegions(self._to_local)
        #: Devices whose pool the server disabled: their tensors go through the host.
        self._disabled: set[int] = set()

    # -- out --------------------------------------------------------------------------------

    def write(
        self, tensor: Any, lent: list[CudaLocation], *, for_response: bool
    ) -> TensorDesc | None:
        """Copy a GPU tensor into a pool block lent to this stub (appended to ``lent``); None
        when the device's pool is disabled (the caller then copies the tensor to the host).

        A tensor over the pool block of a BLS response this stub still holds goes on to a BLS
        call by the same descriptor, without a copy (not to a response: the block belongs to
        the call's response until the model drops it)."""
        array = tensor._gpu
        nbytes = int(array.nbytes)
        if not for_response:
            known = self._known_block(int(array.data.ptr), nbytes)
            if known is not None:
                shape = tuple(int(dim) for dim in array.shape)
                return TensorDesc(tensor.name(), tensor._datatype(), shape, known)
        device = self._to_server(int(array.device.id))
        if device in self._disabled:
            return None
        try:
            wire = self._control.call(ControlOp.CUDA_ALLOCATE, device, nbytes)
        except ControlError as error:
            raise CudaPoolRefused(
                f"no CUDA pool memory for tensor '{tensor.name()}' ({nbytes} bytes on device "
                f"{device}): {error}"
            ) from None
        if wire is None:  # --cuda-memory-pool-byte-size <device>:0
            self._disabled.add(device)
            return None
        location = CudaLocation(*wire)
        try:
            memcpy(self._pointer(location), int(array.data.ptr), nbytes, MEMCPY_DEVICE_TO_DEVICE)
        except BaseException:
            self.give_back([location])  # the response fails; its block must not stay lent
            raise
        lent.append(location)
        shape = tuple(int(dim) for dim in array.shape)
        return TensorDesc(tensor.name(), tensor._datatype(), shape, location)

    def give_back(self, locations: list[CudaLocation]) -> None:
        """Blocks lent to this stub that it will not hand on (a BLS call's inputs, or the
        outputs of a response that failed)."""
        if locations:
            wires = [[loc.device, loc.offset, loc.nbytes] for loc in locations]
            try:
                self._control.tell(ControlOp.CUDA_FREE, *wires)
            except Exception:
                pass  # the supervisor is gone, and the pools with it

    # -- in ---------------------------------------------------------------------------------

    def input_tensor(self, desc: TensorDesc) -> Any:
        """A request input in a pool block or a client's CUDA region, read in place: a GPU
        tensor, or one copy to the host when the model forces CPU inputs."""
        pointer = self._input_pointer(desc.location)
        if self.force_cpu_inputs:
            return _host_tensor(desc, pointer)
        return pb_utils.Tensor._wrap_gpu(
            desc.name, self._device_view(desc, pointer, None), desc.datatype
        )

    def _input_pointer(self, location: Location) -> int:
        if type(location) is CudaRegionLocation:
            return self.regions.pointer(location)
        assert isinstance(location, CudaLocation)
        return self._pointer(location)

    def output_tensor(self, desc: TensorDesc, keeper: object) -> Any:
        """A BLS output in a pool block, as a GPU tensor that keeps ``keeper`` alive."""
        location = desc.location
        assert isinstance(location, CudaLocation)
        array = self._device_view(desc, self._pointer(location), keeper)
        self._remember(int(array.data.ptr), location, keeper)
        return pb_utils.Tensor._wrap_gpu(desc.name, array, desc.datatype)

    def _known_block(self, pointer: int, nbytes: int) -> CudaLocation | None:
        """The pool block at ``pointer`` if it is a BLS output still held (its keeper alive:
        while it is, the block cannot be freed, so the pointer cannot be another's)."""
        with self._known_lock:
            entry = self._known.get(pointer)
        if entry is None or entry[1]() is None or entry[0].nbytes != nbytes:
            return None
        return entry[0]

    def close(self) -> None:
        self._pools.close()
        self.regions.close()

    # -- clients' CUDA regions --------------------------------------------------------------

    def place(self, tensor: Any, target: CudaRegionLocation) -> TensorDesc:
        """Write an output straight into the client's CUDA region: one device-to-device copy
        of a GPU tensor, one host-to-device copy of a CPU one."""
        gpu = tensor._gpu
        datatype = tensor._datatype()
        if gpu is not None:
            nbytes = int(gpu.nbytes)
            shape = tuple(int(dim) for dim in gpu.shape)
        else:
            array = tensor._array()
            nbytes = numpy_to_buffer_size(array, datatype)
            shape = tuple(int(dim) for dim in array.shape)
        if nbytes > target.nbytes:
            raise RegionTooSmall(tensor.name(), target.nbytes, nbytes)
        pointer = self.regions.pointer(target)
        if nbytes and gpu is not None:
            memcpy(pointer, int(gpu.data.ptr), nbytes, MEMCPY_DEVICE_TO_DEVICE)
        elif nbytes:
            host = pinned_host_array(nbytes)
            write_numpy(array, datatype, memoryview(host.data))
            memcpy(pointer, host.ctypes.data, nbytes, MEMCPY_HOST_TO_DEVICE)
        where = CudaRegionLocation(
            target.region, target.device, target.offset, nbytes, target.handle
        )
        return TensorDesc(tensor.name(), datatype, shape, where)

    def _device_view(self, desc: TensorDesc, pointer: int, keeper: object) -> Any:
        location = desc.location
        assert isinstance(location, CudaLocation | CudaRegionLocation)
        device = self._to_local(location.device)
        dtype = NUMPY_DTYPES[desc.datatype]
        return device_array(device, pointer, location.nbytes, dtype, desc.shape, keeper)

    def _remember(self, pointer: int, location: CudaLocation, keeper: object) -> None:
        """A BLS output's block by its pointer here, for as long as its call's keeper lives."""
        with self._known_lock:
            if len(self._known) > 4096:
                self._known = {k: v for k, v in self._known.items() if v[1]() is not None}
            self._known[pointer] = (location, weakref.ref(keeper))

    def _pointer(self, location: CudaLocation) -> int:
        self._wait_for_chunk(location)
        return self._pools.pointer(location)

    def _to_server(self, local: int) -> int:
        return self._server_device if self._server_device is not None and local == 0 else local

    def _to_local(self, server: int) -> int:
        if self._server_device is None:
            return server
        if server != self._server_device:
            raise CudaPoolRefused(
                f"a GPU tensor on the server's CUDA device {server}, but this stub sees only "
                f"device {self._server_device} (SHOAL_NARROW_CUDA_VISIBLE_DEVICES is yes)"
            )
        return 0


def _host_tensor(desc: TensorDesc, pointer: int) -> Any:
    """An input copied to the host: the model's own copy, writable, as on Triton."""
    host = device_to_host(pointer, desc.location.nbytes).view(NUMPY_DTYPES[desc.datatype])
    return pb_utils.Tensor._wrap(desc.name, host.reshape(desc.shape), desc.datatype)


class ClientCudaRegions:
    """Clients' CUDA regions this stub has opened (the last few kept open).

    Keyed by the client's handle, not by registration: CUDA opens a handle once per process,
    and a client may register the same allocation again under a new registration."""

    _KEEP = 64

    def __init__(self, to_local: Callable[[int], int]) -> None:
        self._to_local = to_local
        self._opened: collections.OrderedDict[tuple[int, bytes], tuple[int, int]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def pointer(self, location: CudaRegionLocation) -> int:
        """The device pointer of the window's first byte in this process."""
        key = (location.device, location.handle)
        with self._lock:
            opened = self._opened.get(key)
            if opened is None:
                device = self._to_local(location.device)
                opened = (device, open_ipc_handle(device, location.handle))
                self._opened[key] = opened
                while len(self._opened) > self._KEEP:
                    close_ipc_handle(*self._opened.popitem(last=False)[1])
            self._opened.move_to_end(key)
        return opened[1] + location.offset

    def forget(self, device: int, handle: bytes) -> None:
        """The client unregistered this allocation: close it if this stub opened it."""
        with self._lock:
            opened = self._opened.pop((device, handle), None)
        if opened is not None:
            close_ipc_handle(*opened)

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, collections.OrderedDict()
        for device, pointer in opened.values():
            close_ipc_handle(device, pointer)
