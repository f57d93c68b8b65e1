"""What one gRPC ModelInfer costs the supervisor, piece by piece: prints figures, asserts nothing.

* ``frontend``: shoal's own Python per 64 B identity request (decode the request, encode the
  response, wrap it for a stream), timed in-process: the minimum over repeats, in µs.
* ``floor``: a bare server with a handler that returns a constant, driven by ``h2load``
  (8 connections, as ``shoal perf --client h2load``): the server's CPU time per call, in µs.
  This is what a Python gRPC server pays before shoal runs a line. ``native`` is shoal's own
  HTTP/2 framing (``shoal/frontends/h2/connection.py``, what ``shoal serve`` uses); ``aio`` is
  grpcio's asyncio server (``--grpc-server grpcio``); ``sync`` is grpcio's thread-pool server.

    .venv/bin/python -m benchmarks.grpc_costs                # both parts
    .venv/bin/python -m benchmarks.grpc_costs frontend       # no h2load needed

Results and how to read them: benchmarks/results/grpc_perf.md.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import struct
import sys
import tempfile
import timeit
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import numpy as np
import uvloop

from shoal.core import InferOutput, InferResponse
from shoal.frontends.grpc._infer import (
    decode_infer_request,
    encode_infer_response,
    stream_response_chunks,
)
from shoal.frontends.h2.connection import Http2Connection
from shoal.frontends.h2.frames import GRPC_RESPONSE_HEADERS, literal
from shoal.protos import grpc_service_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
REPLY = pb.ModelInferResponse(model_name="identity_fp32").SerializeToString()
_FRAMED_REPLY = struct.pack(">BI", 0, len(REPLY)) + REPLY
_OK_TRAILERS = literal(b"grpc-status", b"0")


def _request() -> bytes:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, 16])
    request.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return request.SerializeToString()


def frontend() -> list[tuple[str, float]]:
    data = _request()
    decoded = decode_infer_request(data)
    payload = memoryview(np.arange(16, dtype=np.float32).tobytes())

    def response() -> InferResponse:
        return InferResponse(
            "identity_fp32", "1", "", [InferOutput("OUTPUT0", "FP32", (1, 16), payload)]
        )

    steps: list[tuple[str, Callable[[], object]]] = [
        ("decode ModelInferRequest", lambda: decode_infer_request(data)),
        ("encode ModelInferResponse", lambda: b"".join(encode_infer_response(response(), decoded))),
        (
            "encode ModelStreamInferResponse",
            lambda: b"".join(stream_response_chunks(encode_infer_response(response(), decoded))),
        ),
    ]
    return [
        (name, min(timeit.repeat(step, number=20000, repeat=7)) / 20000 * 1e6)
        for name, step in steps
    ]


async def _aio_server() -> tuple[Any, int]:
    async def handle(request: bytes, context: Any) -> bytes:
        return REPLY

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.unary_unary_rpc_method_handler(handle)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


class _ConstantCall:
    """A call of the native floor server: answers REPLY once the request has arrived."""

    def __init__(self, connection: Any, stream_id: int) -> None:
        self._connection = connection
        self._stream_id = stream_id

    def data_received(self, pieces: list[memoryview], end_stream: bool) -> None:
        if end_stream:
            self.trailers_received()

    def trailers_received(self) -> None:
        self._connection.send_headers(self._stream_id, GRPC_RESPONSE_HEADERS)
        self._connection.send_data(self._stream_id, _FRAMED_REPLY)
        self._connection.send_headers(self._stream_id, _OK_TRAILERS, end_stream=True)

    def reset(self) -> None:
        pass


async def _native_server() -> tuple[Any, int]:
    def open_stream(connection: Any, stream_id: int, headers: Any, end_stream: bool) -> Any:
        call = _ConstantCall(connection, stream_id)
        if end_stream:
            call.trailers_received()
        return call

    connections: set[Http2Connection] = set()

    def protocol() -> Http2Connection:
        connection = Http2Connection(open_stream, connections.discard)
        connections.add(connection)
        return connection

    server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _sync_server() -> tuple[Any, int]:
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.so_reuseport", 0)])
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: REPLY)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


async def _h2load(h2load: str, port: int, body: str, seconds: float) -> int:
    args = [h2load, "-c", "8", "-m", "1", "-t", "1", "-D", f"{round(seconds * 1000)}ms"]
    args += ["-d", body, "-H", "content-type: application/grpc", "-H", "te: trailers"]
    args += [f"http://127.0.0.1:{port}/{SERVICE}/ModelInfer"]
    process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    found = re.search(rb"(\d+) succeeded", out)
    return int(found.group(1)) if found else 0


async def _floor(kind: str, h2load: str, body: str, seconds: float) -> tuple[float, float, int]:
    """(user, system) CPU µs per call of this process, and the calls counted."""
    if kind == "native":
        server, port = await _native_server()
    elif kind == "aio":
        server, port = await _aio_server()
    else:
        server, port = _sync_server()
    try:
        await _h2load(h2load, port, body, 1.0)  # warm-up
        before = os.times()
        calls = await _h2load(h2load, port, body, seconds)
        after = os.times()
    finally:
        if kind == "native":
            server.close()
        else:
            stopped = server.stop(None)
            if kind == "aio":
                await stopped
    calls = max(calls, 1)
    return (
        (after.user - before.user) / calls * 1e6,
        (after.system - before.system) / calls * 1e6,
        calls,
    )


def floor(seconds: float = 5.0) -> list[tuple[str, float, float, int]]:
    h2load = shutil.which("h2load")
    if h2load is None:
        print("h2load is not installed (apt-get install nghttp2-client): no floor figures")
        return []
    with tempfile.TemporaryDirectory(prefix="shoal-grpc-costs-") as folder:
        body = os.path.join(folder, "body")
        message = _request()
        with open(body, "wb") as file:
            file.write(struct.pack(">BI", 0, len(message)) + message)
        rows = []
        for kind in ("native", "aio", "sync"):
            user, system, calls = uvloop.run(_floor(kind, h2load, body, seconds))
            rows.append((kind, user, system, calls))
        return rows


def main() -> None:
    parts = sys.argv[1:] or ["frontend", "floor"]
    if "frontend" in parts:
        print("| shoal frontend step (64 B identity) | µs |\n|---|---:|")
        for name, micros in frontend():
            print(f"| {name} | {micros:.2f} |")
    if "floor" in parts:
        print("\n| bare grpc server (h2load c=8) | user µs/call | system µs/call | calls |")
        print("|---|---:|---:|---:|")
        for kind, user, system, calls in floor():
            print(f"| {kind} | {user:.0f} | {system:.0f} | {calls:,} |")


if __name__ == "__main__":
    main()
