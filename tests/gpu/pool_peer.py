"""A second process for tests/gpu/test_pool_ipc.py: opens a pool chunk by its IPC handle.

Reads ``[announce wire, location wire, fill]`` as msgpack on stdin; writes ``fill`` into the
first half of the block, prints the sum of the whole block seen through its own mapping.
"""

from __future__ import annotations

import sys

import msgpack

from shoal.ipc.cuda import CudaChunkAnnounce, CudaPoolMap, cupy_module
from shoal.ipc.tensor import CudaLocation


def main() -> None:
    announce_wire, location_wire, fill = msgpack.unpackb(sys.stdin.buffer.read())
    announce = CudaChunkAnnounce.from_wire(announce_wire)
    location = CudaLocation(*location_wire)
    peer = CudaPoolMap()
    peer.add(announce)
    cupy = cupy_module()
    with cupy.cuda.Device(location.device):
        array = peer.as_array(location, cupy.uint8, (location.nbytes,))
        if fill >= 0:
            array[: location.nbytes // 2] = fill
        cupy.cuda.runtime.deviceSynchronize()
        print(int(array.sum(dtype=cupy.uint64)), flush=True)
        del array
    peer.close()


if __name__ == "__main__":
    main()
