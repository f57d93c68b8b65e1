"""CPU per gRPC ModelInfer in shoal's own gRPC server, in-process: prints figures, asserts nothing.

The server's HTTP/2 connection is fed the bytes of whole calls (HEADERS, then the message in
DATA frames of ``--frame`` bytes, handed over in reads of 256 KiB, each a new bytes object as a
socket read makes) and writes to a transport that takes everything at once; the core is an echo
that copies each input into a fixed buffer, as a stub writes its arena. What is timed is the
process CPU of the calls: framing, messages, protobuf and the reply, with no socket, no other
process and no client. The best of ``--rounds`` rounds, in µs per call. With ``--arena`` the
core is a frontend worker's: inputs placed in its input arena (received there, on a tree that
does), replies written from that block. With ``--lent`` the bytes go in as a transport reads
them: written into the buffer the connection lends for each read (``get_buffer``, up to 256 KiB
into its read buffer, or what it lends of a place a large frame's payload goes straight into),
then ``buffer_updated``; the write stands for the kernel's copy, the same in every tree.

    .venv/bin/python -m benchmarks.grpc_native_cpu --bytes 4194304 --calls 30
    .venv/bin/python -m benchmarks.grpc_native_cpu --bytes 64 --calls 3000
    .venv/bin/python -m benchmarks.grpc_native_cpu --arena --lent --frame 1048576

Under callgrind (exact on a loaded machine), a small call's instructions: each run makes
``2 * --calls`` calls (the warm-up round and one timed with ``--rounds 1``), so
(total(3000) - total(300)) / 5400 is one call's, the benchmark's loop included:

    valgrind --tool=callgrind python -m benchmarks.grpc_native_cpu --bytes 64 --calls N \
        --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import socket
import time
from typing import Any

import hpack
import numpy as np
import uvloop

from shoal.core import InferOutput, InferRequest, InferResponse
from shoal.frontends.grpc.native import NativeGrpcServer
from shoal.frontends.grpc.servicer import Servicer
from shoal.frontends.h2 import frames as h2
from shoal.frontends.workers.arenas import StagingArena
from shoal.ipc.arena import Block
from shoal.protos import grpc_service_pb2 as pb

_READ = 256 * 1024
_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:8001"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


class _EchoCore:
    """Each input copied into one buffer that stands for the stub's arena."""

    def __init__(self, size: int) -> None:
        self._arena = bytearray(size)

    async def infer(self, request: InferRequest) -> InferResponse:
        outputs = []
        for tensor in request.inputs:
            size = memoryview(tensor.data).nbytes
            self._arena[:size] = tensor.data
            view = memoryview(self._arena)[:size]
            outputs.append(InferOutput("OUTPUT0", tensor.datatype, tensor.shape, view))
        return InferResponse(request.model_name, "1", request.id, outputs)


class _StagingCore:
    """A frontend worker's core (``--arena``): each input placed in the worker's input arena
    (a copy, unless it was received there), answered from that block (an identity model's
    output read in place), the block given back once the reply is written."""

    def __init__(self, arena: StagingArena) -> None:
        self._arena = arena

    async def infer(self, request: InferRequest) -> InferResponse:
        outputs = []
        blocks = []
        for tensor in request.inputs:
            block = self._arena.place(memoryview(tensor.data))
            if block is None:  # small: it travels inline, as a copy
                view = memoryview(bytes(tensor.data))
            else:
                blocks.append(block)
                view = self._arena.arena.view(block)
            outputs.append(InferOutput("OUTPUT0", tensor.datatype, tensor.shape, view))
        release = functools.partial(self._free, blocks)
        return InferResponse(request.model_name, "1", request.id, outputs, _release=release)

    def _free(self, blocks: list[Block]) -> None:
        for block in blocks:
            self._arena.free([block.segment, block.offset, block.nbytes])


