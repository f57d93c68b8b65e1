"""A streaming inference call through the core (``RemoteCore.infer_stream``), as an async
generator: mypyc cannot compile those, and the rest of the worker's client is compiled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from shoal.core.backlog import stall_message, stalled
from shoal.core.errors import ResourceExhausted
from shoal.core.types import InferRequest, InferResponse
from shoal.frontends.workers import _plain as plain
from shoal.frontends.workers import _wire as wire

#: What a stream's queue holds: an answer (header fields, payload views), the error that ends
#: the stream, or None (its end).
StreamItem = tuple[list[Any], list[memoryview]] | BaseException | None


#: Makes the response of an answer (``RemoteCore.response``).
Responses = Callable[[list[Any], list[memoryview]], InferResponse]


def drop(queue: asyncio.Queue[StreamItem] | None, response: Responses) -> None:
    """Let go of the answers waiting in a stream's queue that nobody will read: the core
    holds a lent output's blocks until its response is released."""
    while queue is not None and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, tuple):
            response(*item).release()


def overflow(
    core: StreamingCore, call_id: int, queue: asyncio.Queue[StreamItem], cause: str
) -> None:
    """The stream's reader stopped taking answers: the call is cancelled in the core, what
    waits is let go and the stream ends with RESOURCE_EXHAUSTED."""
    core.close_stream(call_id, False)
    queue.put_nowait(ResourceExhausted(stall_message("stream", cause)))


def stream_answer(
    core: StreamingCore,
    call_id: int,
    queue: asyncio.Queue[StreamItem] | None,
    kind: int,
    fields: list[Any],
    payloads: list[memoryview],
) -> None:
    """One answer from the core for stream call ``call_id``: queued for its reader; or let go,
    its lent output blocks given back, when the call was closed meanwhile (``queue`` None) or
    its reader stopped taking answers (then the stream ends: :func:`overflow`)."""
    if kind == wire.ITEM:
        cause = None if queue is None else stalled(queue)
        if queue is not None and cause is None:
            queue.put_nowait((fields, payloads))
            return
        core.response(fields, payloads).release()
        if queue is not None and cause is not None:
            overflow(core, call_id, queue, cause)
    elif queue is not None:
        queue.put_nowait(plain.error_from_wire(fields[0]) if kind == wire.ERROR else None)


class StreamingCore(Protocol):
    """What a stream needs of ``RemoteCore``."""

    def open_stream(self, request: InferRequest) -> tuple[int, asyncio.Queue[StreamItem]]: ...

    def response(self, answer: list[Any], views: list[memoryview]) -> InferResponse: ...

    def close_stream(self, call_id: int, ended: bool) -> None: ...


async def remote_stream(core: StreamingCore, request: InferRequest) -> AsyncIterator[InferResponse]:
    """The responses of one streaming call, as the core sends them."""
    call_id, queue = core.open_stream(request)
    ended = False
    try:
        while True:
            item = await queue.get()
            if item is None:
                ended = True
                return
            if isinstance(item, BaseException):
                ended = True
                raise item
            answer, views = item
            yield core.response(answer, views)
    finally:
        core.close_stream(call_id, ended)
