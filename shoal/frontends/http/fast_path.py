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
from collections.abc import Sequence
from typing import Any, Final, cast

import httptools

from shoal.frontends._limits import ConnectionLimits
from shoal.frontends.http import _json
from shoal.frontends.http._body_reader import DIRECT_BODY, POOL, BodyBuffer, BodyReader
from shoal.frontends.http._coalescing import CoalescingHttpToolsProtocol, CoalescingTransport
from shoal.frontends.http._fast_request import FastInfer, FastRequest, Stepped
from shoal.frontends.http._response import Body, LentBody, body_length


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

    # A connection's limits (docs/hardening.md, "Connections"): ``_head_left`` is what the
    # request head being read may still take (-1: no head is being read), ``_head_started`` when
    # its first byte came (0: none yet), ``_in_body`` whether a request body is due. One timer
    # per connection (``_watch``) checks them lazily: nothing is armed or cancelled per request.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        limits: ConnectionLimits = getattr(self.config, "connection_limits", _DEFAULT_LIMITS)
        self._limits = limits
        now = self.loop.time()
        self._last_data = now
        self._head_left = limits.max_header_size
        self._head_started = now  # the first request's head is due from the accept
        self._in_body = False
        self._defaults: list[tuple[bytes, bytes]] | None = None
        self._defaults_head = b""
        self._headers: Sequence[tuple[str, str]] = ()
        self._headers_lines = b""
        self._watch: asyncio.TimerHandle | None = self.loop.call_later(
            min(limits.header_timeout, limits.body_timeout), self._check_progress
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        now = self.loop.time()
        self._last_data = now
        while self._head_left >= 0:
            if self._head_started == 0.0:
                self._head_started = now
            if len(data) <= self._head_left:
                self._head_left -= len(data)
                break
            # More than the head being read may still take: parse only what it may (httptools
            # gathers a header's value by concatenation, so a giant header would also cost time
            # quadratic in its size); unless the head ended within it, answer 431.
            allowed = self._head_left
            if not self._feed_head_end(data[:allowed]):
                return
            data = data[allowed:]  # the rest: a body, or the next requests (pipelined)
        if data:
            self._feed(data)
        cycle = self.cycle
        if isinstance(cycle, FastRequest) and cycle.buffer is not None and self._in_body:
            self._read_body_directly(cycle.buffer)

    def _read_body_directly(self, buffer: BodyBuffer) -> None:
        """Read the rest of a large body into ``buffer`` (:mod:`._body_reader`)."""
        if not self.transport.is_closing():
            self.transport.set_protocol(BodyReader(self, buffer))

    def body_read(self) -> None:
        """More of a large body came (:class:`BodyReader`): once all of it is in, this protocol
        reads again, with a new parser (the old one is left in the body), and serves it."""
        self._last_data = self.loop.time()
        cycle = self.cycle
        if not isinstance(cycle, FastRequest) or cycle.buffer is None:
            return
        if cycle.buffer.complete:
            self.transport.set_protocol(self)
            self.parser = httptools.HttpRequestParser(self)
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn
            self.on_message_complete()

    def _feed_head_end(self, data: bytes) -> bool:
        """Feed the last bytes the head being read may take; False when the connection is
        over (the head did not end within them: 431)."""
        self._head_left = 0
        if data:
            self._feed(data)
        if self.transport.is_closing():
            return False
        if self._head_left == 0:
            limit = self._limits.max_header_size
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
        limits = self._limits
        now = self.loop.time()
        due, what = self._due(now)
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
        limits = self._limits
        if self._in_body:
            return self._last_data + limits.body_timeout, "body"
        if self._head_started != 0.0 and self._head_left >= 0:
            return self._head_started + limits.header_timeout, "header"
        # Idle between requests (the keep-alive timeout's business), or a request running.
        return now + min(limits.header_timeout, limits.body_timeout), ""

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
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_url(self, url: bytes) -> None:
        self.url = self.url + url  # not +=: mypyc 2.4 fails on it for an inherited attribute

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._last_data = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_check
            )

    def _keep_alive_check(self) -> None:
        """Close the connection once it has been idle for the keep-alive timeout: no request in
        progress and no bytes received for that long (uvicorn's rule, checked lazily)."""
        self.timeout_keep_alive_task = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return  # busy: the response's completion arms the timer again
        idle = self.loop.time() - self._last_data
        if idle >= self.timeout_keep_alive:
            self.timeout_keep_alive_handler()
        else:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive - idle, self._keep_alive_check
            )

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_headers_complete(self) -> None:
        self._head_left = -1
        self._head_started = 0.0
        self._in_body = True
        fast = self._fast_request()
        if fast is not None:
            self.cycle = cast(Any, fast)
        else:
            # The ASGI way: build the scope uvicorn's on_message_begin would have built.
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()
            self.url, self.headers, self.expect_100_continue = url, headers, expect
            self.scope["headers"] = headers
            super().on_headers_complete()
        if getattr(self.config, "last_responses", False) and self.cycle is not None:
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
        self._in_body = False
        self._head_left = self._limits.max_header_size  # the next request's head
        cycle = self.cycle
        if not isinstance(cycle, FastRequest):
            super().on_message_complete()
            return
        if cycle.buffer is not None:
            cycle.body, cycle.map, cycle.buffer = cycle.buffer.body(), cycle.buffer.map, None
        Stepped(self._serve(cycle), self.tasks)  # no task: stepped by hand, starting now

    def _fast_request(self) -> FastRequest | None:
        endpoint: FastInfer | None = getattr(self.app, "fast_infer", None)
        if endpoint is None or self.expect_100_continue:
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return None  # pipelined behind a request in progress: uvicorn queues it
        if self.parser.get_method() != b"POST":
            return None
        target = endpoint.routes.match_target(self.url)
        if target is None:
            return None
        headers: dict[str, str] = {}
        for name, value in self.headers:  # only what the endpoint reads (the last, if repeated)
            key = _READ_HEADERS.get(name)
            if key is not None:
                headers[key] = value.decode("latin-1")
        text = headers.get("content-length")
        length = int(text) if text is not None and text.isdigit() else -1
        if not 0 <= length <= endpoint.limit:
            return None  # chunked, malformed or too large: the ASGI way answers those
        if "transfer-encoding" in headers:
            return None
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        return FastRequest(endpoint, target[0], target[1], headers, keep_alive, length)

    async def _serve(self, request: FastRequest) -> None:
        body, request.body = request.body, b""
        status, headers, payload = await request.endpoint.respond(
            request.name, request.version, request.headers, body, True
        )
        if request.map is not None:
            del body  # the request's last view of it
            POOL.give_back(request.map)
        self._send(request, status, headers, payload)

    def _send(
        self, request: FastRequest, status: int, headers: Sequence[tuple[str, str]], payload: Body
    ) -> None:
        """Write the response to ``request``, unless its client went away (a lent body is
        released either way)."""
        lent = payload if isinstance(payload, LentBody) else None
        try:
            if request.disconnected:
                return
            self.transport.write(
                self._head(status, headers, body_length(payload), request.keep_alive)
            )
            if isinstance(payload, bytes):
                self.transport.write(payload)
            else:  # pieces: uvloop keeps references and sends them as the socket drains, in C
                self.transport.writelines(
                    payload.pieces if isinstance(payload, LentBody) else payload
                )
            if lent is not None:  # what the kernel does not take now is copied
                cast(CoalescingTransport, self.transport).send_lent()
            request.response_complete = True
            if not request.keep_alive:
                self.transport.close()
            self.on_response_complete()
        finally:
            if lent is not None:  # nothing refers to its memory any more
                lent.release()

    def _head(
        self, status: int, headers: Sequence[tuple[str, str]], length: int, keep_alive: bool
    ) -> bytes:
        """The status line and headers of a fast response."""
        head = [_status_line(status), self._default_head(), b"content-length: "]
        head += [str(length).encode("latin-1"), b"\r\n", self._header_lines(headers)]
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    def _header_lines(self, headers: Sequence[tuple[str, str]]) -> bytes:
        """``headers`` encoded; the last ones are kept, as a binary response's headers are the
        same object for each response of a model (:func:`codec.encode_infer_response`)."""
        if headers is not self._headers:
            lines = [name + ": " + value + "\r\n" for name, value in headers]
            self._headers, self._headers_lines = headers, "".join(lines).encode("latin-1")
        return self._headers_lines

    def _default_head(self) -> bytes:
        """The server's default header lines, encoded once per version of them: uvicorn
        replaces its list when the ``date`` header changes, once a second."""
        defaults = self.server_state.default_headers
        if defaults is not self._defaults:
            lines = [name + b": " + value + b"\r\n" for name, value in defaults]
            self._defaults, self._defaults_head = defaults, b"".join(lines)
        return self._defaults_head


_DEFAULT_LIMITS = ConnectionLimits()
#: The request headers a fast request keeps (:meth:`FastInfer.respond` reads no others), by
#: their lowercase names as the parser gives them.
_READ_HEADERS: Final = {
    name.encode("latin-1"): name
    for name in (
        "content-length",
        "transfer-encoding",
        "content-encoding",
        "accept-encoding",
        "inference-header-content-length",
    )
}


@functools.lru_cache(maxsize=64)
def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")
