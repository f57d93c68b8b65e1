"""What the HTTP fast path (:mod:`.fast_path`) serves: an inference request without ASGI."""

from __future__ import annotations

import asyncio
import logging
import mmap
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, Protocol

from shoal.frontends._last_step import LAST_STEP
from shoal.frontends.http._body_reader import BodyBuffer
from shoal.frontends.http._response import Body
from shoal.frontends.http.routing import InferRoutes

_logger = logging.getLogger("shoal.frontends.http")


class FastInfer(Protocol):
    """What the protocol needs of the inference endpoint to serve it without ASGI."""

    limit: int
    routes: InferRoutes
    #: Hands the frontend's timestamps of a traced request to the core.
    frontend_trace: Callable[[int, list[tuple[str, int]]], None]

    async def respond(
        self,
        name: str,
        version: str,
        headers: dict[str, str],
        body: bytes | bytearray | memoryview,
        lend: bool = False,
        forwarded: list[tuple[str, bytes]] | None = None,
        front: FastRequest | None = None,
    ) -> tuple[int, Sequence[tuple[str, str]], Body]:
        """Status, headers and body of the answer to an inference request; with ``lend``, a
        large binary body may be a :class:`LentBody`. ``front.trace_id``: its trace's id, once
        answered, where the core traces it and awaits the frontend's timestamps."""


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
        "recv_end",
        "recv_start",
        "response_complete",
        "trace_id",
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
        self.headers = headers  # those the endpoint reads (_READ_HEADERS)
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
        #: When its head's first byte and its body's last came (loop.time(): CLOCK_MONOTONIC
        #: seconds, already read for the connection's limits), and its trace's id (0: none):
        #: the frontend's timestamps of a traced request (HTTP_RECV_START...).
        self.recv_start = 0.0
        self.recv_end = 0.0
        self.trace_id = 0


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


class Stepped:
    """A fast request's coroutine stepped by hand, in place of an :class:`asyncio.Task`.

    Its first step runs at once, where the request's body ends (for a direct request: decoded,
    checked, sent to a stub, up to the await of its Result); each later step runs from the
    done callback of the future it awaits, as a task's would. No Task is made, named,
    registered or scheduled per request, and no handle waits for the loop's next turn to
    start it. What a task gives that it keeps: it stands in uvicorn's set of tasks until done
    (the graceful shutdown waits for the set, then cancels what is left); :meth:`cancel`
    cancels the future awaited, so the coroutine sees CancelledError there, as in a task; a
    bare ``yield`` (``asyncio.sleep(0)``) steps again on the loop's next turn; an exception
    that ends it is logged. What it does not: it is not ``asyncio.current_task()`` (nothing
    on the fast path asks) and its steps run in the loop's context, not a copy.

    A coroutine may end by awaiting :data:`LAST_STEP` (the fast path's does): stepped, that
    await hands this object the marker and the coroutine is never resumed (dropped), so its end
    raises no StopIteration. Compiled, catching that costs a request ~4,000 instructions: the
    traceback entry the call gets on the way out, the exception state saved and restored. One
    that returns ends as before. Never await it inside ``try``/``finally``, ``with`` or ``async
    with``: interpreted, dropping the coroutine runs the cleanup at its finalizer; compiled
    (mypyc), it never runs.
    """

    def __init__(self, coro: Coroutine[Any, Any, None], tasks: set[Any]) -> None:
        self._coro = coro
        self._tasks = tasks
        self._waiter: asyncio.Future[Any] | None = None
        self._must_cancel = False
        tasks.add(self)
        self._step()

    def cancel(self, msg: Any = None) -> bool:
        """As :meth:`asyncio.Task.cancel`: the future awaited is cancelled, or the next step
        throws CancelledError."""
        waiter = self._waiter
        if waiter is not None and waiter.cancel(msg):
            return True
        self._must_cancel = True
        return True

    def _woken(self, future: asyncio.Future[Any]) -> None:
        self._waiter = None
        self._step()

    def _step(self, error: BaseException | None = None) -> None:
        coro = self._coro
        try:
            if error is not None:
                awaited = coro.throw(error)
            elif self._must_cancel:
                self._must_cancel = False
                awaited = coro.throw(asyncio.CancelledError())
            else:
                awaited = coro.send(None)
        except (StopIteration, asyncio.CancelledError):
            self._tasks.discard(self)
            return
        except BaseException as exc:
            self._tasks.discard(self)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: as a task, to the loop
            _logger.exception("unexpected error while serving an inference request")
            return
        if awaited is LAST_STEP:  # done: the coroutine is dropped, never resumed
            self._tasks.discard(self)
        elif awaited is None:  # a bare yield: again on the loop's next turn
            asyncio.get_running_loop().call_soon(self._step)
        elif getattr(awaited, "_asyncio_future_blocking", False):
            awaited._asyncio_future_blocking = False
            self._waiter = awaited
            # A bound method made per await, not kept: kept, it would make this object a
            # reference cycle, garbage that only the collector frees.
            awaited.add_done_callback(self._woken)
            if self._must_cancel and awaited.cancel():
                self._must_cancel = False
        else:  # as a task would, it hears that it yielded what it may not
            error = RuntimeError(f"a fast request yielded {awaited!r}, not a future")
            asyncio.get_running_loop().call_soon(self._step, error)


def read_head(
    endpoint: FastInfer, url: bytes, lines: list[tuple[bytes, bytes]]
) -> KnownHead | None:
    """What a fast request reads from its head: None where it is not an inference request the
    fast path serves (another target; no Content-Length, a malformed or too large one; a
    Transfer-Encoding), which the ASGI way answers."""
    target = endpoint.routes.match_target(url)
    if target is None:
        return None
    headers: dict[str, str] = {}
    for name, value in lines:  # only what the endpoint reads (the last, if repeated)
        key = _READ_HEADERS.get(name)
        if key is not None:
            headers[key] = value.decode("latin-1")
    text = headers.get("content-length")
    length = int(text) if text is not None and text.isdigit() else -1
    if not 0 <= length <= endpoint.limit:
        return None
    if "transfer-encoding" in headers:
        return None
    return KnownHead(url, lines, endpoint, target, headers, length)


def traced_sent(request: FastRequest, send_start: int) -> None:
    """Hand the frontend's timestamps of a traced request, sent now, to its trace, as Triton's
    ``http_server.cc`` takes them: its head's first byte came, its body's last came, its
    response is being written, and is written (taken by the kernel, or queued)."""
    send_end = time.monotonic_ns()
    recv_end = int(request.recv_end * 1e9)
    # loop.time() may read a coarser clock (uvloop's, cached in ms): never ahead of ns.
    recv_start = int(request.recv_start * 1e9) if request.recv_start else recv_end
    request.endpoint.frontend_trace(
        request.trace_id,
        [
            ("HTTP_RECV_START", min(recv_start, recv_end)),
            ("HTTP_RECV_END", recv_end),
            ("HTTP_SEND_START", send_start),
            ("HTTP_SEND_END", send_end),
        ],
    )


#: The request headers a fast request keeps (:meth:`FastInfer.respond` reads no others; the
#: protocol reads the last two: whether to ask the HTTP version), by their lowercase names as
#: the parser gives them.
_READ_HEADERS: Final = {
    name.encode("latin-1"): name
    for name in (
        "content-length",
        "transfer-encoding",
        "content-encoding",
        "accept-encoding",
        "inference-header-content-length",
        "connection",
        "proxy-connection",
    )
}
