"""``c_python_backend_utils``: the name of the native module behind Triton's ``pb_utils``.

Triton builds the Python backend's classes in a C++ module of this name and
``triton_python_backend_utils`` re-exports them; some models import it directly, for example
``c_python_backend_utils.shared_memory.free_memory()``. The stub installs this module under that
name: the classes of shoal's ``pb_utils``, and ``shared_memory`` reporting the stub's output arena.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.stub.pb_utils import *  # noqa: F403  (the same classes, as in Triton)
from shoal.stub.pb_utils import __all__ as _pb_all


class SharedMemory:
    """The shared memory this instance writes its outputs into (Triton: the stub's shm pool)."""

    def __init__(self) -> None:
        self._free_bytes: Callable[[], int] | None = None

    def free_memory(self) -> int:
        """Bytes the instance can still allocate for outputs before its arena is full."""
        return self._free_bytes() if self._free_bytes is not None else 0


shared_memory = SharedMemory()


def _set_free_memory(free_bytes: Callable[[], int] | None) -> None:
    """Runtime hook: where ``shared_memory.free_memory()`` reads the output arena's free bytes."""
    shared_memory._free_bytes = free_bytes


__all__ = [*_pb_all, "SharedMemory", "shared_memory"]
