"""System shared memory for a run's tensors: one region, registered with the server.

Layout: the inputs first (shared by every worker, read only), then one output slot per worker, so
concurrent responses never write over each other. The region is a file under ``/dev/shm`` that
this process creates, registers, and on exit unregisters and unlinks.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from shoal.perf.requests import ShmRef
from shoal.perf.tensors import TensorSpec

_ALIGN = 64


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class ShmLayout:
    """Offsets of every tensor in the region; ``byte_size`` is the region's whole size."""

    region: str
    inputs: dict[str, ShmRef]
    outputs: tuple[dict[str, ShmRef], ...] = field(default=())

    @property
    def byte_size(self) -> int:
        refs = [*self.inputs.values(), *(r for slot in self.outputs for r in slot.values())]
        return max((_aligned(r.offset + r.byte_size) for r in refs), default=_ALIGN)


def plan_layout(
    region: str,
    inputs: Sequence[TensorSpec],
    output_sizes: Sequence[tuple[str, int]],
    workers: int,
) -> ShmLayout:
    """Place ``inputs`` once and ``output_sizes`` (name, bytes) once per worker."""
    placed_inputs, offset = _place(region, [(t.name, t.nbytes) for t in inputs], 0)
    slots = []
    for _ in range(workers if output_sizes else 0):
        slot, offset = _place(region, output_sizes, offset)
        slots.append(slot)
    return ShmLayout(region, placed_inputs, tuple(slots))


def _place(
    region: str, sizes: Sequence[tuple[str, int]], offset: int
) -> tuple[dict[str, ShmRef], int]:
    """Each (name, bytes) placed in turn from ``offset``; the offset after the last."""
    placed = {}
    for name, size in sizes:
        placed[name] = ShmRef(region, offset, size)
        offset += _aligned(size)
    return placed, offset


class ShmRegion:
    """A ``/dev/shm`` file mapped in this process; ``key`` is what the server opens."""

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.key = f"/{name}"
        self._path = f"/dev/shm/{name}"
        fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self._map = mmap.mmap(fd, byte_size)
        except BaseException:
            os.unlink(self._path)
            raise
        finally:
            os.close(fd)

    def write(self, offset: int, data: bytes) -> None:
        self._map[offset : offset + len(data)] = data

    def close(self) -> None:
        self._map.close()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
