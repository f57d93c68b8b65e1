"""A stub's GPU tensor bookkeeping without a GPU: what it asks the supervisor for, what it
gives back, which descriptors it sends, and how it numbers devices.

Device memory is a stand-in: ``memcpy`` and ``device_array`` are replaced by recorders, pool
chunks are "opened" at fake addresses, and tensors are objects with the attributes a cupy array
has. The real copies and IPC handles run in tests/gpu/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from shoal.ipc._alloc import SEGMENT_SHIFT
from shoal.ipc.arena import OwnedArena
from shoal.ipc.call_messages import ControlOp
from shoal.ipc.cuda import CudaChunkAnnounce, CudaPoolMap
from shoal.ipc.tensor import CudaLocation, TensorDesc
from shoal.stub import gpu_tensors
from shoal.stub.control import ControlError
from shoal.stub.gpu_tensors import CudaPoolRefused, GpuTensors
from shoal.stub.memory import Locations, SharedOutputArena
from shoal.stub.pb_utils import Tensor
from shoal.stub.tensors_out import TensorWriter

BASE = 1 << 40  # where this process "opened" chunk 0


class FakeControl:
    """The supervisor's side of the control calls: blocks handed out one after the other."""

    def __init__(self, refuse: str | None = None, disabled: bool = False) -> None:
        self.calls: list[tuple[ControlOp, tuple[Any, ...]]] = []
        self.told: list[tuple[ControlOp, tuple[Any, ...]]] = []
        self._next = 0
        self._refuse = refuse
        self._disabled = disabled

    def call(self, op: ControlOp, *args: Any) -> Any:
        self.calls.append((op, args))
        if self._refuse is not None:
            raise ControlError(self._refuse)
        if self._disabled:
            return None
        device, nbytes = args
        offset, self._next = self._next, self._next + 4096
        return [device, offset, nbytes]

    def tell(self, op: ControlOp, *args: Any) -> None:
        self.told.append((op, args))


