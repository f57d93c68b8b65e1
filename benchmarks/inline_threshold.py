"""The core's cost of one input by size: in an arena block, or inline in the Execute.

    .venv/bin/python -m benchmarks.inline_threshold [--count 20000] [--rounds 5]

For each size, the best of ``--rounds`` loops of ``--count``: the block way allocates a block in
an input arena, copies the bytes into its view, encodes and decodes an Execute holding its
descriptor and frees it; the inline way copies the bytes into an ``InlineBytes`` and encodes and
decodes the Execute carrying them. Both decode as the stub would (the stub's own view or copy of
the input is not counted), so what differs is the block's bookkeeping against the bytes crossing
the message twice. What picks ``INLINE_TENSOR_MAX`` (``shoal/ipc/tensor.py``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import shoal._compiled
from shoal.ipc import messages as msg
from shoal.ipc.arena import OwnedArena
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import InlineBytes, Location, TensorDesc

SIZES = (64, 1 << 10, 4 << 10, 16 << 10, 64 << 10)


def _round_trip(location: Location, nbytes: int) -> None:
    desc = TensorDesc("INPUT0", "FP32", (nbytes // 4,), location)
    msg.decode(msg.encode(msg.Execute(1, [RequestRecord("", 0, 0, {}, [], [desc])])))


def _ways(arena: OwnedArena, data: memoryview) -> dict[str, Callable[[], None]]:
    nbytes = data.nbytes

    def block() -> None:
        placed = arena.allocate(nbytes)
        arena.view(placed)[:] = data
        _round_trip(placed, nbytes)
        arena.free(placed)

    def inline() -> None:
        _round_trip(InlineBytes(bytes(data)), nbytes)

    return {"block": block, "inline": inline}


def _best(way: Callable[[], None], count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter_ns()
        for _ in range(count):
            way()
        best = min(best, (time.perf_counter_ns() - started) / count / 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"hot path {shoal._compiled.state}, µs per input (best of {args.rounds})")
    with OwnedArena(0, initial_bytes=1 << 24, growth_bytes=1 << 24, limit_bytes=1 << 26) as arena:
        for nbytes in SIZES:
            data = memoryview(bytes(i & 0xFF for i in range(nbytes)))
            ways = _ways(arena, data)
            figures = {name: _best(way, args.count, args.rounds) for name, way in ways.items()}
            print(f"{nbytes:>7} B: block {figures['block']:6.2f}   inline {figures['inline']:6.2f}")


if __name__ == "__main__":
    main()
