"""The CUDA pool's bookkeeping and its handle messages, without a GPU.

The pool reaches device memory only through ``DeviceMemory``; here that is host bookkeeping of
fake pointers, so what is tested is the pool itself: growth in chunks, the hard limit, the error
when it is exhausted, chunk retirement, offsets from the arena allocator, and how a stub opens
each chunk once.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ipc._alloc import SEGMENT_SHIFT, split_key
from shoal.ipc.cuda import (
    BLOCK_ALIGN,
    IPC_HANDLE_BYTES,
    CudaChunkAnnounce,
    CudaPool,
    CudaPoolExhausted,
    CudaPoolMap,
    cuda_device_count,
)
from shoal.ipc.tensor import CudaLocation, TensorDesc

MIB = 1 << 20


class HostLedger:
    """``DeviceMemory`` that hands out fake, non-overlapping pointers and records them."""

    def __init__(self, capacity: int | None = None) -> None:
        self.live: dict[int, int] = {}
        self.freed: list[int] = []
        self._next = itertools.count(1 << 40, 1 << 32)
        self._capacity = capacity

    def allocate(self, device: int, nbytes: int) -> int:
        if self._capacity is not None and sum(self.live.values()) + nbytes > self._capacity:
            raise MemoryError(f"device {device} is full")
        pointer = next(self._next)
        self.live[pointer] = nbytes
        return pointer

    def free(self, device: int, pointer: int) -> None:
        del self.live[pointer]
        self.freed.append(pointer)

    def ipc_handle(self, device: int, pointer: int) -> bytes:
        return pointer.to_bytes(8, "little") + bytes(IPC_HANDLE_BYTES - 8)


def make_pool(limit: int, chunk: int, **kwargs: object) -> tuple[CudaPool, HostLedger]:
    ledger = HostLedger()
    return CudaPool(1, limit, memory=ledger, chunk_bytes=chunk, **kwargs), ledger  # type: ignore[arg-type]


def test_first_allocation_makes_one_chunk_and_announces_it() -> None:
    announced: list[CudaChunkAnnounce] = []
    pool, ledger = make_pool(64 * MIB, 16 * MIB, on_new_chunk=announced.append)
    block = pool.allocate(1000)
    assert block == CudaLocation(1, 0, 1000)
    assert pool.capacity == 16 * MIB and list(ledger.live.values()) == [16 * MIB]
    [announce] = announced
    assert (announce.device, announce.chunk, announce.nbytes) == (1, 0, 16 * MIB)
    assert pool.pointer(block) == next(iter(ledger.live))


def test_blocks_are_256_byte_aligned_and_disjoint() -> None:
    pool, _ = make_pool(64 * MIB, 4 * MIB)
    blocks = [pool.allocate(size) for size in (1, 255, 256, 257, 4096, 3)]
    spans = sorted((pool.pointer(b), pool.pointer(b) + b.nbytes) for b in blocks)
    assert all(start % BLOCK_ALIGN == 0 for start, _ in spans)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))


def test_a_large_request_gets_a_chunk_of_its_own_size() -> None:
    pool, ledger = make_pool(1024 * MIB, 16 * MIB)
    block = pool.allocate(256 * MIB)
    assert split_key(block.offset) == (0, 0)
    assert sorted(ledger.live.values()) == [256 * MIB]


def test_exhaustion_names_the_sizes_and_the_flag() -> None:
    pool, _ = make_pool(32 * MIB, 16 * MIB)
    pool.allocate(20 * MIB)
    with pytest.raises(CudaPoolExhausted) as caught:
        pool.allocate(20 * MIB)
    error = caught.value
    assert (error.device, error.requested, error.limit) == (1, 20 * MIB, 32 * MIB)
    assert error.available == 12 * MIB
    assert "--cuda-memory-pool-byte-size 1:<bytes>" in str(error)


def test_a_full_device_is_exhaustion_not_a_crash() -> None:
    ledger = HostLedger(capacity=8 * MIB)
    pool = CudaPool(0, 64 * MIB, memory=ledger, chunk_bytes=16 * MIB)
    with pytest.raises(CudaPoolExhausted) as raised:
        pool.allocate(16 * MIB)
    # The device's own refusal, not advice to raise a limit that is not what is in the way.
    assert str(raised.value) == (
        "CUDA memory pool of device 0 could not grow by 16777216 bytes: device 0 is full"
    )


def test_empty_chunks_are_given_back_when_the_limit_is_in_the_way() -> None:
    retired: list[tuple[int, int]] = []
    pool, ledger = make_pool(
        32 * MIB, 8 * MIB, on_retired_chunk=lambda d, c: retired.append((d, c))
    )
    small = [pool.allocate(8 * MIB) for _ in range(4)]  # four full chunks: at the limit
    for block in small:
        pool.free(block)
    big = pool.allocate(24 * MIB)
    assert len(retired) == 3 and pool.capacity == 32 * MIB
    assert split_key(big.offset)[0] == 4, "chunk ids are never reused"
    assert len(ledger.freed) == 3


def test_a_late_peer_learns_every_live_chunk_and_close_frees_them() -> None:
    pool, ledger = make_pool(64 * MIB, 8 * MIB)
    pool.allocate(8 * MIB)
    pool.allocate(8 * MIB)
    assert [(a.chunk, a.nbytes) for a in pool.announcements()] == [(0, 8 * MIB), (1, 8 * MIB)]
    assert [a.handle for a in pool.announcements()] == [
        ledger.ipc_handle(0, p) for p in ledger.live
    ]
    pool.close()
    assert ledger.live == {} and pool.capacity == 0


def test_free_refuses_foreign_and_double_frees() -> None:
    pool, _ = make_pool(32 * MIB, 8 * MIB)
    block = pool.allocate(100)
    pool.free(block)
    with pytest.raises(ValueError, match="not an allocated block"):
        pool.free(block)
    with pytest.raises(ValueError, match="not an allocated block"):
        pool.free(CudaLocation(0, block.offset, 100))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12 * MIB)), max_size=40))
def test_random_traffic_stays_under_the_limit(ops: list[tuple[bool, int]]) -> None:
    pool, ledger = make_pool(40 * MIB, 8 * MIB)
    held: list[CudaLocation] = []
    for allocate, size in ops:
        if allocate or not held:
            try:
                held.append(pool.allocate(size))
            except CudaPoolExhausted as error:
                assert error.available < -(-size // BLOCK_ALIGN) * BLOCK_ALIGN
        else:
            pool.free(held.pop(size % len(held)))
        assert sum(ledger.live.values()) == pool.capacity <= 40 * MIB
    spans = sorted((pool.pointer(b), pool.pointer(b) + b.nbytes) for b in held)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    for block in held:
        pool.free(block)
    assert pool.used_bytes == 0


def test_announcement_round_trips_through_msgpack() -> None:
    announce = CudaChunkAnnounce(3, 7, 256 * MIB, bytes(range(64)))
    wire = msgpack.unpackb(msgpack.packb(announce.to_wire()))
    assert CudaChunkAnnounce.from_wire(wire) == announce


@pytest.mark.parametrize(
    "wire",
    [[0, 0, 64, b"short"], [0, -1, 64, bytes(64)], [0, 0, 64], "x", [0, 0, 64, "s" * 64]],
)
def test_malformed_announcements_are_refused(wire: object) -> None:
    with pytest.raises(ValueError, match="malformed CUDA chunk announcement"):
        CudaChunkAnnounce.from_wire(wire)


def test_pool_offsets_cross_the_wire_in_descriptors() -> None:
    pool, _ = make_pool(64 * MIB, 8 * MIB)
    pool.allocate(8 * MIB)
    block = pool.allocate(4 * MIB)  # second chunk: its id is in the high bits
    assert block.offset >> SEGMENT_SHIFT == 1
    desc = TensorDesc("x", "FP32", (MIB,), block)
    assert TensorDesc.from_wire(msgpack.unpackb(msgpack.packb(desc.to_wire()))) == desc


def test_a_stub_opens_each_chunk_once_and_closes_retired_ones() -> None:
    announced: list[CudaChunkAnnounce] = []
    pool, ledger = make_pool(64 * MIB, 8 * MIB, on_new_chunk=announced.append)
    a, b = pool.allocate(100), pool.allocate(200)
    opened: list[bytes] = []
    closed: list[int] = []

    def opener(device: int, handle: bytes) -> int:
        opened.append(handle)
        return int.from_bytes(handle[:8], "little") + (1 << 48)  # another process's address

    peer = CudaPoolMap(opener, lambda device, pointer: closed.append(pointer))
    for announce in announced:
        peer.add(announce)
    assert peer.pointer(a) - pool.pointer(a) == 1 << 48
    assert peer.pointer(b) - peer.pointer(a) == pool.pointer(b) - pool.pointer(a)
    assert len(opened) == 1, "the handle is opened lazily, once"
    peer.retire(1, 0)
    assert closed == [next(iter(ledger.live)) + (1 << 48)]
    with pytest.raises(KeyError, match="chunk 0 of device 1 is unknown"):
        peer.pointer(a)


def test_a_block_beyond_its_chunk_is_refused() -> None:
    peer = CudaPoolMap(lambda device, handle: 0, lambda device, pointer: None)
    peer.add(CudaChunkAnnounce(0, 0, 1024, bytes(64)))
    with pytest.raises(ValueError, match="does not fit in its chunk of 1024 bytes"):
        peer.pointer(CudaLocation(0, 512, 1024))


def test_no_cuda_here_means_zero_devices() -> None:
    # CI and this machine have no GPU; cupy may or may not be installed.
    assert cuda_device_count() >= 0


@pytest.mark.timeout(60)
def test_the_cpu_path_never_imports_cupy_or_torch() -> None:
    code = (
        "import sys; import shoal.stub.runtime, shoal.stub.pb_utils, shoal.supervisor.service, "
        "shoal.ipc.cuda, shoal.supervisor.memory.cuda_shm, shoal.frontends.http.app, "
        "shoal.frontends.grpc.aio; "
        "print(sorted(m for m in ('cupy', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_peer_knows_which_chunks_were_announced() -> None:
    peer = CudaPoolMap(lambda device, handle: 1 << 40, lambda device, pointer: None)
    block = CudaLocation(0, (3 << SEGMENT_SHIFT) | 512, 256)
    assert not peer.has(block)
    peer.add(CudaChunkAnnounce(0, 3, 4096, bytes(64)))
    assert peer.has(block) and not peer.has(CudaLocation(1, block.offset, 256))
    peer.retire(0, 3)
    assert not peer.has(block)


def test_a_peer_opens_handles_on_its_own_number_for_the_device() -> None:
    opened: list[int] = []
    closed: list[int] = []

    def opener(device: int, handle: bytes) -> int:
        opened.append(device)
        return 1 << 40

    peer = CudaPoolMap(opener, lambda device, pointer: closed.append(device))
    peer.local_device = lambda device: 0 if device == 5 else device  # a narrowed stub
    peer.add(CudaChunkAnnounce(5, 0, 4096, bytes(64)))
    peer.pointer(CudaLocation(5, 0, 256))
    peer.close()
    assert opened == [0] and closed == [0]


def test_socket_payloads_are_segments_or_cuda_chunks() -> None:
    from shoal.ipc import messages as msg

    segment = msg.SegmentAnnounce(4, 2, 1 << 20)
    assert msg.decode_socket(segment.encode()) == segment
    chunk = CudaChunkAnnounce(1, 9, 256 * MIB, bytes(range(64)))
    assert msg.decode_socket(msgpack.packb(chunk.to_wire())) == chunk
    retired = msg.CudaChunkRetired(1, 9)
    assert msg.decode(msg.encode(retired)) == retired
