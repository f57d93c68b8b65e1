"""A region that requests in flight use outlives its unregistration, as in Triton: listed, usable
and its name taken until the last of them ends; then closed, and the stubs told."""

from __future__ import annotations

import os

import posix_ipc
import pytest

from shoal.core.errors import ErrorCode, NotFound, ShoalError
from shoal.core.types import InferInput, InferRequest, RequestedOutput
from shoal.ipc import messages as msg
from shoal.ipc.records import RequestRecord
from shoal.supervisor.memory.cuda_shm import CudaSharedMemoryRegistry
from shoal.supervisor.memory.system_shm import SharedMemoryRegistry
from shoal.supervisor.promise import Promise, Settled
from shoal.supervisor.requests.client_shm import held_regions, let_go
from shoal.supervisor.work import Work

pytestmark = pytest.mark.timeout(10)

HANDLE = bytes(range(64))


@pytest.fixture
def key():
    name = f"/shoal_unit_held_{os.getpid()}"
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=64)
    shm.close_fd()
    yield name
    posix_ipc.unlink_shared_memory(name)


def _open_files() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own fd, closed since
            pass
    return found


def _request(*regions: str) -> InferRequest:
    window = {"shared_memory_byte_size": 8}
    return InferRequest(
        "m",
        inputs=[
            InferInput("IN", "INT32", (2,), b"", {**window, "shared_memory_region": regions[0]})
        ],
        outputs=[
            RequestedOutput(f"OUT{i}", {**window, "shared_memory_region": r})
            for i, r in enumerate(regions[1:])
        ],
    )


def test_an_unregistered_region_stays_until_its_last_request_ends(key):
    told: list[object] = []
    registry = SharedMemoryRegistry(tell_stubs=told.append)
    registry.register("in", key, 0, 32)
    registry.register("out", key, 32, 32)
    first = held_regions(registry, _request("in", "out"))
    handed = registry.location("in", 0, 8, what="input 'IN'")  # a stub was given it
    registry.unregister()
    assert [r.name for r in registry.status()] == ["in", "out"], "listed while in use"
    with pytest.raises(ShoalError) as taken:
        registry.register("in", key, 0, 8)
    assert taken.value.code is ErrorCode.ALREADY_EXISTS
    second = held_regions(registry, _request("in"))  # still usable by a new request
    assert bytes(registry.read("in", 0, 4, what="input 'IN'")) == bytes(4)
    registry.release(first)
    assert [r.name for r in registry.status()] == ["in"], "'out' had no other user"
    assert told == []  # 'out' never reached a stub: nothing to tell
    registry.release(second)
    assert registry.status() == []
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'in'"):
        registry.status("in")
    assert told == [msg.RegionClosed(handed.region)]
    assert not any(target.startswith(f"/dev/shm{key}") for target in _open_files())
    registry.register("in", key, 0, 8)  # the name is free again
    registry.close()


def test_a_region_no_request_uses_goes_at_once(key):
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 8)
    registry.release(held_regions(registry, _request("r")))
    registry.unregister("r")
    assert registry.status() == []
    assert held_regions(registry, _request("r")) == [], "an unknown name holds nothing"
    registry.close()


def test_held_cuda_regions_close_their_handle_after_the_last_request():
    closed: list[tuple[int, int]] = []
    told: list[object] = []
    cuda = CudaSharedMemoryRegistry(
        device_count=lambda: 1,
        opener=lambda device, handle: 0x1000,
        closer=lambda device, pointer: closed.append((device, pointer)),
    )
    registry = SharedMemoryRegistry(cuda, tell_stubs=told.append)
    registry.register_cuda("gpu", HANDLE, 0, 64)
    held = held_regions(registry, _request("gpu", "gpu"))
    registry.unregister_cuda()
    assert [r.name for r in registry.cuda_status()] == ["gpu"]
    assert closed == [] and told == []
    registry.release(held)
    assert registry.cuda_status() == []
    assert closed == [(0, 0x1000)]
    assert told == [msg.CudaRegionClosed(0, HANDLE)]


def test_shutdown_closes_held_regions_once(key):
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 8)
    held = held_regions(registry, _request("r"))
    registry.unregister()
    registry.close()
    registry.release(held)  # a request answered after shutdown: nothing closed twice
    assert registry.status() == []


@pytest.mark.parametrize("inside", [True, False])
def test_a_request_that_ends_while_its_stub_runs_it_holds_until_the_stub_is_done(key, inside):
    """Cancelled or timed out while its work is inside a stub: the region stays listed until
    the ledger says the work left (Triton: until the backend releases the request)."""
    registry = SharedMemoryRegistry()
    registry.register("in", key, 0, 32)
    held = held_regions(registry, _request("in"))
    # real arguments: the compiled Work (the CI build) checks their types
    work = Work(RequestRecord("m", 0, 0, {}, [], [], 0), [], Promise(Settled()))
    work.inside = inside
    registry.unregister("in")
    let_go(registry, work, held)
    assert [r.name for r in registry.status()] == (["in"] if inside else [])
    work.left()
    assert registry.status() == []
    assert not work.inside and work.on_leave is None
