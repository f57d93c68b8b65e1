"""The open requests of a decoupled model inside one stub: responses arrive one by one.

A request's input blocks may back any of its responses (an input returned unchanged), so they
are freed only once the final response has arrived and every response has been released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from shoal.core.backlog import StreamQueue, stall_message, stalled
from shoal.core.errors import ResourceExhausted, ShoalError
from shoal.ipc import messages as msg
from shoal.ipc.arena import Block
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.work import Completion, Work


@dataclass(eq=False)
class OpenStream:
    work: Work
    free_inputs: Callable[[list[Block]], None]
    unreleased: int = 0
    final: bool = False
    #: Responses so far, and when the last one (or the dispatch) happened: response statistics.
    responses: int = 0
    last_ns: int = 0

    def _finished(self) -> None:
        self.final = True
        on_final, self.work.on_final = self.work.on_final, None
        if on_final is not None:
            on_final()

    def _maybe_free(self) -> None:
        if self.final and self.unreleased == 0 and self.work.input_blocks:
            blocks, self.work.input_blocks = self.work.input_blocks, []
            self.free_inputs(blocks)

    def released(self) -> None:
        self.unreleased -= 1
        self._maybe_free()

    def push(self, completion: Completion | None, final: bool) -> None:
        """Hand one response (``None``: only the final flag) to the requester."""
        queue = self.work.stream
        assert queue is not None
        if completion is not None:
            self.unreleased += 1
            completion.on_release = self.released
            completion.final = final
            if self.work.closed:
                completion.release()
            elif (cause := stalled(queue)) is not None:  # a client that stopped reading
                completion.release()
                self._overflowed(queue, cause)
            else:
                queue.put_nowait(completion)
        if final:
            self._finished()
            queue.put_nowait(None)
            self._maybe_free()

    def _overflowed(
        self, queue: asyncio.Queue[Completion | BaseException | None], cause: str
    ) -> None:
        """The requester stopped taking responses: end its stream with an error (it cancels
        the request when it reads it) and let what waits go; later responses are released as
        they come."""
        self.work.closed = True
        self.work.cancel()  # the model hears it now, not when the stalled reader comes back
        while not queue.empty():
            left = queue.get_nowait()
            if isinstance(left, Completion):
                left.release()
        queue.put_nowait(ResourceExhausted(stall_message("request", cause)))
        queue.put_nowait(None)

    def fail(self, error: ShoalError) -> None:
        queue = self.work.stream
        assert queue is not None
        queue.put_nowait(error)
        queue.put_nowait(None)
        self._finished()
        self._maybe_free()


def response_cuda(response: msg.ResponseRecord) -> list[CudaLocation]:
    """The CUDA pool blocks a response's outputs live in."""
    return [o.location for o in response.outputs if type(o.location) is CudaLocation]


def response_blocks(response: msg.ResponseRecord) -> list[Block]:
    """The distinct arena blocks a response's outputs lie in, in order."""
    outputs = response.outputs
    if len(outputs) == 1:  # most responses: no dict (and no hash of a block) for one output
        location = outputs[0].location
        return [location] if isinstance(location, Block) else []
    seen: dict[Block, None] = {}
    for output in response.outputs:
        if isinstance(output.location, Block):
            seen[output.location] = None
    return list(seen)


def new_stream() -> asyncio.Queue[Completion | BaseException | None]:
    return StreamQueue()


class OpenStreams:
    """The open requests of a decoupled model in one instance, by request key: a rescheduled
    request keeps its key, and so its stream, wherever it runs next."""

    def __init__(self, free_inputs: Callable[[list[Block]], None]) -> None:
        self._free_inputs = free_inputs
        self._open: dict[int, OpenStream] = {}

    def open(self, work: Work) -> None:
        if work.record.key not in self._open:
            self._open[work.record.key] = OpenStream(work, self._free_inputs)

    def get(self, key: int) -> OpenStream | None:
        return self._open.get(key)

    def pop(self, key: int) -> OpenStream | None:
        return self._open.pop(key, None)

    def fail_all(self, error: ShoalError) -> None:
        """The stub died: every open request ends with ``error``."""
        for stream in self._open.values():
            stream.fail(error)
        self._open.clear()
