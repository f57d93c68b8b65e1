"""The CUDA shared-memory registry: Triton's behaviour without GPUs, and its bookkeeping with
an injected handle opener (what a GPU would do is in tests/gpu/)."""

from __future__ import annotations

import base64

import pytest

from shoal.core.errors import ErrorCode, InvalidArgument, NotFound, ShoalError
from shoal.core.types import CudaSharedMemoryRegion
from shoal.frontends.http._shared_memory import parse_cuda_register_request
from shoal.ipc.arena import OwnedArena
from shoal.supervisor.memory.cuda_shm import CudaSharedMemoryRegistry
from shoal.supervisor.memory.system_shm import SharedMemoryRegistry

HANDLE = bytes(range(64))


class Opened:
    def __init__(self) -> None:
        self.open: dict[int, tuple[int, bytes]] = {}
        self.closed: list[int] = []

    def opener(self, device: int, handle: bytes) -> int:
        pointer = 0x7F00_0000_0000 + len(self.open) * 0x1_0000_0000
        self.open[pointer] = (device, handle)
        return pointer

    def closer(self, device: int, pointer: int) -> None:
        assert self.open[pointer][0] == device
        self.closed.append(pointer)


def with_gpus(count: int = 2) -> tuple[CudaSharedMemoryRegistry, Opened]:
    opened = Opened()
    registry = CudaSharedMemoryRegistry(
        device_count=lambda: count, opener=opened.opener, closer=opened.closer
    )
    return registry, opened


def test_without_gpus_register_fails_as_tritonserver_and_the_rest_works() -> None:
    registry = CudaSharedMemoryRegistry(device_count=lambda: 0)
    with pytest.raises(InvalidArgument) as caught:
        registry.register("r", HANDLE, 0, 64)
    assert (
        str(caught.value) == "failed to register CUDA shared memory region: 'r', GPUs not supported"
    )
    assert registry.status() == []
    with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'r'"):
        registry.status("r")
    registry.unregister("r")
    registry.unregister()


def test_register_status_unregister_close_the_handle() -> None:
    registry, opened = with_gpus()
    registry.register("r", HANDLE, 1, 4096)
    assert registry.status() == [CudaSharedMemoryRegion("r", 1, 4096)]
    [(pointer, (device, handle))] = opened.open.items()
    assert (device, handle) == (1, HANDLE)
    assert registry.pointer("r", 256, 1024, what="input 'x'") == (1, pointer + 256)
    registry.unregister("r")
    assert opened.closed == [pointer] and registry.status() == []


@pytest.mark.parametrize(
    ("handle", "device", "message"),
    [
        (b"short", 0, "raw_handle must be 64 bytes"),
        (HANDLE, 2, "device_id 2 must name one of the 2 visible GPUs"),
    ],
)
def test_bad_registrations_are_invalid(handle: bytes, device: int, message: str) -> None:
    registry, opened = with_gpus()
    with pytest.raises(InvalidArgument, match=message):
        registry.register("r", handle, device, 64)
    assert opened.open == {}


def test_a_handle_cuda_refuses_is_invalid_with_cudas_words() -> None:
    def refuse(device: int, handle: bytes) -> int:
        raise RuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle")

    registry = CudaSharedMemoryRegistry(device_count=lambda: 1, opener=refuse)
    with pytest.raises(InvalidArgument, match="'r': cudaErrorInvalidResourceHandle"):
        registry.register("r", HANDLE, 0, 64)


def test_windows_are_bounds_checked() -> None:
    registry, _ = with_gpus()
    registry.register("r", HANDLE, 0, 100)
    with pytest.raises(InvalidArgument, match="do not fit in CUDA shared memory region 'r'"):
        registry.pointer("r", 64, 64, what="output 'y'")
    with pytest.raises(InvalidArgument, match="Unable to find cuda shared memory region: 'q'"):
        registry.pointer("q", 0, 1, what="output 'y'")


def test_names_are_unique_across_system_and_cuda_regions() -> None:
    cuda, _ = with_gpus()
    registry = SharedMemoryRegistry(cuda)
    registry.register_cuda("r", HANDLE, 0, 64)
    for register in (
        lambda: registry.register_cuda("r", HANDLE, 0, 64),
        lambda: registry.register("r", "/never-opened", 0, 8),
    ):
        with pytest.raises(ShoalError) as caught:
            register()
        assert caught.value.code is ErrorCode.ALREADY_EXISTS
        assert str(caught.value) == "shared memory region 'r' already in manager"
    registry.close()
    assert registry.cuda_status() == []


