"""The :data:`~.base.StageTensor` the server gives schedulers: a copy into the input arena."""

from __future__ import annotations

import numpy as np

from shoal.core.errors import ResourceExhausted
from shoal.ipc.arena import ArenaExhausted, Block, OwnedArena
from shoal.ipc.tensor import TensorDesc, numpy_to_buffer_size, write_numpy
from shoal.supervisor.schedulers.base import StageTensor


def arena_stager(arena: OwnedArena) -> StageTensor:
    """Stages scheduler-made tensors in ``arena``; the caller owns (frees) each block."""

    def stage(
        name: str, datatype: str, shape: tuple[int, ...], data: np.ndarray | bytes
    ) -> tuple[TensorDesc, Block]:
        size = len(data) if isinstance(data, bytes) else numpy_to_buffer_size(data, datatype)
        try:
            block = arena.allocate(size)
        except ArenaExhausted as error:
            raise ResourceExhausted(
                f"cannot stage the input '{name}' the scheduler adds: {error}"
            ) from None
        if isinstance(data, bytes):
            arena.view(block)[:] = data
        else:
            write_numpy(data, datatype, arena.view(block))
        return TensorDesc(name, datatype, shape, block), block

    return stage
