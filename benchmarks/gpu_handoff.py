"""A CUDA pool hand-off between processes against a device-to-device copy of the same bytes.

    .venv/bin/python -m benchmarks.gpu_handoff            # 1 MiB, 16 MiB, 256 MiB; 200 rounds
    .venv/bin/python -m benchmarks.gpu_handoff --sizes-mib 256 --rounds 50

The parent owns a ``CudaPool`` on device 0 (as the supervisor does) and hands a block to a second
process (as to a stub) by descriptor: a ``CudaLocation`` in a MessagePack message on a pipe. The
peer opens the chunk's IPC handle the first time (cached after that), wraps the block as a cupy
array without copying, reads one element so the memory is really touched, and answers. A round
is that message and its answer; "hand-off GB/s" is the block's size over the median round time,
the rate at which tensors of that size can move between stubs. The baseline is ``cudaMemcpy``
device-to-device of the same size in one process: what a copy-based hand-off would cost.

Without cupy or a CUDA device it prints why and exits 0 (this project's CI has no GPU).
"""

from __future__ import annotations

import argparse
import statistics
import struct
import subprocess
import sys
import time
from typing import IO

import msgpack

from shoal.ipc.cuda import (
    MEMCPY_DEVICE_TO_DEVICE,
    CudaChunkAnnounce,
    CudaPool,
    CudaPoolMap,
    CudaUnavailable,
    cuda_device_count,
    cupy_module,
    memcpy,
)
from shoal.ipc.tensor import CudaLocation

MIB = 1 << 20


def _send(stream: IO[bytes], obj: object) -> None:
    payload = msgpack.packb(obj)
    stream.write(struct.pack("<I", len(payload)) + payload)
    stream.flush()


def _recv(stream: IO[bytes]) -> object:
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError("the other process closed the pipe")
    return msgpack.unpackb(stream.read(struct.unpack("<I", header)[0]))


def peer() -> None:
    """The receiving process: ``["chunk", wire]`` registers a chunk, ``["block", ...]`` is a
    hand-off (answered with one byte of it), ``["stop"]`` ends."""
    cupy = cupy_module()
    pool_map = CudaPoolMap()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        message = _recv(stdin)
        assert isinstance(message, list)
        if message[0] == "chunk":
            pool_map.add(CudaChunkAnnounce.from_wire(message[1]))
        elif message[0] == "block":
            location = CudaLocation(*message[1])
            array = pool_map.as_array(location, cupy.uint8, (location.nbytes,))
            _send(stdout, int(array[-1]))  # a device read: the memory is really there
        else:
            pool_map.close()
            return


def _handoff_seconds(size: int, rounds: int) -> list[float]:
    cupy = cupy_module()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gpu_handoff", "--peer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    announced: list[CudaChunkAnnounce] = []
    pool = CudaPool(0, 2 * size + 64 * MIB, chunk_bytes=size, on_new_chunk=announced.append)
    try:
        block = pool.allocate(size)
        cupy.cuda.runtime.memset(pool.pointer(block), 7, size)
        cupy.cuda.runtime.deviceSynchronize()
        for announce in announced:
            _send(proc.stdin, ["chunk", announce.to_wire()])
        wire = [block.device, block.offset, block.nbytes]
        _send(proc.stdin, ["block", wire])  # the first hand-off opens the handle: not timed
        assert _recv(proc.stdout) == 7
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            _send(proc.stdin, ["block", wire])
            assert _recv(proc.stdout) == 7
            times.append(time.perf_counter() - started)
        _send(proc.stdin, ["stop"])
        proc.wait(timeout=30)
        return times
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pool.close()


def _memcpy_seconds(size: int, rounds: int) -> list[float]:
    cupy = cupy_module()
    with cupy.cuda.Device(0):
        source = cupy.full(size, 7, dtype=cupy.uint8)
        target = cupy.empty_like(source)
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            memcpy(target.data.ptr, source.data.ptr, size, MEMCPY_DEVICE_TO_DEVICE)
            cupy.cuda.runtime.deviceSynchronize()
            times.append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        peer()
        return 0
    if cuda_device_count() == 0:
        try:
            cupy_module()
            reason = "cupy sees no CUDA device"
        except CudaUnavailable as error:
            reason = str(error)
        print(f"gpu_handoff: skipped: {reason}")
        return 0
    print(f"{'size':>8}  {'hand-off µs':>12}  {'hand-off GB/s':>14}  {'D2D memcpy GB/s':>16}")
    for mib in args.sizes_mib:
        size = mib * MIB
        handoff = statistics.median(_handoff_seconds(size, args.rounds))
        copy = statistics.median(_memcpy_seconds(size, args.rounds))
        print(
            f"{mib:>5} MiB  {handoff * 1e6:>12.1f}  {size / handoff / 1e9:>14.1f}  "
            f"{size / copy / 1e9:>16.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
