"""Inference requests served straight from uvicorn's httptools protocol, without ASGI.

The protocol writes through :mod:`._coalescing` (a response's writes in one system call), reads
a large body straight into one buffer (:mod:`._body_reader`) and sends a large binary response
from the response's shared memory (a :class:`LentBody`), so that a large tensor's bytes are not
copied in user space on either way.
"""

from __future__ import annotations

import asyncio
import functools
import http
import logging
import time
from collections.abc import Sequence
from typing import Any, Final, cast

import httptools

from shoal.frontends._last_step import LAST_STEP
from shoal.frontends._limits import ConnectionLimits
from shoal.frontends.http import _json
from shoal.frontends.http._body_reader import DIRECT_BODY, POOL, BodyBuffer, BodyReader
from shoal.frontends.http._coalescing import CoalescingHttpToolsProtocol
from shoal.frontends.http._fast_conn import (
    LENIENCIES,
    FastConnection,
    is_framed_twice,
    reset_connection,
)
from shoal.frontends.http._fast_request import (
    FastRequest,
    Stepped,
    read_head,
    traced_sent,
)
from shoal.frontends.http._response import Body, LentBody, body_length

log = logging.getLogger("shoal")

#: The most non-empty chunks a chunked request body may have (Triton's ``kMaxChunkedChunks``).
MAX_CHUNKS: Final = 1 << 16


