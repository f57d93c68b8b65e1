"""CPU per gRPC ModelInfer in shoal's own gRPC server, in process, through a loopback socket:
prints figures, asserts nothing.

As ``benchmarks.grpc_native_cpu`` (same server, same cores, same calls), but the connection is
a real one on the event loop's transport (uvloop), fed by a client thread through a loopback
TCP socket: what is timed is the event loop thread's CPU per call (``getrusage`` of the thread:
user and system, so the socket's copies count, the client's do not), with the reads and writes of
the transport, and of the server itself where it reads or writes the socket. The client thread
frames and sends each call whole (HEADERS, the message in DATA frames of ``--frame`` bytes, as
h2load does with 16 KiB), then reads until the call's trailers. The best of ``--rounds``
rounds, in µs.

    .venv/bin/python -m benchmarks.grpc_socket_cpu --bytes 4194304 --calls 30 --arena
    .venv/bin/python -m benchmarks.grpc_socket_cpu --arena --frame 1048576
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import resource
import socket
import threading

import hpack
import uvloop

from benchmarks.grpc_native_cpu import _HEADERS, _call, _message, _server
from shoal.frontends.grpc.servicer import Servicer
from shoal.frontends.h2 import frames as h2

#: A call for the client: (its header block, its stream, the message, the future to set).
_Call = tuple[bytes, int, bytes, "asyncio.Future[None]"]


class _Client(threading.Thread):
    """Sends each call put in :attr:`calls` and reads until its trailers; then sets its future
    on the loop. The call's bytes are framed here, so that the loop's thread does only the
    server's work (and the benchmark's await)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, frame: int) -> None:
        super().__init__(daemon=True)
        self._sock = sock
        self._file = sock.makefile("rb")
        self._loop = loop
        self._frame = frame
        self.calls: queue.Queue[_Call | None] = queue.Queue()

    def run(self) -> None:
        settings = {
            h2.SETTINGS_MAX_FRAME_SIZE: self._frame,
            h2.SETTINGS_INITIAL_WINDOW_SIZE: h2.MAX_WINDOW,
        }
        grow = h2.window_update(0, h2.MAX_WINDOW - h2.DEFAULT_WINDOW)
        self._sock.sendall(h2.PREFACE + h2.settings_frame(settings) + grow)
        while (call := self.calls.get()) is not None:
            block, stream_id, body, done = call
            self._sock.sendall(_call(block, stream_id, body, self._frame))
            self._until_trailers(stream_id)
            self._loop.call_soon_threadsafe(done.set_result, None)

    def _until_trailers(self, stream_id: int) -> None:
        """Read frames until the stream's HEADERS with END_STREAM; answer SETTINGS and PING."""
        while True:
            length, kind, flags, frame_stream = h2.read_header(self._file.read(9), 0)
            payload = self._file.read(length)
            if kind == h2.SETTINGS and not flags & h2.ACK:
                self._sock.sendall(h2.frame(h2.SETTINGS, h2.ACK, 0))
            elif kind == h2.HEADERS and frame_stream == stream_id and flags & h2.END_STREAM:
                return
            del payload


def _thread_cpu() -> tuple[float, float]:
    """The calling thread's user and system CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime, usage.ru_stime


async def _measure(
    size: int, calls: int, frame: int, rounds: int, staged: bool
) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    server = _server(size, staged)
    server._methods = server._method_paths(Servicer(server._core))
    listening = await loop.create_server(server._connection, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    sock = socket.create_connection(("127.0.0.1", port))
    client = _Client(sock, loop, frame)
    client.start()
    encoder, body, stream_id = hpack.Encoder(), _message(size), 1
    best = (float("inf"), 0.0)
    first, repeated = encoder.encode(_HEADERS), encoder.encode(_HEADERS)
    try:
        for round_ in range(rounds + 1):  # the first round warms up
            user, system = _thread_cpu()
            for _ in range(calls):
                done = loop.create_future()
                client.calls.put((first if stream_id == 1 else repeated, stream_id, body, done))
                await done
                stream_id += 2
            if round_:
                user_after, system_after = _thread_cpu()
                spent = (user_after - user, system_after - system)
                best = min(best, spent, key=sum)
    finally:
        client.calls.put(None)
        client.join(timeout=10)
        sock.close()
        listening.close()
    return best[0] * 1e6 / calls, best[1] * 1e6 / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=4 << 20, help="the input tensor's size")
    parser.add_argument("--calls", type=int, default=30, help="calls per round")
    parser.add_argument("--frame", type=int, default=16384, help="DATA frame size, both ways")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--arena", action="store_true", help="a frontend worker's core: inputs staged in its arena"
    )
    args = parser.parse_args(argv)
    measured = _measure(args.bytes, args.calls, args.frame, args.rounds, args.arena)
    user, system = uvloop.run(measured)
    where = ", staged in a worker's arena" if args.arena else ""
    print(
        f"{args.bytes} B, {args.frame} B frames{where}, through a socket: {user + system:,.0f} µs "
        f"CPU of the loop's thread per call (user {user:,.0f}, system {system:,.0f}; best round)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