def _server(size: int, staged: bool) -> NativeGrpcServer:
    if not staged:
        return NativeGrpcServer(_EchoCore(max(size, 64)))  # type: ignore[arg-type]
    ours, _theirs = socket.socketpair()
    _KEEP.append(_theirs)
    arena = StagingArena(
        1 << 32,
        ours,
        initial_bytes=64 << 20,
        growth_bytes=64 << 20,
        limit_bytes=256 << 20,
        on_retired=lambda index: None,
    )
    core = _StagingCore(arena)
    try:  # a tree that receives into the arena
        return NativeGrpcServer(core, receive_into=arena)  # type: ignore[arg-type, call-arg, unused-ignore]
    except TypeError:
        return NativeGrpcServer(core)  # type: ignore[arg-type]


_KEEP: list[socket.socket] = []


class _CountingTransport:
    """A transport that takes every byte at once."""

    written = 0

    def writelines(self, pieces: list[Any]) -> None:
        self.written += sum(memoryview(piece).nbytes for piece in pieces)

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def _message(size: int) -> bytes:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, size // 4])
    request.outputs.add(name="OUTPUT0")
    request.raw_input_contents.append(np.ones(size // 4, np.float32).tobytes())
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _call(block: bytes, stream_id: int, body: bytes, frame: int) -> bytes:
    out = [h2.frame_header(h2.HEADERS, h2.END_HEADERS, stream_id, len(block)), block]
    for offset in range(0, len(body), frame):
        chunk = body[offset : offset + frame]
        flags = h2.END_STREAM if offset + frame >= len(body) else 0
        out += [h2.frame_header(h2.DATA, flags, stream_id, len(chunk)), chunk]
    return b"".join(out)


def _lent_reads(connection: Any, wire: bytes) -> None:
    """``wire`` read as a transport reads it: into what the connection lends, read by read."""
    view, at = memoryview(wire), 0
    while at < len(wire):
        buffer = connection.get_buffer(-1)
        size = min(len(buffer), len(wire) - at)
        buffer[:size] = view[at : at + size]
        at += size
        connection.buffer_updated(size)


async def _measure(
    size: int, calls: int, frame: int, rounds: int, staged: bool, lent: bool = False
) -> float:
    server = _server(size, staged)
    server._methods = server._method_paths(Servicer(server._core))
    connection = server._connection()
    connection.connection_made(_CountingTransport())  # type: ignore[arg-type]
    settings = {h2.SETTINGS_MAX_FRAME_SIZE: frame, h2.SETTINGS_INITIAL_WINDOW_SIZE: h2.MAX_WINDOW}
    grow = h2.window_update(0, h2.MAX_WINDOW - h2.DEFAULT_WINDOW)
    connection.data_received(h2.PREFACE + h2.settings_frame(settings) + grow)
    # As a client's encoder does: the first call's block indexes the headers, later ones
    # refer to them (the same few bytes on every call).
    encoder, body, stream_id, best = hpack.Encoder(), _message(size), 1, float("inf")
    first, repeated = encoder.encode(_HEADERS), encoder.encode(_HEADERS)
    for round_ in range(rounds + 1):  # the first round warms up
        ids = range(stream_id, stream_id + 2 * calls, 2)
        wires = [_call(first if i == 1 else repeated, i, body, frame) for i in ids]
        started = time.process_time()
        for wire in wires:
            if lent:
                _lent_reads(connection, wire)
            for offset in range(0, 0 if lent else len(wire), _READ):
                connection.data_received(wire[offset : offset + _READ])
            while stream_id in connection._streams:
                await asyncio.sleep(0)
            stream_id += 2
            await asyncio.sleep(0)  # the release after the write
        if round_:
            best = min(best, time.process_time() - started)
    return best * 1e6 / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=4 << 20, help="the input tensor's size")
    parser.add_argument("--calls", type=int, default=30, help="calls per round")
    parser.add_argument("--frame", type=int, default=16384, help="DATA frame size, both ways")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--arena", action="store_true", help="a frontend worker's core: inputs staged in its arena"
    )
    parser.add_argument(
        "--lent", action="store_true", help="read into the buffers the connection lends"
    )
    args = parser.parse_args(argv)
    measured = _measure(args.bytes, args.calls, args.frame, args.rounds, args.arena, args.lent)
    per_call = uvloop.run(measured)
    where = ", staged in a worker's arena" if args.arena else ""
    print(
        f"{args.bytes} B, {args.frame} B frames{where}: {per_call:,.0f} µs CPU per call "
        "(best round)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