class FastInferHttpToolsProtocol(CoalescingHttpToolsProtocol):
    """Serves ``POST .../infer`` straight from the HTTP parser's callbacks: no ASGI scope, no
    Starlette, no receive/send round trips (about a fifth of the supervisor's time per small
    request). Only the plain case takes this way: a Content-Length body within the limit, no
    ``Expect: 100-continue``, no percent-encoded path or query string, no request already in
    progress on the connection. Everything else goes through ASGI as before, to the same
    endpoint, so both ways answer alike.
    """

    # uvicorn's own versions of the next four callbacks run for every request; here they are
    # compiled with the rest of this module (docs/perf.md, "Compiled hot path"), and the
    # keep-alive timer is armed once per idle period instead of made and cancelled per request.

    # A connection's limits (docs/hardening.md, "Connections"): ``head_left`` is what the
    # request head being read may still take (-1: no head is being read), ``head_started`` when
    # its first byte came (0: none yet), ``in_body`` whether a request body is due (all three in
    # ``_fast``: :mod:`._fast_conn`). One timer per connection (``_watch``) checks them lazily:
    # nothing is armed or cancelled per request.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.parser.set_dangerous_leniencies(**LENIENCIES)
        limits: ConnectionLimits = getattr(self.config, "connection_limits", _DEFAULT_LIMITS)
        self._fast = FastConnection(self, limits, self.loop.time())
        self._watch: asyncio.TimerHandle | None = self.loop.call_later(
            min(limits.header_timeout, limits.body_timeout, limits.send_timeout),
            self._check_progress,
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._fast.write_paused = self.loop.time()
        self._fast.write_left = self.transport.get_write_buffer_size()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._fast.write_paused = 0.0

    def data_received(self, data: bytes) -> None:
        fast = self._fast
        now = fast.loop.time()
        fast.last_data = now
        while fast.head_left >= 0:
            if fast.head_started == 0.0:
                fast.head_started = now
            if len(data) <= fast.head_left:
                fast.head_left -= len(data)
                break
            # More than the head being read may still take: parse only what it may (httptools
            # gathers a header's value by concatenation, so a giant header would also cost time
            # quadratic in its size); unless the head ended within it, answer 431.
            allowed = fast.head_left
            if not self._feed_head_end(data[:allowed]):
                return
            data = data[allowed:]  # the rest: a body, or the next requests (pipelined)
        if data:
            try:
                fast.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
                self._parse_failed(error)
        if fast.in_body:
            cycle = self.cycle
            if isinstance(cycle, FastRequest) and cycle.buffer is not None:
                self._read_body_directly(cycle.buffer)

    def _read_body_directly(self, buffer: BodyBuffer) -> None:
        """Read the rest of a large body into ``buffer`` (:mod:`._body_reader`)."""
        if not self.transport.is_closing():
            self.transport.set_protocol(BodyReader(self, buffer))

    def body_read(self) -> None:
        """More of a large body came (:class:`BodyReader`): once all of it is in, this protocol
        reads again, with a new parser (the old one is left in the body), and serves it."""
        fast = self._fast
        fast.last_data = fast.loop.time()
        cycle = self.cycle
        if not isinstance(cycle, FastRequest) or cycle.buffer is None:
            return
        if cycle.buffer.complete:
            self.transport.set_protocol(self)
            self.parser = fast.parser = httptools.HttpRequestParser(self)
            self.parser.set_dangerous_leniencies(**LENIENCIES)
            self.on_message_complete()

    def _feed_head_end(self, data: bytes) -> bool:
        """Feed the last bytes the head being read may take; False when the connection is
        over (the head did not end within them: 431)."""
        fast = self._fast
        fast.head_left = 0
        if data:
            self._feed(data)
        if self.transport.is_closing():
            return False
        if fast.head_left == 0:
            limit = fast.limits.max_header_size
            self._refuse(
                431,
                f"the request header fields exceed the limit of {limit} bytes; "
                "use --http-max-header-size to raise it",
            )
            return False
        return True

    def _check_progress(self) -> None:
        """The connection's timer: end a request head or body that is overdue (408)."""
        self._watch = None
        if self.transport is None or self.transport.is_closing():
            return
        limits = self._fast.limits
        now = self.loop.time()
        due, what = self._due(now)
        if what == "send" and now >= due:
            left = self.transport.get_write_buffer_size()
            if left < self._fast.write_left:  # the client took some: it has time again
                self._fast.write_paused, self._fast.write_left = now, left
                self._watch = self.loop.call_later(limits.send_timeout, self._check_progress)
                return
            # A client that does not read what it asked for: nothing more can reach it.
            log.info(
                "closing an HTTP connection whose client took nothing of its response for %g s",
                self._fast.limits.send_timeout,
            )
            reset_connection(self.transport)
            return
        if what and now >= due:
            timeout = limits.body_timeout if what == "body" else limits.header_timeout
            self._refuse(
                408,
                f"the request {what} did not arrive within {timeout:g} s; "
                f"use --http-{what}-timeout-secs to change the limit",
            )
            return
        self._watch = self.loop.call_later(due - now, self._check_progress)

    def _due(self, now: float) -> tuple[float, str]:
        """When what is being read (``what``: "body", "header" or "": nothing) is overdue."""
        fast = self._fast
        limits = fast.limits
        if fast.write_paused != 0.0:
            return fast.write_paused + limits.send_timeout, "send"
        if fast.in_body:
            return fast.last_data + limits.body_timeout, "body"
        if fast.head_started != 0.0 and fast.head_left >= 0:
            return fast.head_started + limits.header_timeout, "header"
        # Idle between requests (the keep-alive timeout's business), or a request running.
        return now + min(limits.header_timeout, limits.body_timeout, limits.send_timeout), ""

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a JSON error and close: the connection cannot go on."""
        body = _json.dumps({"error": message})
        head = [_status_line(status)]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: ",
            str(len(body)).encode("latin-1"),
            b"\r\nconnection: close\r\n\r\n",
            body,
        ]
        self.transport.write(b"".join(head))
        self.transport.close()

    def _feed(self, data: bytes) -> None:
        try:
            self._fast.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
            self._parse_failed(error)

    def _parse_failed(self, error: Exception) -> None:
        """uvicorn's answers to a request the parser refused or that asks for an upgrade (its
        code reads the head as uvicorn's own attributes)."""
        fast = self._fast
        self.url, self.headers = fast.url, fast.headers
        self.expect_100_continue = fast.expect_100_continue
        if isinstance(error, httptools.HttpParserUpgrade):
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        message = "Invalid HTTP request received."
        self.logger.warning(message)
        self.send_400_response(message)

    def on_url(self, url: bytes) -> None:
        fast = self._fast
        fast.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        fast = self._fast
        if name == b"expect" and value.lower() == b"100-continue":
            fast.expect_100_continue = True
        fast.headers.append((name, value))

    def on_response_complete(self) -> None:
        fast = self._fast
        fast.server_state.total_requests += 1
        if fast.transport.is_closing():
            return
        flow = fast.flow
        if flow.read_paused:
            flow.resume_reading()
        if fast.pipeline:
            cycle, app = fast.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        fast.last_data = fast.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = fast.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_check
            )

    def _keep_alive_check(self) -> None:
        """Close the connection once it has been idle for the keep-alive timeout: no request in
        progress and no bytes received for that long (uvicorn's rule, checked lazily)."""
        self.timeout_keep_alive_task = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return  # busy: the response's completion arms the timer again
        idle = self.loop.time() - self._fast.last_data
        if idle >= self.timeout_keep_alive:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive - idle, self._keep_alive_check
            )

    def on_chunk_header(self) -> None:
        """Triton's limit on the chunks of a body (``kMaxChunkedChunks``), and its words: many
        tiny chunks cost per chunk what no limit on bytes sees."""
        fast = self._fast
        fast.chunks += 1
        if fast.chunks == MAX_CHUNKS + 2:  # past the last allowed one and the empty last one
            self._refuse(
                400,
                f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. "
                "Send fewer or larger HTTP chunks.",
            )

    def on_message_begin(self) -> None:
        fast = self._fast
        fast.chunks = 0
        fast.url = b""
        fast.expect_100_continue = False
        fast.headers = []

    def on_headers_complete(self) -> None:
        fast = self._fast
        fast.head_left = -1
        started = fast.head_started
        fast.head_started = 0.0
        fast.in_body = True
        request = self._fast_request(fast)
        if request is not None:
            request.recv_start = started  # (HTTP_RECV_START, if it is traced)
            self.cycle = cast(Any, request)
            if getattr(fast.config, "last_responses", False):
                request.keep_alive = False
            return
        # The ASGI way: build the scope uvicorn's on_message_begin would have built, with the
        # head as uvicorn's own attributes (its code reads them).
        super().on_message_begin()
        headers = fast.headers
        # Both Content-Length and Transfer-Encoding: the body is read chunked (RFC 9112 6.3, as
        # Triton), its Content-Length dropped, and the connection closed after the answer.
        framed_twice = is_framed_twice(headers)
        if framed_twice:
            headers = [(name, value) for name, value in headers if name != b"content-length"]
        self.url, self.headers = fast.url, headers
        self.expect_100_continue = fast.expect_100_continue
        self.scope["headers"] = headers
        super().on_headers_complete()
        last = framed_twice or getattr(fast.config, "last_responses", False)
        if last and self.cycle is not None:
            self.cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if isinstance(cycle, FastRequest):
            if cycle.buffer is not None:
                cycle.buffer.add(body)
            elif cycle.length >= DIRECT_BODY and len(body) < cycle.length:
                cycle.buffer = BodyBuffer(cycle.length)  # the rest: read_body_directly
                cycle.buffer.add(body)
            elif not cycle.body:
                cycle.body = body
            elif isinstance(cycle.body, bytearray):
                cycle.body += body  # in place (a large buffer grows without being copied)
            else:
                joined = bytearray(cycle.body)
                joined += body
                cycle.body = joined
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        fast = self._fast
        fast.in_body = False
        fast.head_left = fast.limits.max_header_size  # the next request's head
        cycle = self.cycle
        if not isinstance(cycle, FastRequest):
            super().on_message_complete()
            return
        if cycle.buffer is not None:
            cycle.body, cycle.map, cycle.buffer = cycle.buffer.body(), cycle.buffer.map, None
        cycle.recv_end = fast.last_data  # (HTTP_RECV_END, if it is traced)
        Stepped(self._serve(cycle), fast.tasks)  # no task: stepped by hand, starting now

    def _fast_request(self, fast: FastConnection) -> FastRequest | None:
        endpoint = fast.endpoint
        if endpoint is None or fast.expect_100_continue:
            return None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return None  # pipelined behind a request in progress: uvicorn queues it
        parser = fast.parser
        if parser.get_method() != b"POST":
            return None
        known = fast.known_head
        if known is None or not known.matches(fast.url, fast.headers, endpoint):
            known = read_head(endpoint, fast.url, fast.headers)
            if known is None:
                return None
            fast.known_head = known
        headers = known.headers
        # uvicorn's rule: HTTP/1.0 is never kept alive. The version is asked (a new str, ~2,400
        # instructions) only where it can matter: llhttp keeps an HTTP/1.0 request alive only
        # when a Connection (or Proxy-Connection) header says keep-alive.
        keep_alive = parser.should_keep_alive() and (
            ("connection" not in headers and "proxy-connection" not in headers)
            or parser.get_http_version() != "1.0"
        )
        return FastRequest(endpoint, known.name, known.version, headers, keep_alive, known.length)

    async def _serve(self, request: FastRequest) -> None:
        body, request.body = request.body, b""
        status, headers, payload = await request.endpoint.respond(
            request.name, request.version, request.headers, body, True, None, request
        )
        if request.map is not None:
            del body  # the request's last view of it
            POOL.give_back(request.map)
        send_start = time.monotonic_ns() if request.trace_id else 0  # (HTTP_SEND_START)
        self._send(request, status, headers, payload)
        if request.trace_id:  # its trace awaits the frontend's timestamps
            traced_sent(request, send_start)
        # The end, without a StopIteration to catch (see Stepped); never inside a try/with.
        await LAST_STEP

    def _send(
        self, request: FastRequest, status: int, headers: Sequence[tuple[str, str]], payload: Body
    ) -> None:
        """Write the response to ``request``, unless its client went away (a lent body is
        released either way)."""
        lent = payload if isinstance(payload, LentBody) else None
        try:
            if request.disconnected:
                return
            fast = self._fast
            transport = fast.transport
            head = fast.head(
                _status_line(status), headers, body_length(payload), request.keep_alive
            )
            if isinstance(payload, bytes) and len(payload) <= _JOINED_MAX:
                transport.write_now(head + payload)  # one small copy: one send, no handle
            elif isinstance(payload, bytes):
                transport.write(head)
                transport.write(payload)
            else:  # pieces: uvloop keeps references and sends them as the socket drains, in C
                transport.write(head)
                transport.writelines(payload.pieces if isinstance(payload, LentBody) else payload)
            if lent is not None:  # what the kernel does not take now is copied
                transport.send_lent()
            request.response_complete = True
            if not request.keep_alive:
                transport.close()
            self.on_response_complete()
        finally:
            if lent is not None:  # nothing refers to its memory any more
                lent.release()


#: A body this small or smaller is sent joined to its head, at once (:meth:`write_now`).
_JOINED_MAX: Final = 1 << 14

_DEFAULT_LIMITS = ConnectionLimits()


@functools.lru_cache(maxsize=64)
def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")
