"""How the supervisor drives one stub, whatever runs it: the :class:`StubChannel` Protocol.

Two kinds implement it: :class:`~shoal.supervisor.instances.process.StubProcess`, a
``python -m shoal.stub`` process over shared-memory rings (what ``shoal serve`` runs), and
:class:`~shoal.supervisor.instances.loopback.LoopbackStub`, an in-process stand-in that answers
with a Python function, so instances, the repository manager and the service are tested without
starting a process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from shoal.ipc import messages as msg
from shoal.ipc.arena import Block, Segment
from shoal.ipc.cuda import CudaChunkAnnounce
from shoal.ipc.tensor import CudaLocation, Location


class Tensors(Protocol):
    """Where the segments and CUDA pool chunks behind descriptors are (the directory)."""

    def fd(self, arena_id: int, index: int) -> tuple[int, int]: ...

    def cuda_chunk(self, location: CudaLocation) -> CudaChunkAnnounce: ...


class StubChannel(Protocol):
    """One stub: messages down and up, its output arena, the memory it was given, its exit."""

    output_arena_id: int
    #: None while it runs; its exit status once it has exited (negative: the signal).
    returncode: int | None
    #: Set to the exit status when it exits.
    exited: asyncio.Future[int]
    #: Segments of other arenas it has been given, and CUDA pool chunks it has opened.
    announced: set[tuple[int, int]]
    cuda_chunks: set[tuple[int, int]]

    @property
    def pid(self) -> int: ...

    @property
    def spawned(self) -> bool:
        """It was started (starting can fail: no descriptor or memory left)."""
        ...

    def spawn(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None]) -> None:
        """Start it; ``on_exit(returncode)`` runs on the loop when it exits."""
        ...

    def watch_up(self, loop: asyncio.AbstractEventLoop, ready: Callable[[], object]) -> None:
        """Call ``ready`` on the loop whenever messages may be waiting (then read them all, or
        return False after reading some: it is called again on the loop's next turn)."""
        ...

    def recv_up_nowait(self) -> bytes | None:
        """The next message from the stub (encoded), or None when there is none now."""
        ...

    def send(self, message: msg.Message, ring: bool = True) -> bool:
        """Queue a message for the stub; False if its queue is full (then ``send_async``).

        ``ring=False``: do not wake a sleeping stub for it (then ``wake`` later)."""
        ...

    def wake(self) -> None:
        """Wake the stub if it sleeps on messages sent with ``ring=False``."""
        ...

    async def send_async(self, message: msg.Message) -> None: ...

    def announce(self, segment: Segment) -> None:
        """Give it one input-arena segment (before any message refers to it)."""
        ...

    def forward(self, locations: Sequence[Location], tensors: Tensors) -> None:
        """Give it whatever segments and chunks these tensors lie in that it does not have."""
        ...

    def output_view(self, block: Block) -> memoryview:
        """A read-only view of a block of its output arena."""
        ...

    def mapped_segment(self, arena_id: int, index: int) -> Segment: ...

    def segment_fd(self, arena_id: int, index: int) -> tuple[int, int]: ...

    def drop_output_segment(self, index: int) -> None: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Release what it holds; it must have exited."""
        ...
