"""Compressed answers of ``ModelInfer`` and ``ModelStreamInfer`` on shoal's own gRPC server
(``--grpc-infer-response-compression-level``), as Triton's server has grpc-core make them.

Triton sets the level on those two methods' calls only (``set_compression_level``); grpc-core
turns it into an algorithm the client accepts (``grpc-accept-encoding``, which grpcio and so
tritonclient send): of gzip and deflate, in that order, those accepted; ``low`` takes the first,
``medium`` the middle one (index n / 2), ``high`` the last; none accepted, nothing is compressed
(``CompressionAlgorithmForLevel``). The answer's headers then carry ``grpc-encoding`` and each
message is deflated at zlib's default level whatever the level (grpc-core's ``zlib_compress``),
gzip with its header, deflate as a zlib stream, and sent with the compressed flag set. With
the level ``none`` (the default) the server holds no :class:`AnswerCompression` and a call pays
one attribute test.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import Any, Final

from shoal.frontends.grpc.infer_call import LentReply
from shoal.frontends.grpc.methods import SERVICE_NAME
from shoal.frontends.h2 import frames as h2

#: The flag's values, as grpc-core numbers the levels.
LEVELS: Final = {"none": 0, "low": 1, "medium": 2, "high": 3}
#: The calls whose answers are compressed, by their ``:path``.
COMPRESSED_PATHS: Final = frozenset(
    f"/{SERVICE_NAME}/{name}".encode() for name in ("ModelInfer", "ModelStreamInfer")
)
#: zlib's window bits for each encoding: a gzip header and trailer, or a zlib stream.
_WBITS: Final = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
#: A message larger than this is deflated in a thread (zlib lets the GIL go): 16 KiB take about
#: 2 ms of a core (random data), more than the hop to a thread costs.
_THREAD_ABOVE: Final = 16 << 10
#: Accept-encoding values whose choice is kept (a client sends the same one call after call).
_KEPT: Final = 64


def algorithm_for_level(level: str, accepted: bytes | None) -> bytes | None:
    """grpc-core's choice for ``level`` among the encodings a client accepts; None: none."""
    if accepted is None or LEVELS[level] == 0:
        return None
    names = {name.strip() for name in bytes(accepted).split(b",")}
    usable = [name for name in (b"gzip", b"deflate") if name in names]
    if not usable:
        return None
    return usable[{1: 0, 2: len(usable) // 2, 3: -1}[LEVELS[level]]]


class Squeeze:
    """How one call's answers go compressed with ``encoding``: its header block and each
    message's deflated bytes."""

    def __init__(self, encoding: bytes) -> None:
        self.encoding = encoding
        #: ``:status 200``, ``content-type: application/grpc`` and ``grpc-encoding``.
        self.headers = h2.GRPC_RESPONSE_HEADERS + h2.literal(b"grpc-encoding", encoding)
        self._wbits = _WBITS[encoding]

    async def compressed(self, body: bytes | bytearray | memoryview) -> bytes:
        """``body`` deflated (a large one in a thread)."""
        if len(body) > _THREAD_ABOVE:
            return await asyncio.to_thread(zlib.compress, body, -1, self._wbits)
        return zlib.compress(body, -1, self._wbits)

    async def reply(self, reply: Any, serialize: Callable[[Any], bytes] | None) -> bytes:
        """A unary method's reply as its message's deflated bytes; lent memory goes back
        once joined."""
        if isinstance(reply, LentReply):
            try:
                body: bytes | bytearray = b"".join(reply.chunks)
            finally:
                reply.release()
        else:
            body = reply if serialize is None else serialize(reply)
        return await self.compressed(body)


class AnswerCompression:
    """A server's level, and each call's :class:`Squeeze` (None: its answers go as they are)."""

    def __init__(self, level: str) -> None:
        self.level = level
        self._kept: dict[bytes | None, Squeeze | None] = {}

    @staticmethod
    def of(level: str) -> AnswerCompression | None:
        """The compression of ``level``; None for ``none``."""
        return None if LEVELS[level] == 0 else AnswerCompression(level)

    def for_call(self, path: bytes, accepted: bytes | None) -> Squeeze | None:
        """The compression of a call of ``path`` whose client accepts ``accepted``."""
        if path not in COMPRESSED_PATHS:
            return None
        key = None if accepted is None else bytes(accepted)
        if key in self._kept:
            return self._kept[key]
        encoding = algorithm_for_level(self.level, key)
        squeeze = None if encoding is None else Squeeze(encoding)
        if len(self._kept) >= _KEPT:
            self._kept.clear()
        self._kept[key] = squeeze
        return squeeze
