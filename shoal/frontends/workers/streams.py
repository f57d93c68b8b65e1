"""A streaming inference call through the core (``RemoteCore.infer_stream``), as an async
generator: mypyc cannot compile those, and the rest of the worker's client is compiled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from shoal.core.types import InferRequest, InferResponse

#: What a stream's queue holds: an answer (header fields, payload views), the error that ends
#: the stream, or None (its end).
StreamItem = tuple[list[Any], list[memoryview]] | BaseException | None


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
