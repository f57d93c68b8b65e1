"""What the HTTP fast path (:mod:`.fast_path`) serves: an inference request without ASGI."""

from __future__ import annotations

import logging
import mmap
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from shoal.frontends._stepping import SteppedWork
from shoal.frontends.http._body_reader import BodyBuffer
from shoal.frontends.http._response import Body
from shoal.frontends.http.routing import InferRoutes

_logger = logging.getLogger("shoal.frontends.http")


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


class KnownHead:
    """A fast request's head as it came (its target and header lines, the endpoint it was read
    for) and what was read from it: the model's name and version, the headers the endpoint
    reads, the Content-Length. Shared by the requests of that head: none of them writes it."""

    __slots__ = ("endpoint", "headers", "length", "lines", "name", "url", "version")

    def __init__(
        self,
        url: bytes,
        lines: list[tuple[bytes, bytes]],
        endpoint: FastInfer,
        target: tuple[str, str],
        headers: dict[str, str],
        length: int,
    ) -> None:
        self.url = url
        self.lines = lines  # the head's own list: the protocol starts a new one per request
        self.endpoint = endpoint
        self.name = target[0]
        self.version = target[1]
        self.headers = headers
        self.length = length

    def matches(self, url: bytes, lines: list[tuple[bytes, bytes]], endpoint: FastInfer) -> bool:
        """Whether a head of ``url`` and ``lines``, for ``endpoint``, is this one."""
        return endpoint is self.endpoint and url == self.url and lines == self.lines


class Stepped(SteppedWork):
    """A fast request's coroutine stepped by hand, in place of an :class:`asyncio.Task` (see
    :class:`~shoal.frontends._stepping.SteppedWork`).

    Its first step runs at once, where the request's body ends (for a direct request: decoded,
    checked, sent to a stub, up to the await of its Result). What a task gives that it keeps:
    it stands in uvicorn's set of tasks until done (the graceful shutdown waits for the set,
    then cancels what is left); :meth:`cancel` is a task's; an exception that ends it is
    logged. The fast path's coroutine ends by awaiting :data:`LAST_STEP`: never inside
    ``try``/``finally``, ``with`` or ``async with`` (compiled, a dropped coroutine never runs
    their cleanup).
    """

    def __init__(self, coro: Coroutine[Any, Any, None], tasks: set[Any]) -> None:
        self._tasks = tasks
        tasks.add(self)
        self._begin(coro)

    def cancel(self, msg: Any = None) -> bool:
        """As :meth:`asyncio.Task.cancel` (uvicorn's shutdown calls it)."""
        self._cancel_work(msg)
        return True

    def _work_over(self, error: BaseException | None) -> None:
        self._tasks.discard(self)
        if isinstance(error, Exception):
            _logger.error("unexpected error while serving an inference request", exc_info=error)