class DeviceArray:
    """The attributes of a cupy ndarray that the stub reads."""

    def __init__(self, pointer: int, nbytes: int, device: int = 0) -> None:
        self.nbytes = nbytes
        self.shape = (nbytes // 4,)
        self.data = SimpleNamespace(ptr=pointer)
        self.device = SimpleNamespace(id=device)


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    done: list[tuple[int, int, int]] = []
    monkeypatch.setattr(gpu_tensors, "memcpy", lambda dst, src, n, kind: done.append((dst, src, n)))

    def device_array(device, pointer, nbytes, dtype, shape, owner=None):  # type: ignore[no-untyped-def]
        array = DeviceArray(pointer, nbytes, device)
        array.owner = owner  # type: ignore[attr-defined]  # as cupy's UnownedMemory keeps it
        return array

    monkeypatch.setattr(gpu_tensors, "device_array", device_array)
    return done


def make(
    control: FakeControl, *, force_cpu: bool = False, environ: dict[str, str] | None = None
) -> GpuTensors:
    pools = CudaPoolMap(lambda device, handle: BASE, lambda device, pointer: None)
    for device in (0, 3):
        pools.add(CudaChunkAnnounce(device, 0, 1 << 20, bytes(64)))
    return GpuTensors(
        control,  # type: ignore[arg-type]
        pools,
        lambda location: None,
        force_cpu_inputs=force_cpu,
        environ=environ or {},
    )


def gpu_output(pointer: int = 0x7000, nbytes: int = 1024, device: int = 0) -> Tensor:
    return Tensor._wrap_gpu("OUT", DeviceArray(pointer, nbytes, device), "FP32")


def test_a_gpu_output_is_copied_once_into_a_block_lent_to_the_stub(copies) -> None:
    control = FakeControl()
    gpu = make(control)
    lent: list[CudaLocation] = []
    desc = gpu.write(gpu_output(), lent, for_response=True)
    assert control.calls == [(ControlOp.CUDA_ALLOCATE, (0, 1024))]
    assert desc == TensorDesc("OUT", "FP32", (256,), CudaLocation(0, 0, 1024))
    assert lent == [desc.location]
    assert copies == [(BASE, 0x7000, 1024)], "one device-to-device copy into the block"


def test_a_refused_block_names_the_tensor_and_the_reason(copies) -> None:
    gpu = make(FakeControl(refuse="CUDA memory pool of device 0 is exhausted"))
    lent: list[CudaLocation] = []
    with pytest.raises(
        CudaPoolRefused, match=r"tensor 'OUT' \(1024 bytes on device 0\).*exhausted"
    ):
        gpu.write(gpu_output(), lent, for_response=True)
    assert lent == [] and copies == []


def test_a_failed_copy_gives_the_block_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(dst: int, src: int, n: int, kind: int) -> None:
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setattr(gpu_tensors, "memcpy", broken)
    control = FakeControl()
    lent: list[CudaLocation] = []
    with pytest.raises(RuntimeError):
        make(control).write(gpu_output(), lent, for_response=True)
    assert lent == []
    assert control.told == [(ControlOp.CUDA_FREE, ([0, 0, 1024],))]


def test_a_bls_output_is_handed_on_to_a_bls_call_by_its_descriptor(copies) -> None:
    control = FakeControl()
    gpu = make(control)
    block = CudaLocation(0, (0 << SEGMENT_SHIFT) | 8192, 1024)

    class Keeper:
        pass

    received = gpu.output_tensor(TensorDesc("BIG", "FP32", (256,), block), Keeper())
    assert not received.is_cpu()
    again = Tensor._wrap_gpu("X", received._gpu, "FP32")  # e.g. through to_dlpack/from_dlpack
    lent: list[CudaLocation] = []
    desc = gpu.write(again, lent, for_response=False)
    assert desc.location == block and lent == [] and copies == [], "no block, no copy"
    # Not into a response: the block belongs to the call's response.
    gpu.write(again, lent, for_response=True)
    assert len(lent) == 1


def _record_host_copies(copies, monkeypatch) -> None:
    """Device-to-host copies recorded in ``copies``, each giving 16 zero bytes."""

    def device_to_host(pointer: int, nbytes: int) -> np.ndarray:
        copies.append((0, pointer, nbytes))
        return np.zeros(16, dtype=np.uint8)

    monkeypatch.setattr(gpu_tensors, "device_to_host", device_to_host)


def test_inputs_in_the_pool_are_gpu_tensors_unless_cpu_is_forced(copies, monkeypatch) -> None:
    block = CudaLocation(0, 4096, 16)
    desc = TensorDesc("IN", "FP32", (4,), block)
    assert not make(FakeControl()).input_tensor(desc).is_cpu()
    _record_host_copies(copies, monkeypatch)
    on_host = make(FakeControl(), force_cpu=True).input_tensor(desc)
    assert on_host.is_cpu() and on_host.as_numpy().shape == (4,)
    assert on_host.as_numpy().flags.writeable  # the model's own copy, as on Triton
    assert copies == [(0, BASE + 4096, 16)]


def test_given_back_blocks_go_in_one_message() -> None:
    control = FakeControl()
    make(control).give_back([CudaLocation(0, 0, 10), CudaLocation(0, 4096, 20)])
    make(control).give_back([])
    assert control.told == [(ControlOp.CUDA_FREE, ([0, 0, 10], [0, 4096, 20]))]


def test_a_narrowed_stub_uses_the_servers_device_numbers(copies) -> None:
    control = FakeControl()
    gpu = make(control, environ={"SHOAL_SERVER_CUDA_DEVICE": "3"})
    desc = gpu.write(gpu_output(device=0), [], for_response=True)  # its device 0 is the server's 3
    assert control.calls == [(ControlOp.CUDA_ALLOCATE, (3, 1024))]
    assert desc.location == CudaLocation(3, 0, 1024)
    received = gpu.input_tensor(TensorDesc("IN", "FP32", (4,), CudaLocation(3, 4096, 16)))
    assert received._gpu.device.id == 0


@pytest.fixture
def writer_for() -> Iterator[Callable[[GpuTensors], TensorWriter]]:
    """Makes writers whose output arena these tests never touch (GPU tensors go to the pool):
    the real classes, which the compiled hot path asks for."""
    with OwnedArena(2, initial_bytes=1 << 16) as arena:
        yield lambda gpu: TensorWriter(SharedOutputArena(arena), Locations(), gpu)


def test_a_disabled_pool_sends_gpu_tensors_through_the_host(copies) -> None:
    control = FakeControl(disabled=True)
    gpu = make(control)
    assert gpu.write(gpu_output(), [], for_response=True) is None
    assert gpu.write(gpu_output(), [], for_response=True) is None
    assert len(control.calls) == 1, "asked once; the answer is remembered"

    host = np.arange(4, dtype=np.float32)
    tensor = Tensor._wrap_gpu("OUT", DeviceArray(0x7000, 16), "FP32")
    tensor._gpu.get = lambda: host  # what cupy's get() gives: the host copy
    with OwnedArena(1, initial_bytes=1 << 16) as arena:
        writer = TensorWriter(SharedOutputArena(arena), Locations(), gpu)
        written: list[Any] = []
        desc = writer.describe(tensor, written, for_response=True)
        assert desc.location.arena_id == 1 and desc.location.nbytes == 16
        assert bytes(arena.view(desc.location)) == host.tobytes()
    assert copies == [], "no device copy: the tensor went to the host"


def test_a_narrowed_stub_refuses_a_device_it_cannot_see(copies) -> None:
    gpu = make(FakeControl(), environ={"SHOAL_SERVER_CUDA_DEVICE": "3"})
    with pytest.raises(CudaPoolRefused, match="server's CUDA device 0, but this stub sees only"):
        gpu.input_tensor(TensorDesc("IN", "FP32", (4,), CudaLocation(0, 4096, 16)))


def test_a_region_registered_again_reuses_the_open_handle(monkeypatch) -> None:
    from shoal.ipc.tensor import CudaRegionLocation
    from shoal.stub.gpu_tensors import ClientCudaRegions

    opened: list[bytes] = []
    monkeypatch.setattr(
        gpu_tensors, "open_ipc_handle", lambda device, handle: opened.append(handle) or BASE
    )
    regions = ClientCudaRegions(lambda device: device)
    handle = bytes(range(64))
    first = CudaRegionLocation("1:r", 0, 0, 64, handle)
    again = CudaRegionLocation("2:r", 0, 16, 64, handle)  # unregistered, registered again
    assert regions.pointer(first) == BASE and regions.pointer(again) == BASE + 16
    assert opened == [handle], "CUDA opens a handle once per process"


def test_a_refused_bls_input_gives_back_the_inputs_copied_before_it(copies, writer_for) -> None:
    from shoal.stub.bls import BlsClient

    class RefuseSecond(FakeControl):
        def call(self, op: ControlOp, *args: Any) -> Any:
            if len(self.calls) == 1:
                self.calls.append((op, args))
                raise ControlError("CUDA memory pool of device 0 is exhausted")
            return super().call(op, *args)

    control = RefuseSecond()
    writer = writer_for(make(control))
    pump = SimpleNamespace(new_call_id=lambda: 1)
    client = BlsClient(writer, pump, lambda message: None, lambda block: memoryview(b""))  # type: ignore[arg-type]
    request = SimpleNamespace(inputs=lambda: [gpu_output(0x7000), gpu_output(0x9000)])
    with pytest.raises(CudaPoolRefused):
        client._call(request, decoupled=False)
    assert control.told == [(ControlOp.CUDA_FREE, ([0, 0, 1024],))]


def test_a_bls_input_passed_on_by_descriptor_is_held_until_that_call_is_done(
    copies, writer_for
) -> None:
    import gc
    import weakref

    from shoal.stub import pb_utils
    from shoal.stub.bls import BlsClient

    gpu = make(FakeControl())

    class Keeper:
        pass

    first_call = Keeper()
    first_alive = weakref.ref(first_call)
    block = CudaLocation(0, 8192, 1024)
    received = gpu.output_tensor(TensorDesc("BIG", "FP32", (256,), block), first_call)
    del first_call
    sent: list[Any] = []
    writer = writer_for(gpu)
    pump = SimpleNamespace(new_call_id=lambda: 2, expect=lambda call_id: None)
    client = BlsClient(writer, pump, sent.append, lambda block: memoryview(b""))  # type: ignore[arg-type]
    request = pb_utils.InferenceRequest(
        model_name="gpu_sum", inputs=[received], requested_output_names=["TOTAL"]
    )
    _, second_call = client._call(request, decoupled=False)
    assert sent[0].request.inputs[0].location == block, "passed on by its descriptor"
    del received, request
    gc.collect()
    assert first_alive() is not None, "the first call's block is held while the second runs"
    del second_call
    gc.collect()
    assert first_alive() is None


def test_a_region_the_client_unregistered_is_closed(monkeypatch) -> None:
    from shoal.ipc.tensor import CudaRegionLocation
    from shoal.stub.gpu_tensors import ClientCudaRegions

    closed: list[tuple[int, int]] = []
    monkeypatch.setattr(gpu_tensors, "open_ipc_handle", lambda device, handle: BASE)
    monkeypatch.setattr(
        gpu_tensors, "close_ipc_handle", lambda device, pointer: closed.append((device, pointer))
    )
    regions = ClientCudaRegions(lambda device: device)
    handle = bytes(range(64))
    regions.pointer(CudaRegionLocation("1:r", 0, 0, 64, handle))
    regions.forget(0, bytes(64))  # another allocation: nothing to close
    regions.forget(0, handle)
    assert closed == [(0, BASE)]
    regions.close()
    assert closed == [(0, BASE)], "closed once"


def test_inputs_in_a_client_region_are_read_in_place(copies, monkeypatch) -> None:
    from shoal.ipc.tensor import CudaRegionLocation

    monkeypatch.setattr(gpu_tensors, "open_ipc_handle", lambda device, handle: BASE)
    desc = TensorDesc("IN", "FP32", (4,), CudaRegionLocation("1:r", 0, 32, 16, bytes(64)))
    on_gpu = make(FakeControl()).input_tensor(desc)
    assert not on_gpu.is_cpu() and on_gpu._gpu.data.ptr == BASE + 32
    _record_host_copies(copies, monkeypatch)
    on_host = make(FakeControl(), force_cpu=True).input_tensor(desc)
    assert on_host.is_cpu() and copies == [(0, BASE + 32, 16)]
