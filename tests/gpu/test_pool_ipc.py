"""The CUDA pool across processes: a block the supervisor allocated is the same device memory
in two other processes (what two stubs see), and DLPack consumers see it without a copy."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import pytest

from shoal.ipc.cuda import CudaChunkAnnounce, CudaPool, cupy_module, device_array
from shoal.ipc.tensor import CudaLocation

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


def _peer(announce: CudaChunkAnnounce, block: CudaLocation, fill: int) -> int:
    """Run tests/gpu/pool_peer.py: it opens the chunk's handle, maybe writes, sums the block."""
    wire = [announce.to_wire(), [block.device, block.offset, block.nbytes], fill]
    result = subprocess.run(
        [sys.executable, "-m", "tests.gpu.pool_peer"],
        input=msgpack.packb(wire),
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return int(result.stdout)


def test_two_processes_see_one_pool_block() -> None:
    announced: list[CudaChunkAnnounce] = []
    pool = CudaPool(0, 256 * MIB, chunk_bytes=64 * MIB, on_new_chunk=announced.append)
    cupy = cupy_module()
    try:
        pool.allocate(4096)  # so that the block under test does not start its chunk
        block = pool.allocate(MIB)
        mine = device_array(0, pool.pointer(block), block.nbytes, cupy.uint8, (block.nbytes,))
        mine.fill(0)
        cupy.cuda.runtime.deviceSynchronize()
        [announce] = announced
        assert _peer(announce, block, 3) == 3 * (MIB // 2)  # the first process writes
        assert _peer(announce, block, -1) == 3 * (MIB // 2)  # the second reads what it wrote
        assert int(mine.sum(dtype=cupy.uint64)) == 3 * (MIB // 2)  # as does the owner
        del mine
    finally:
        pool.close()


def test_pool_blocks_reach_torch_through_dlpack_without_a_copy() -> None:
    torch = pytest.importorskip("torch")
    cupy = cupy_module()
    pool = CudaPool(0, 64 * MIB, chunk_bytes=64 * MIB)
    try:
        block = pool.allocate(1024 * 4)
        array = device_array(0, pool.pointer(block), block.nbytes, cupy.float32, (1024,))
        tensor = torch.from_dlpack(array)
        assert tensor.data_ptr() == pool.pointer(block)
        tensor.fill_(2.0)
        torch.cuda.synchronize()
        assert float(array.sum()) == 2048.0
        del tensor, array
    finally:
        pool.close()
