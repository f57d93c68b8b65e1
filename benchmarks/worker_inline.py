"""Where a frontend worker's input should travel: inline on its link, or through its arena.

    .venv/bin/python -m benchmarks.worker_inline

Times what the *core* spends per input tensor either way (the scarce CPU is the core's):

* inline: reading the tensor's bytes from the worker's Unix socket, then the staging copy into
  the core's input arena (and the block's free); "beyond 64 B" subtracts the same read of a
  64-byte tensor, since a call's header is read anyway and inline bytes ride in that read;
* placed: looking up and viewing the block the worker placed in its own arena, and giving it
  back (the ``FREE`` frame's share).

The worker's side (its copy into its arena, or its socket write) is not counted. One process,
a socketpair, warm arenas; the median of many rounds per size.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time

from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.arenas import LentArena, StagingArena
from shoal.ipc.arena import OwnedArena
from shoal.supervisor.memory.segments import SegmentDirectory

SIZES = (64, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)


def _inline_ns(size: int, rounds: int) -> list[float]:
    sender, receiver = socket.socketpair()
    for sock in (sender, receiver):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    arena = OwnedArena(0, initial_bytes=64 << 20)
    payload = bytes(size)
    buffer = bytearray(size)
    times = []
    for _ in range(rounds):
        writer = threading.Thread(target=sender.sendall, args=(payload,))
        writer.start()
        writer.join()  # the bytes wait in the socket: only the reading side is timed
        view = memoryview(buffer)
        started = time.perf_counter_ns()
        got = 0
        while got < size:
            got += receiver.recv_into(view[got:])
        block = arena.allocate(size)
        arena.view(block)[:] = view
        arena.free(block)
        times.append(time.perf_counter_ns() - started)
    sender.close()
    receiver.close()
    arena.close()
    return times


async def _placed_ns(size: int, rounds: int) -> list[float]:
    worker_sock, core_sock = socket.socketpair()
    staging = StagingArena(
        1 << 32,
        worker_sock,
        initial_bytes=64 << 20,
        growth_bytes=64 << 20,
        limit_bytes=1 << 30,
        on_retired=lambda index: None,
    )
    directory = SegmentDirectory(OwnedArena(0, initial_bytes=0))
    frames: list[bytes] = []
    lent = LentArena(
        1 << 32,
        core_sock,
        directory,
        lambda flat: frames.append(b"".join(wire.frame([wire.FREE, 0, flat]))),
    )
    times = []
    for _ in range(rounds):
        placed = staging.arena.allocate(size)  # the worker's copy is not timed
        started = time.perf_counter_ns()
        block, view = lent.lend(placed.segment, placed.offset, placed.nbytes)
        view.release()
        directory.free_inputs([block])
        lent._flush()  # what the next loop turn does
        times.append(time.perf_counter_ns() - started)
        staging.free([placed.segment, placed.offset, placed.nbytes])
    lent.worker_exited()
    staging.close()
    directory.input_arena.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    # The header of a call is read anyway: inline bytes cost what they add to that read.
    print(f"{'bytes':>9} {'inline µs':>10} {'beyond 64 B':>12} {'placed µs':>10}")
    base = 0.0
    for size in SIZES:
        rounds = max(args.rounds * (64 << 10) // max(size, 64 << 10), 50)
        inline = statistics.median(_inline_ns(size, rounds)) / 1000
        base = base or inline
        placed = statistics.median(asyncio.run(_placed_ns(size, rounds))) / 1000
        print(f"{size:>9} {inline:>10.1f} {inline - base:>12.1f} {placed:>10.1f}")


if __name__ == "__main__":
    main()
