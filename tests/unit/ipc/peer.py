"""The other process of the two-process IPC tests: ``python peer.py MODE SPEC_JSON``.

SPEC holds the inherited fd numbers (``channel``: the five channel fds, optionally ``sock``: a
Unix socket, ``report``: a pipe to write one status line to) and mode arguments. Every mode ends
when the channel reports PeerGone.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import msgpack

from shoal.ipc.arena import ArenaMap, OwnedArena
from shoal.ipc.fdpass import recv_fds, send_fds
from shoal.ipc.queue import Channel, PeerGone
from shoal.ipc.tensor import TensorDesc, buffer_to_numpy, numpy_to_buffer_size, write_numpy


def attach(spec: dict[str, Any]) -> Channel:
    return Channel.attach(spec["channel"], peer_pidfd=os.pidfd_open(os.getppid()))


def echo(channel: Channel, spec: dict[str, Any]) -> None:
    while True:
        channel.send_up(channel.recv_down())


def sink(channel: Channel, spec: dict[str, Any]) -> None:
    """Check that messages carry 0, 1, 2, ... (8 bytes each, then padding); report the count."""
    expected = 0
    slow = spec.get("slow", 0)
    recv = channel.recv_down
    while expected < spec["count"]:
        got = int.from_bytes(recv()[:8], "little")
        if got != expected:
            channel.send_up(f"out of order: expected {expected}, got {got}".encode())
            return
        expected += 1
        if expected < slow:
            time.sleep(0.0002)
    channel.send_up(f"ok {expected}".encode())
    channel.recv_down()


def source(channel: Channel, spec: dict[str, Any]) -> None:
    """Send ``count`` messages carrying 0, 1, 2, ... as 8 bytes plus ``pad`` bytes."""
    pad = bytes(spec.get("pad", 0))
    send = channel.send_up
    for index in range(spec["count"]):
        send(index.to_bytes(8, "little") + pad, 60)
    channel.recv_down()


def tensors(channel: Channel, spec: dict[str, Any]) -> None:
    """Map the supervisor's input arena, copy each tensor into our own output arena, reply."""
    sock = socket.socket(fileno=spec["sock"])
    peer = ArenaMap()

    def announce(segment: Any) -> None:
        send_fds(sock, msgpack.packb([segment.index, segment.size]), [segment.fd])

    out = OwnedArena(
        9, initial_bytes=1 << 16, growth_bytes=1 << 16, limit_bytes=1 << 26, on_new_segment=announce
    )
    try:
        while True:
            message = msgpack.unpackb(channel.recv_down())
            for arena_id, index, size in message["new_segments"]:
                header, fds = recv_fds(sock)
                assert msgpack.unpackb(header) == [arena_id, index, size]
                peer.add_fd(arena_id, index, fds[0], size)
            desc = TensorDesc.from_wire(message["tensor"])
            array = buffer_to_numpy(desc.datatype, desc.shape, peer.view(desc.location))
            block = out.allocate(numpy_to_buffer_size(array, desc.datatype))
            write_numpy(array, desc.datatype, out.view(block))
            reply = TensorDesc(desc.name, desc.datatype, desc.shape, block)
            channel.send_up(
                msgpack.packb({"tensor": reply.to_wire(), "release": message["tensor"]})
            )
    finally:
        out.close()
        peer.close()
        sock.close()


def mapper(channel: Channel, spec: dict[str, Any]) -> None:
    """Hold segments the way a stub holds another process's: ``["add", arena, segment]`` takes
    the fd waiting on the socket, ``["map", arena, segment]`` maps it, ``["retire", arena,
    segment]`` drops it; each is answered with its name once done."""
    sock = socket.socket(fileno=spec["sock"])
    peer = ArenaMap()
    try:
        while True:
            op, arena_id, index = msgpack.unpackb(channel.recv_down())
            if op == "add":
                header, fds = recv_fds(sock)
                peer.add_fd(arena_id, index, fds[0], msgpack.unpackb(header))
            elif op == "map":
                peer.segment(arena_id, index)
            else:
                peer.retire(arena_id, index)
            channel.send_up(op.encode())
    finally:
        peer.close()
        sock.close()


def stall(channel: Channel, spec: dict[str, Any]) -> None:
    """Read one message, report it, then stop reading (the test kills us)."""
    channel.recv_down()
    channel.send_up(b"stalled")
    while True:
        time.sleep(60)


def relay(channel: Channel, spec: dict[str, Any]) -> None:
    """Act as a supervisor: spawn a 'watch' grandchild and stream to it until killed."""
    own = Channel.create(1 << 14)
    child_spec = {"channel": own.child_fds(), "report": spec["report"]}
    subprocess.Popen(
        [sys.executable, __file__, "watch", json.dumps(child_spec)],
        pass_fds=[*own.child_fds(), spec["report"]],
    )

    async def stream() -> None:
        while True:
            await own.send_down(bytes(100))

    asyncio.run(stream())


def watch(channel: Channel, spec: dict[str, Any]) -> None:
    """Consume from a relay; report 'streaming' once, then how the stream ended."""
    report = os.fdopen(spec["report"], "w", buffering=1)
    channel.recv_down()
    report.write("streaming\n")
    try:
        while True:
            channel.recv_down(timeout=30)
    except PeerGone:
        report.write("PeerGone\n")
    except TimeoutError:
        report.write("hung\n")


MODES = {f.__name__: f for f in (echo, sink, source, tensors, mapper, stall, relay, watch)}


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1` prints where a hung peer is
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    channel = attach(spec)
    try:
        MODES[mode](channel, spec)
    except PeerGone:
        pass
    finally:
        channel.close()


if __name__ == "__main__":
    main()
