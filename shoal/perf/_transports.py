"""The per-worker connections of the built-in client: raw HTTP/1.1, gRPC unary and gRPC stream.

Each holds its request already serialised and re-sends the same bytes.
"""

from __future__ import annotations

from typing import Any

from shoal.perf._http import HttpConnection
from shoal.perf.errors import RequestFailed
from shoal.perf.requests import FINAL_RESPONSE
from shoal.protos import grpc_service_pb2 as pb

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # one TCP connection per worker, as the HTTP client has, instead of a shared subchannel
    ("grpc.use_local_subchannel_pool", 1),
]


class HttpTransport:
    """A keep-alive connection, reopened after the server closes it."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self._host, self._port, self._request = host, port, request
        self._connection: HttpConnection | None = None

    async def send(self) -> int:
        if self._connection is None or self._connection.closed:
            self._connection = await HttpConnection.open(self._host, self._port)
        await self._connection.exchange(self._request)
        return 1

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


class GrpcUnaryTransport:
    """``ModelInfer`` on a channel of its own; a generic call sends the bytes as they are."""

    def __init__(self, target: str, request: bytes, timeout_s: float) -> None:
        from grpc import aio  # type: ignore[import-untyped, unused-ignore]

        self._channel = aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._call: Any = self._channel.unary_unary(
            _INFER, request_serializer=None, response_deserializer=None
        )
        self._request, self._timeout_s = request, timeout_s

    async def send(self) -> int:
        await self._call(self._request, timeout=self._timeout_s)
        return 1

    async def close(self) -> None:
        await self._channel.close()


class GrpcStreamTransport:
    """``ModelStreamInfer``: one open stream; a request is done at its ``triton_final_response``.

    Counts the responses that carry outputs (the empty final one excluded).
    """

    def __init__(self, target: str, request: bytes) -> None:
        from grpc import aio  # type: ignore[import-untyped, unused-ignore]

        self._channel = aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._open: Any = self._channel.stream_stream(
            _STREAM_INFER, request_serializer=None, response_deserializer=None
        )
        self._stream: Any = None
        self._request = request

    async def send(self) -> int:
        if self._stream is None or self._stream.done():
            self._stream = self._open()
        await self._stream.write(self._request)
        responses = 0
        while True:
            raw = await self._stream.read()
            if not isinstance(raw, bytes):  # the stream ended (grpc.aio.EOF)
                raise RequestFailed("the server closed the stream before the final response")
            message = pb.ModelStreamInferResponse.FromString(raw)
            if message.error_message:  # start afresh: what follows belongs to the failed request
                self._stream.cancel()
                self._stream = None
                raise RequestFailed(message.error_message)
            response = message.infer_response
            if response.outputs:
                responses += 1
            final = response.parameters.get(FINAL_RESPONSE)
            if final is not None and final.bool_param:
                return responses

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        await self._channel.close()