def test_the_http_body_carries_the_handle_in_base64() -> None:
    body = (
        b'{"raw_handle": {"b64": "' + base64.b64encode(HANDLE) + b'"}, '
        b'"device_id": 1, "byte_size": 4096}'
    )
    parsed = parse_cuda_register_request(body)
    assert (parsed.raw_handle, parsed.device_id, parsed.byte_size) == (HANDLE, 1, 4096)


def test_requests_reach_a_region_by_descriptor_unique_per_registration() -> None:
    registry, _ = with_gpus()
    registry.register("r", HANDLE, 1, 4096)
    first = registry.location("r", 1024, 512, what="input 'x'")
    assert (first.device, first.offset, first.nbytes, first.handle) == (1, 1024, 512, HANDLE)
    with pytest.raises(InvalidArgument, match="input 'x': offset 4000 and byte size 512"):
        registry.location("r", 4000, 512, what="input 'x'")
    registry.unregister("r")
    registry.register("r", HANDLE, 1, 4096)  # the client re-created its allocation
    assert registry.location("r", 1024, 512, what="input 'x'").region != first.region


def test_cuda_region_inputs_and_outputs_become_descriptors() -> None:
    from shoal.core.types import InferInput, InferRequest, RequestedOutput
    from shoal.ipc.tensor import CudaRegionLocation
    from shoal.supervisor.requests.client_shm import output_regions, read_shm_inputs

    registry, _ = with_gpus()
    shm = SharedMemoryRegistry(registry)
    registry.register("gpu", HANDLE, 0, 256)
    window = {"shared_memory_region": "gpu", "shared_memory_byte_size": 64}
    request = InferRequest(
        "m",
        inputs=[
            InferInput("A", "FP32", (16,), b"", dict(window)),
            InferInput("S", "BYTES", (1,), b"", {**window, "shared_memory_offset": 64}),
        ],
        outputs=[RequestedOutput("OUT", {**window, "shared_memory_offset": 128})],
    )
    registry.read = lambda name, offset, size, what: memoryview(b"\x01\0\0\0x" + bytes(59))  # type: ignore[method-assign]
    inputs = read_shm_inputs(shm, request)
    assert list(inputs) == ["A"], "BYTES are staged through the host, to check their elements"
    assert isinstance(inputs["A"], CudaRegionLocation) and inputs["A"].nbytes == 64
    assert request.inputs[1].data.nbytes == 64
    [(name, placed)] = output_regions(shm, request).items()
    assert name == "OUT" and isinstance(placed, CudaRegionLocation) and placed.offset == 128


def test_unregistering_says_which_allocations_the_stubs_should_close() -> None:
    registry, _ = with_gpus()
    registry.register("a", HANDLE, 1, 64)
    registry.register("b", bytes(64), 0, 64)
    assert [(e.region.device_id, e.handle) for e in registry.unregister("a")] == [(1, HANDLE)]
    assert [(e.region.device_id, e.handle) for e in registry.unregister()] == [(0, bytes(64))]
    assert registry.unregister("a") == []


def test_every_live_stub_hears_that_a_region_closed() -> None:
    import asyncio
    import os

    from shoal.ipc import messages as msg
    from shoal.ipc.queue import Channel
    from shoal.supervisor.instances.process import StubLaunch, StubProcess
    from shoal.supervisor.memory.segments import SegmentDirectory

    async def scenario() -> list[list[msg.Message]]:
        # Two stub processes that are never spawned: each one's ring is read from its stub end.
        procs = [
            StubProcess(StubLaunch(f"stub{arena}", ring_bytes=1 << 16), arena) for arena in (1, 2)
        ]
        stub_ends = [Channel.attach([os.dup(fd) for fd in p.channel.child_fds()]) for p in procs]
        loop = asyncio.get_running_loop()
        try:
            with OwnedArena(
                0, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 17
            ) as inputs:
                directory = SegmentDirectory(inputs)
                for proc in procs:
                    directory.register(proc)
                directory.broadcast(news)
            heard = []
            for end in stub_ends:
                payload = end.recv_down_nowait()
                heard.append([] if payload is None else [msg.decode(payload)])
            return heard
        finally:
            for end in stub_ends:
                end.close()
            for proc in procs:
                proc.close(loop)

    news = msg.CudaRegionClosed(1, HANDLE)
    assert asyncio.run(scenario()) == [[news], [news]]
