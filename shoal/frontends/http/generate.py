"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` and
``/generate_stream``.

Both read the same flat JSON body (:mod:`shoal.frontends.http._generate_json`), look up the model's
inputs with ``model_metadata`` and call ``infer_stream``. ``/generate`` answers one JSON object and
needs exactly one response from the model. ``/generate_stream`` answers Server-Sent Events, one
``data: {...}`` event per response as the model produces it; an error after the first response is
sent as a last ``data: {"error": ...}`` event, since the status line is gone by then. Errors before
the first response get the usual JSON error and status.

Each endpoint is a bare ASGI app, so that it can watch for the client going away while the model
works: when the client disconnects, the work is cancelled and the ``infer_stream`` iterator closed,
and the core drops the responses still to come. Every response is released once encoded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from shoal.core import CoreAPI, InferRequest, InferResponse, InvalidArgument, ShoalError
from shoal.frontends.http import codec
from shoal.frontends.http._body import ClientDisconnected, read_body
from shoal.frontends.http._endpoint import JSON_TYPE, Headers, error_parts, model_ref, unexpected
from shoal.frontends.http._generate_json import (
    EXACTLY_ONE,
    decode_generate_request,
    encode_generate_response,
    error_json,
    sse_event,
)

#: The ``Content-Type`` of ``/generate_stream``'s events, as Triton sends it.
EVENT_STREAM_TYPE = "text/event-stream; charset=utf-8"

_MODEL_PATHS = ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}")


def generate_routes(core: CoreAPI, max_input_size: int) -> list[Route]:
    """``generate`` and ``generate_stream`` under both model paths."""
    single = GenerateEndpoint(core, max_input_size, streaming=False)
    stream = GenerateEndpoint(core, max_input_size, streaming=True)
    routes = []
    for path in _MODEL_PATHS:
        routes += [
            Route(path + "/generate", single, methods=["POST"]),
            Route(path + "/generate_stream", stream, methods=["POST"]),
        ]
    return routes


class GenerateEndpoint:
    """One generate route; bodies over ``max_input_size`` bytes are refused unread."""

    def __init__(self, core: CoreAPI, max_input_size: int, *, streaming: bool) -> None:
        self._core = core
        self._limit = max_input_size
        self._streaming = streaming

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            request = await self._decode(scope, receive)
        except ClientDisconnected:
            return  # nobody is left to answer
        except ShoalError as exc:
            await _send_error(send, exc)
            return
        except Exception:
            await _send_error(send, unexpected("a generate request"))
            return
        answer = self._stream(request, send) if self._streaming else self._single(request, send)
        await _until_disconnected(receive, answer)

    async def _decode(self, scope: Scope, receive: Receive) -> InferRequest:
        name, version = model_ref(scope["path_params"])
        metadata = self._core.model_metadata(name, version)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        encoding = codec.request_encoding(headers.get("content-encoding"))
        body = await read_body(
            receive, headers.get("content-length"), self._limit, what="Request JSON"
        )
        if encoding is not None:
            body = await _inflate(body, encoding, self._limit)
        return decode_generate_request(
            body, metadata.inputs, model_name=name, model_version=version
        )

    async def _single(self, request: InferRequest, send: Send) -> None:
        try:
            body = await self._only_response(request)
        except ShoalError as exc:
            await _send_error(send, exc)
        except Exception:
            await _send_error(send, unexpected("a generate request"))
        else:
            await _send_whole(send, 200, [("content-type", JSON_TYPE)], body)

    async def _only_response(self, request: InferRequest) -> bytes:
        responses = self._core.infer_stream(request)
        try:
            body = await _next_body(responses)
            if body is None or await _next_body(responses) is not None:
                raise InvalidArgument(EXACTLY_ONE)
            return body
        finally:
            await _close(responses)  # after a second response: drop the rest

    async def _stream(self, request: InferRequest, send: Send) -> None:
        responses = self._core.infer_stream(request)
        try:
            try:
                first = await _next_response(responses)
            except ShoalError as exc:  # refused before the model ran: plain JSON
                await _send_error(send, exc)
                return
            except Exception:
                await _send_error(send, unexpected("a generate_stream request"))
                return
            status, event = 200, b""
            if first is not None:
                try:
                    event = sse_event(_encoded(first))
                except ShoalError as exc:
                    # The model's error as its first response: Triton's stream, with the
                    # error's status and the error as its only event.
                    status, event = error_parts(exc)[0], sse_event(error_json(exc.message))
            await _start(send, status, [("content-type", EVENT_STREAM_TYPE)])
            if event:
                await _send_chunk(send, event)
            if status == 200 and first is not None:
                await _send_rest(responses, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await _close(responses)


async def _send_rest(responses: AsyncIterator[InferResponse], send: Send) -> None:
    """Every further response as an event; an error is the last event."""
    error: ShoalError | None = None
    while error is None:
        try:
            body = await _next_body(responses)
        except ShoalError as exc:
            error = exc
        except Exception:
            error = unexpected("a generate_stream request")
        else:
            if body is None:
                return
            await _send_chunk(send, sse_event(body))
    await _send_chunk(send, sse_event(error_json(error.message)))


async def _next_body(responses: AsyncIterator[InferResponse]) -> bytes | None:
    """The next response encoded (and released), or None at the end."""
    response = await _next_response(responses)
    return None if response is None else _encoded(response)


async def _next_response(responses: AsyncIterator[InferResponse]) -> InferResponse | None:
    try:
        return await anext(responses)
    except StopAsyncIteration:
        return None


def _encoded(response: InferResponse) -> bytes:
    """The response encoded, and released; its error raised when it is an error response."""
    if response.error is not None:  # the model's error response: the last event
        response.release()
        raise response.error
    try:
        return encode_generate_response(response)
    finally:
        response.release()


async def _close(responses: AsyncIterator[InferResponse]) -> None:
    """Close the iterator, so that the core drops the responses still to come."""
    aclose = getattr(responses, "aclose", None)
    if aclose is not None:
        await aclose()


async def _until_disconnected(receive: Receive, answer: Coroutine[Any, Any, None]) -> None:
    """Run ``answer``; cancel it if the client disconnects first."""
    work = asyncio.ensure_future(answer)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watcher):
            task.cancel()
        await asyncio.gather(work, watcher, return_exceptions=True)
    if not work.cancelled():
        work.result()  # a bug in ``answer`` is raised, not swallowed


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone (the body has been read: nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _inflate(body: bytes | bytearray, encoding: str, limit: int) -> bytes:
    return await codec.inflate(body, encoding, limit=limit)


async def _send_error(send: Send, error: ShoalError) -> None:
    status, headers, body = error_parts(error)
    await _send_whole(send, status, headers, body)


async def _send_whole(send: Send, status: int, headers: Headers, body: bytes) -> None:
    await _start(send, status, [*headers, ("content-length", str(len(body)))])
    await send({"type": "http.response.body", "body": body})


async def _start(send: Send, status: int, headers: Headers) -> None:
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})


async def _send_chunk(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})
