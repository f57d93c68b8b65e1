"""The slower ways of an HTTP inference request (:meth:`app._InferEndpoint.respond`): a
compressed body, large JSON parsed or encoded in a thread, a compressed response. Each is a
coroutine of its own, awaited only where it applies: the usual small request stays in one
coroutine level (each level costs every request on its way in and again when it resumes)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

from shoal.core import InferResponse
from shoal.frontends.http import _json, codec
from shoal.frontends.http._endpoint import Headers

_T = TypeVar("_T")

#: Above this size, compress (zlib releases the GIL) or parse or encode JSON in a thread.
THREAD_THRESHOLD = 1 << 20


async def decoded_slowly(
    name: str,
    version: str,
    body: bytes | bytearray | memoryview,
    encoding: str | None,
    header_length: str | None,
    limit: int,
    config_of: codec.ConfigOf | None = None,
) -> codec.DecodedRequest:
    """The request decoded: a compressed body inflated first (to at most ``limit`` bytes); a
    large JSON body parsed in a thread and in pieces, so that the event loop gets the GIL back
    between the calls (none takes long; :func:`_json.in_background`)."""
    if encoding is not None:
        body = await codec.inflate(body, encoding, limit=limit)
    if header_length is None and len(body) >= THREAD_THRESHOLD:
        decode = functools.partial(
            codec.decode_infer_request, body, model_name=name, model_version=version
        )
        return await asyncio.to_thread(_json.in_background, decode)
    return codec.decode_infer_request(
        body,
        model_name=name,
        model_version=version,
        header_length=header_length,
        config_of=config_of,
    )


async def encoded_in_thread(
    response: InferResponse, decoded: codec.DecodedRequest
) -> tuple[Headers, codec.Body]:
    """A response with large JSON outputs encoded in a thread, a slice at a time, so that the
    event loop gets the GIL back between the slices (:func:`_json.in_background`)."""
    encode = functools.partial(_encode, response, decoded)
    work = asyncio.ensure_future(asyncio.to_thread(_json.in_background, encode))
    try:
        return await asyncio.shield(work)
    finally:
        # Released on the loop, and only once the thread has done reading the outputs (the
        # request may be cancelled meanwhile: a client that went away).
        if work.done():
            response.release()
        else:
            work.add_done_callback(functools.partial(_release_after, response))


def _encode(response: InferResponse, decoded: codec.DecodedRequest) -> tuple[Headers, codec.Body]:
    encoded = codec.encode_infer_response(response, decoded.output_format)
    headers = encoded.headers
    return headers, encoded.payload()


def _release_after(
    response: InferResponse, work: asyncio.Future[tuple[Headers, codec.Body]]
) -> None:
    if not work.cancelled():
        work.exception()  # retrieved: nobody awaits it any more
    response.release()


async def compressed(
    headers: Headers, body: codec.Body, encoding: str
) -> tuple[Headers, codec.Body]:
    """``body`` compressed with ``encoding``, and its headers saying so."""
    if isinstance(body, codec.LentBody):
        body = body.joined()  # not lent when compressed: never here
    if not isinstance(body, bytes):  # pieces are large: joined in a thread (the GIL is let go)
        body = await asyncio.to_thread(b"".join, body)
    body = await _sized_run(len(body), functools.partial(codec.compress, body, encoding))
    return [*headers, ("content-encoding", encoding)], body


async def _sized_run(size: int, work: Callable[[], _T]) -> _T:
    return work() if size < THREAD_THRESHOLD else await asyncio.to_thread(work)
