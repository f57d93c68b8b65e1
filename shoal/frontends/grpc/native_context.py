"""A call on shoal's own gRPC server as its method sees it (the part of
``grpc.aio.ServicerContext`` shoal's RPCs use), the method as the call reads it, the error
that ends a call with a status, and a compressed request message inflated (an error status
past the size limit)."""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections.abc import Callable
from typing import Any, Final

from shoal.frontends.grpc.methods import Method
from shoal.frontends.grpc.native_headers import metadata
from shoal.frontends.grpc.native_messages import inflate
from shoal.frontends.grpc.status import Status
from shoal.frontends.h2.header_blocks import Headers

#: A compressed message smaller than this is inflated on the event loop (at most ~1 MiB out).
_INFLATE_INLINE: Final = 1024


class CallMethod:
    """A :class:`~shoal.frontends.grpc.methods.Method` as the calls of shoal's own server read
    it, its fields native attributes: compiled, each read of a frozen dataclass's field is a
    look-up in its instance dictionary (six per call)."""

    __slots__ = ("handle", "parse", "serialize", "split", "streaming")

    def __init__(self, method: Method) -> None:
        self.streaming: bool = method.streaming
        self.parse: Callable[[bytes | bytearray], Any] | None = method.parse
        self.serialize: Callable[[Any], bytes] | None = method.serialize
        self.handle: Callable[[Any, Any], Any] = method.handle
        self.split: bool = method.split


class Abort(Exception):
    """Ends a call with ``code`` and ``details`` (its status), raised by its work."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The part of ``grpc.aio.ServicerContext`` that shoal's RPCs use."""

    __slots__ = ("_headers", "_metadata")

    def __init__(self, headers: Headers) -> None:
        self._headers = headers
        self._metadata: tuple[tuple[str, str], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        if self._metadata is None:
            self._metadata = metadata(self._headers)
        return self._metadata

    async def abort(self, code: Status, details: str) -> None:
        raise Abort(code, details)


async def inflated(
    message: bytes | bytearray, encoding: bytes | None, limit: int
) -> bytes | bytearray:
    """Inflate a compressed message, refusing past the message size limit while inflating
    (a small "zip bomb" costs at most the limit); off the event loop unless small."""
    wbits = 16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS
    work = functools.partial(inflate, message, wbits, limit)
    try:
        out = work() if len(message) < _INFLATE_INLINE else await asyncio.to_thread(work)
    except zlib.error as exc:
        raise Abort(Status.INTERNAL, f"failed to decompress the request message: {exc}") from None
    if out is None:
        raise Abort(
            Status.RESOURCE_EXHAUSTED,
            f"Received message larger than max (more than {limit} bytes uncompressed)",
        )
    return out
