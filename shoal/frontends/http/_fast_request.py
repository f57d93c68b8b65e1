"""What the HTTP fast path (:mod:`.fast_path`) serves: an inference request without ASGI."""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Sequence
from typing import Protocol

from shoal.frontends.http._body_reader import BodyBuffer
from shoal.frontends.http._response import Body
from shoal.frontends.http.routing import InferRoutes


class FastInfer(Protocol):
    """What the protocol needs of the inference endpoint to serve it without ASGI."""

    limit: int
    routes: InferRoutes

    async def respond(
        self,
        name: str,
        version: str,
        headers: dict[str, str],
        body: bytes | bytearray | memoryview,
        lend: bool = False,
    ) -> tuple[int, Sequence[tuple[str, str]], Body]:
        """Status, headers and body of the answer to an inference request; with ``lend``, a
        large binary body may be a :class:`LentBody`."""


class _NoEvent:
    """uvicorn sets its cycle's ``message_event`` on a disconnect; a fast request has none."""

    @staticmethod
    def set() -> None:
        pass


class FastRequest:
    """An inference request served without ASGI, standing where uvicorn keeps its cycle (so its
    pipelining, keep-alive and shutdown logic see a request in progress)."""

    __slots__ = (
        "body",
        "buffer",
        "disconnected",
        "endpoint",
        "headers",
        "keep_alive",
        "length",
        "map",
        "name",
        "response_complete",
        "task",
        "version",
    )
    message_event = _NoEvent()

    def __init__(
        self,
        endpoint: FastInfer,
        name: str,
        version: str,
        headers: dict[str, str],
        keep_alive: bool,
        length: int,
    ):
        self.endpoint = endpoint  # looked up once, for the request's head
        self.name = name
        self.version = version
        self.headers = headers  # those the endpoint reads (fast_path._READ_HEADERS)
        self.keep_alive = keep_alive
        self.length = length  # Content-Length
        #: A body of several chunks is gathered as they come: joined at the end, a large one
        #: would be one copy of it all on the event loop.
        self.body: bytes | bytearray | memoryview = b""
        #: Where a large body goes (:mod:`._body_reader`) once it came in more than one piece.
        self.buffer: BodyBuffer | None = None
        self.map: mmap.mmap | None = None  # the buffer's, given back once answered
        self.disconnected = False
        self.response_complete = False
        #: The task serving it (in uvicorn's set of tasks until done).
        self.task: asyncio.Task[None] | None = None
