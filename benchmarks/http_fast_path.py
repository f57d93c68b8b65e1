"""The HTTP frontend's own CPU per small infer request, in one process: what a frontend worker
spends on a request besides its link to the core.

    .venv/bin/python -m benchmarks.http_fast_path [--requests 5000] [--rounds 3] [--body binary]
        [--bytes 64]

Serves ``build_http_app`` with :class:`~shoal.frontends.http.app.HttpServer` (uvicorn and the
fast path, as a worker does) over an echo core that answers on the spot (its inputs as its
outputs, no other process), and drives it on the same event loop from one keep-alive loopback
connection, one request at a time: the FP32 tensor ``identity_fp32`` takes (``--bytes``, 64 by
default; 65536 and 4194304 for the large cells), as a
binary input with a binary output (``--body binary``, tritonclient's and perf_analyzer's way)
or as JSON both ways (``--body json``). The client's share (a write, a read, finding the
response's end) is a constant: comparing two trees, the difference is the server's. Under
callgrind (BRIEF's method), (total(3000) - total(300)) / 2700 is a request's instructions:

    valgrind --tool=callgrind python -m benchmarks.http_fast_path --requests 3000 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop

from shoal.core import InferOutput, InferRequest, InferResponse
from shoal.frontends.http import _json
from shoal.frontends.http.app import HttpServer, build_http_app

_MODEL = "identity_fp32"
_PATTERN = bytes(range(64))


class _EchoCore:
    """Answers each request at once with its inputs as outputs (bytes copied, as a core's
    answer arrives in fresh memory); live and ready, as the app's health routes ask."""

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """Read by the endpoint at its start (a raw binary request's config): none here."""
        return {}

    def frontend_trace(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        """Never called: nothing is traced here."""

    async def infer(self, request: InferRequest) -> InferResponse:
        outputs = [
            InferOutput("OUTPUT0", tensor.datatype, tensor.shape, _copy(tensor.data))
            for tensor in request.inputs
        ]
        return InferResponse(request.model_name, "1", request.id, outputs)


def _copy(data: Any) -> memoryview:
    return memoryview(bytes(memoryview(data)))  # a JSON input is a NumPy array: its bytes


def _request(body_kind: str, size: int) -> bytes:
    """The whole HTTP request, framed once."""
    count = size // 4
    tensor: dict[str, Any] = {"name": "INPUT0", "datatype": "FP32", "shape": [1, count]}
    extra = ""
    if body_kind == "binary":
        data = _PATTERN * (count * 4 // len(_PATTERN)) + _PATTERN[: count * 4 % len(_PATTERN)]
        tensor["parameters"] = {"binary_data_size": len(data)}
        output = {"name": "OUTPUT0", "parameters": {"binary_data": True}}
        header = _json.dumps({"inputs": [tensor], "outputs": [output]})
        body = header + data
        extra = f"Inference-Header-Content-Length: {len(header)}\r\n"
    else:
        tensor["data"] = [0.5] * count
        body = _json.dumps({"inputs": [tensor]})
    head = (
        f"POST /v2/models/{_MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/octet-stream\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    start = head.index(b"content-length: ") + len(b"content-length: ")
    length = int(head[start : head.index(b"\r\n", start)])
    await reader.readexactly(length)
    return int(head[9:12])


async def _run(requests: int, rounds: int, body_kind: str, size: int) -> list[float]:
    server = HttpServer(build_http_app(_EchoCore()))  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = _request(body_kind, size)
    try:
        if await _exchange(reader, writer, raw) != 200:
            raise SystemExit("the echo server refused the request")
        samples = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(requests):
                await _exchange(reader, writer, raw)
            samples.append((time.process_time() - started) * 1e6 / requests)
        return samples
    finally:
        writer.close()
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body", choices=("binary", "json"), default="binary")
    parser.add_argument("--bytes", type=int, default=64, help="the tensor's bytes")
    args = parser.parse_args()
    samples = uvloop.run(_run(args.requests, args.rounds, args.body, args.bytes))
    print(
        f"{args.body} {args.bytes} B: {statistics.median(samples):.1f} CPU µs per request "
        "(client and server, one process)"
    )


if __name__ == "__main__":
    main()
