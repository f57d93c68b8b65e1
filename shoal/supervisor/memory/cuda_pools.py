"""The supervisor's CUDA pools: one per device, made on first use, and who holds each block.

A stub with a GPU tensor to hand on (a response output, a BLS input) asks for a block
(``CUDA_ALLOCATE``), copies its tensor into it device-to-device once, and sends the descriptor.
From the allocation until the supervisor sees that descriptor in a response, the block is
**lent** to the stub: if the stub dies, it comes back here. A response's blocks are then
**adopted** by its completion, which frees them when the frontend, the ensemble or the BLS
caller is done with them; a BLS call's input blocks stay lent until the caller frees them
(``CUDA_FREE``) once the call's response is dropped.

Everything CUDA goes through ``shoal.ipc.cuda``; a server that never sees a GPU tensor never
makes a pool (nor a CUDA context).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from shoal.core.errors import InvalidArgument
from shoal.ipc._alloc import split_key
from shoal.ipc.cuda import (
    BLOCK_ALIGN,
    CudaChunkAnnounce,
    CudaPool,
    DeviceMemory,
    cuda_device_count,
    device_to_host,
)
from shoal.ipc.tensor import CudaLocation

log = logging.getLogger("shoal")

#: A device's pool limit when ``--cuda-memory-pool-byte-size`` names none for it. Chunks are
#: allocated as blocks are needed, so the limit costs nothing until tensors use it.
DEFAULT_LIMIT_BYTES = 4 << 30


class CudaPools:
    """Per-device pools and the ledger of blocks lent to stubs (by pid)."""

    def __init__(
        self,
        limits: Mapping[int, int] | None = None,
        *,
        memory: DeviceMemory | None = None,
        device_count: Callable[[], int] = cuda_device_count,
        chunk_bytes: int | None = None,
    ) -> None:
        self._limits = dict(limits or {})
        self._memory = memory
        self._device_count = device_count
        self._chunk_bytes = chunk_bytes
        self._pools: dict[int, CudaPool] = {}
        self._lent: dict[int, set[CudaLocation]] = {}
        #: Blocks lent now: the hot path reads it to skip looking for pool blocks in responses.
        self.lent_count = 0
        #: Blocks handed out so far, by device (a metric: each is one device-to-device copy).
        self.allocations: dict[int, int] = {}
        #: Called with (device, chunk) for each chunk given back, so that stubs close it.
        self.on_retired_chunk: Callable[[int, int], None] | None = None

    @property
    def lending(self) -> bool:
        """Whether any block is lent to a stub now (responses then may carry pool blocks)."""
        return self.lent_count > 0

    def limit(self, device: int) -> int:
        return self._limits.get(device, DEFAULT_LIMIT_BYTES)

    def disabled(self, device: int) -> bool:
        """A limit below one block (``--cuda-memory-pool-byte-size <device>:0``) turns the
        device's pool off: its GPU tensors go through host memory instead."""
        return self.limit(device) < BLOCK_ALIGN

    def allocate(self, pid: int, device: int, nbytes: int) -> CudaLocation:
        """A block of ``nbytes`` (> 0) on ``device``, lent to stub ``pid``; CudaPoolExhausted
        when the device's limit does not allow it."""
        if nbytes <= 0:
            raise InvalidArgument(f"a CUDA pool block needs a positive size, not {nbytes}")
        location = self._pool(device).allocate(nbytes)
        self._lend(pid, location)
        return location

    def _lend(self, pid: int, location: CudaLocation) -> None:
        self._lent.setdefault(pid, set()).add(location)
        self.lent_count += 1
        self.allocations[location.device] = self.allocations.get(location.device, 0) + 1

    def adopt(self, pid: int, locations: Iterable[CudaLocation]) -> list[CudaLocation]:
        """Blocks of ``pid`` that a response now carries: the caller owns them from here on.
        Only blocks lent to ``pid`` are taken (a descriptor seen twice is owned once)."""
        lent = self._lent.get(pid)
        if not lent:
            return []
        taken = []
        for location in locations:
            if location in lent:
                lent.discard(location)
                taken.append(location)
        self.lent_count -= len(taken)
        return taken

    def give_back(self, pid: int, locations: Iterable[CudaLocation]) -> None:
        """Stub ``pid`` is done with blocks lent to it (``CUDA_FREE``)."""
        lent = self._lent.get(pid, set())
        for location in locations:
            if location in lent:
                lent.discard(location)
                self.lent_count -= 1
                self._pools[location.device].free(location)

    def free(self, locations: Iterable[CudaLocation]) -> None:
        """Blocks a completion owned: back to their pools (none once the pools are closed, at
        shutdown, when a late release may still come)."""
        for location in locations:
            pool = self._pools.get(location.device)
            if pool is not None:
                pool.free(location)

    def forget_process(self, pid: int) -> None:
        """Stub ``pid`` exited: what it was lent and never handed on comes back."""
        for location in self._lent.pop(pid, set()):
            self.lent_count -= 1
            self._pools[location.device].free(location)

    def announcement(self, location: CudaLocation) -> CudaChunkAnnounce:
        """The announcement of the chunk ``location`` lies in, for a stub new to it."""
        pool = self._pools.get(location.device)
        if pool is None:
            raise InvalidArgument(f"no CUDA pool on device {location.device}")
        return pool.announcement(split_key(location.offset)[0])

    def to_host(self, location: CudaLocation) -> memoryview:
        """A host copy of a block (for a client that receives the tensor)."""
        host = device_to_host(self.pointer(location), location.nbytes)
        return memoryview(host.data).toreadonly()

    def pointer(self, location: CudaLocation) -> int:
        return self._pools[location.device].pointer(location)

    def lent_bytes(self) -> int:
        return sum(location.nbytes for lent in self._lent.values() for location in lent)

    def devices(self) -> dict[int, CudaPool]:
        """The pools made so far, by device."""
        return dict(self._pools)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._lent.clear()
        self.lent_count = 0

    def _pool(self, device: int) -> CudaPool:
        pool = self._pools.get(device)
        if pool is not None:
            return pool
        count = self._device_count()
        if not 0 <= device < count:
            raise InvalidArgument(
                f"a GPU tensor on CUDA device {device}, but the server sees {count} CUDA device(s)"
            )
        extra = {} if self._chunk_bytes is None else {"chunk_bytes": self._chunk_bytes}
        pool = CudaPool(
            device,
            self.limit(device),
            memory=self._memory,
            on_retired_chunk=self._retired,
            **extra,  # type: ignore[arg-type]
        )
        self._pools[device] = pool
        log.info("CUDA pool of device %d: up to %d bytes", device, pool.limit_bytes)
        return pool

    def _retired(self, device: int, chunk: int) -> None:
        if self.on_retired_chunk is not None:
            self.on_retired_chunk(device, chunk)
