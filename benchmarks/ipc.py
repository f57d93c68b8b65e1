"""IPC micro-benchmarks: shoal channels and arenas against the usual Python alternatives.

    python -m benchmarks.ipc [--quick] [--json PATH]

The "supervisor" (this process) runs an asyncio loop, as shoal's does; the "stub" is a child
process that blocks on its receive call. Every transport carries the same MessagePack payload
and every child decodes and re-encodes it, so the transports differ only in how bytes move.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import numpy as np

from shoal.ipc.arena import ArenaMap, Block, OwnedArena
from shoal.ipc.fdpass import recv_fds, send_fds
from shoal.ipc.queue import Channel, PeerGone

TINY = msgpack.packb(["e", 1, {"id": "r-1"}])
MIB = 1 << 20
HANDOFF_WINDOW = 2
FULL = dict(roundtrips=20000, oneway=300000, handoffs={4 * MIB: 400, 64 * MIB: 24}, spin_s=2.0)
QUICK = dict(roundtrips=2000, oneway=30000, handoffs={4 * MIB: 40, 64 * MIB: 8}, spin_s=0.5)

# ----------------------------------------------------------------------------- child side
# Opcodes (first element of the decoded message): "e" echo, "s" sink, "d" done (reply with the
# sink count), "t" tensor at [arena, segment, offset, nbytes]: reply with a checksum.


def _checksum(array: np.ndarray) -> int:
    """A checksum of a few bytes at both ends: a zero-copy read of the shared block."""
    return int(array[:8].sum()) + int(array[-8:].sum())


def _serve(recv: Callable[[], bytes], send: Callable[[bytes], None], arenas: ArenaMap) -> None:
    sunk = 0
    while True:
        op, *rest = msgpack.unpackb(recv())
        if op == "s":
            sunk += 1
        elif op == "e":
            send(msgpack.packb([op, *rest]))
        elif op == "d":
            send(msgpack.packb(["d", sunk]))
            sunk = 0
        elif op == "t":
            view = arenas.view(Block.from_wire(rest[0]))
            send(msgpack.packb(["t", _checksum(np.frombuffer(view, dtype=np.uint8))]))
            view.release()


def _child_shoal(spec: dict[str, Any]) -> None:
    channel = Channel.attach(
        spec["fds"], peer_pidfd=os.pidfd_open(os.getppid()), spin_us=spec["spin_us"]
    )
    sock = socket.socket(fileno=spec["sock"])
    arenas = ArenaMap()
    for _ in range(spec["segments"]):
        header, fds = recv_fds(sock)
        arena_id, index, size = msgpack.unpackb(header)
        arenas.add_fd(arena_id, index, fds[0], size)
    try:
        _serve(channel.recv_down, channel.send_up, arenas)
    except PeerGone:
        pass
    finally:
        arenas.close()
        channel.close()


def _child_socket(spec: dict[str, Any]) -> None:
    sock = socket.socket(fileno=spec["sock"])
    reader = _FrameReader(sock)
    try:
        _serve(reader.read, lambda data: sock.sendall(_frame(data)), ArenaMap())
    except ConnectionError:
        pass


def _child_pipe(conn: Connection) -> None:
    try:
        _serve(conn.recv_bytes, conn.send_bytes, ArenaMap())
    except EOFError:
        pass


def _child_queue(inbox: mp.Queue[Any], outbox: mp.Queue[Any]) -> None:
    while (array := inbox.get()) is not None:
        outbox.put(_checksum(array))


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "little") + data


class _FrameReader:
    """Length-prefixed frames from a blocking stream socket, read in bulk."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def read(self) -> bytes:
        while True:
            frame = self.take()
            if frame is not None:
                return frame
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("peer closed")
            self.feed(chunk)

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk

    def take(self) -> bytes | None:
        if len(self._buf) < 4:
            return None
        end = 4 + int.from_bytes(self._buf[:4], "little")
        if len(self._buf) < end:
            return None
        frame, self._buf = self._buf[4:end], self._buf[end:]
        return frame


# ----------------------------------------------------------------------------- transports
# Each transport offers: send(bytes) without blocking the loop for long, and an awaitable
# reply(); the child is started by the constructor and stopped by close().


class _Transport:
    """Replies arrive through a loop callback into a queue; ``reply()`` awaits the next one."""

    def __init__(self) -> None:
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()

    async def reply(self) -> bytes:
        return await self._replies.get()


class ShoalTransport(_Transport):
    def __init__(self, arena: OwnedArena | None = None, spin_us: float = 50.0) -> None:
        super().__init__()
        self.channel = Channel.create(1 << 20)
        ours, theirs = socket.socketpair()
        segments = arena.segments if arena else []
        spec = {
            "fds": self.channel.child_fds(),
            "sock": theirs.fileno(),
            "segments": len(segments),
            "spin_us": spin_us,
        }
        self.process = _spawn("shoal", spec, [*self.channel.child_fds(), theirs.fileno()])
        theirs.close()
        for segment in segments:
            assert segment.fd is not None
            send_fds(
                ours, msgpack.packb([segment.arena_id, segment.index, segment.size]), [segment.fd]
            )
        ours.close()
        self.channel.watch_up(asyncio.get_running_loop(), self._drain)

    def _drain(self) -> None:
        while (message := self.channel.recv_up_nowait()) is not None:
            self._replies.put_nowait(message)

    async def send(self, data: bytes) -> None:
        if not self.channel.send_down_nowait(data):
            await self.channel.send_down(data)

    def close(self) -> None:
        self.channel.close()
        self.process.wait(10)


class SocketTransport(_Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sock, theirs = socket.socketpair()
        self.process = _spawn("socket", {"sock": theirs.fileno()}, [theirs.fileno()])
        theirs.close()
        self._reader = _FrameReader(self.sock)
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        self._reader.feed(self.sock.recv(1 << 16))
        while (frame := self._reader.take()) is not None:
            self._replies.put_nowait(frame)

    async def send(self, data: bytes) -> None:
        self.sock.sendall(_frame(data))

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()
        self.process.wait(10)


class PipeTransport(_Transport):
    def __init__(self) -> None:
        super().__init__()
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=_child_pipe, args=(theirs,))
        self.process.start()
        theirs.close()
        asyncio.get_running_loop().add_reader(self.conn.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        while self.conn.poll(0):
            self._replies.put_nowait(self.conn.recv_bytes())

    async def send(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.conn.fileno())
        self.conn.close()
        self.process.join(10)


def _spawn(mode: str, spec: dict[str, Any], fds: list[int]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "benchmarks.ipc", "--child", mode, json.dumps(spec)]
    return subprocess.Popen(command, pass_fds=fds)


# ----------------------------------------------------------------------------- measurements


async def roundtrip_us(transport: Any, count: int) -> list[float]:
    samples = []
    for index in range(count + count // 10):
        start = time.perf_counter_ns()
        await transport.send(TINY)
        msgpack.unpackb(await transport.reply())
        if index >= count // 10:  # the first tenth warms up caches and the spin budget
            samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


async def oneway_rate(transport: Any, count: int) -> float:
    message = msgpack.packb(["s", 1, {"id": "r-1"}])
    start = time.perf_counter()
    for _ in range(count):
        await transport.send(message)
    await transport.send(msgpack.packb(["d"]))
    op, sunk = msgpack.unpackb(await transport.reply())
    elapsed = time.perf_counter() - start
    assert (op, sunk) == ("d", count), (op, sunk)
    return count / elapsed


async def handoff_gbps(
    transport: ShoalTransport, arena: OwnedArena, size: int, count: int, window: int
) -> float:
    """Tensors written into the arena and read in place by the stub, ``window`` in flight.

    With window 1 every hand-off waits for the previous reply (latency-bound); a larger window
    is a stream of requests, as a loaded server sees them.
    """
    source = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    expected = _checksum(source)
    in_flight: list[Block] = []

    async def settle() -> None:
        _, checksum = msgpack.unpackb(await transport.reply())
        assert checksum == expected
        arena.free(in_flight.pop(0))

    start = 0.0
    for index in range(count + window):
        if index == window:  # the first window warms the blocks up and is not timed
            while in_flight:
                await settle()
            start = time.perf_counter()
        if len(in_flight) == window:
            await settle()
        block = arena.allocate(size)
        np.copyto(np.frombuffer(arena.view(block), dtype=np.uint8), source)
        await transport.send(msgpack.packb(["t", block.to_wire()]))
        in_flight.append(block)
    while in_flight:
        await settle()
    return count * size / (time.perf_counter() - start) / 1e9


def memcpy_gbps(size: int, n: int) -> float:
    source = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    dest = np.empty_like(source)
    np.copyto(dest, source)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        np.copyto(dest, source)
        times.append(time.perf_counter() - start)
    return size / statistics.median(times) / 1e9


def mp_queue_gbps(size: int, n: int) -> float:
    ctx = mp.get_context("spawn")
    inbox: mp.Queue[Any] = ctx.Queue()
    outbox: mp.Queue[Any] = ctx.Queue()
    process = ctx.Process(target=_child_queue, args=(inbox, outbox))
    process.start()
    source = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    times = []
    for _ in range(n + 1):
        start = time.perf_counter()
        inbox.put(source)
        assert outbox.get() == _checksum(source)
        times.append(time.perf_counter() - start)
    inbox.put(None)
    process.join(10)
    return size / statistics.median(times[1:]) / 1e9


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- report


async def _with(factory: Callable[[], Any], body: Callable[[Any], Awaitable[Any]]) -> Any:
    transport = factory()
    try:
        await roundtrip_us(transport, 10)  # the child has started and answers
        return await body(transport)
    finally:
        transport.close()


async def run(cfg: dict[str, Any]) -> dict[str, float]:
    results: dict[str, float] = {}
    kinds = {"": ShoalTransport, "pipe_": PipeTransport, "socketpair_": SocketTransport}
    for prefix, factory in kinds.items():
        samples = await _with(factory, lambda t: roundtrip_us(t, cfg["roundtrips"]))
        results[f"{prefix}roundtrip_p50_us"] = statistics.median(samples)
        results[f"{prefix}roundtrip_p99_us"] = float(np.percentile(samples, 99))
        rate = await _with(factory, lambda t: oneway_rate(t, cfg["oneway"]))
        results[f"{prefix}oneway_msgs_per_s"] = rate
    for spin in (50.0, 0.0):
        results.update(await _spin_cost(cfg["spin_s"], spin))
    for size, count in cfg["handoffs"].items():
        results.update(await _handoffs(size, count))
    return results


async def _handoffs(size: int, count: int) -> dict[str, float]:
    name = f"{size // MIB}mib"
    # One segment holds every block in flight, so it is announced to the stub up front.
    arena = OwnedArena(1, initial_bytes=HANDOFF_WINDOW * size + MIB, limit_bytes=1 << 30)

    async def both(t: ShoalTransport) -> tuple[float, float]:
        serial = await handoff_gbps(t, arena, size, max(count // 4, 3), 1)
        return serial, await handoff_gbps(t, arena, size, count, HANDOFF_WINDOW)

    try:
        serial, streamed = await _with(lambda: ShoalTransport(arena), both)
    finally:
        arena.close()
    return {
        f"handoff_{name}_gbps": streamed,
        f"handoff_serial_{name}_gbps": serial,
        f"memcpy_{name}_gbps": memcpy_gbps(size, max(count, 20)),
        f"mpqueue_{name}_gbps": mp_queue_gbps(size, max(count // 8, 3)),
    }


async def _spin_cost(seconds: float, spin_us: float) -> dict[str, float]:
    """Round-trip p50 and the stub's CPU use (share of one core) at a given spin budget."""

    async def measure(t: ShoalTransport) -> tuple[list[float], float]:
        samples: list[float] = []
        cpu0, wall0 = cpu_seconds(t.process.pid), time.perf_counter()
        while time.perf_counter() - wall0 < seconds:  # long enough for 10 ms CPU ticks
            samples += await roundtrip_us(t, 1000)
        return samples, (cpu_seconds(t.process.pid) - cpu0) / (time.perf_counter() - wall0)

    samples, cpu = await _with(lambda: ShoalTransport(spin_us=spin_us), measure)
    tag = f"spin{int(spin_us)}"
    return {f"{tag}_roundtrip_p50_us": statistics.median(samples), f"{tag}_stub_cpu": cpu}


HEADERS = (
    ("measure", "shoal channel", "multiprocessing.Pipe", "socketpair + msgpack"),
    (
        "tensor hand-off (GB/s)",
        f"shoal arena, {HANDOFF_WINDOW} in flight",
        "shoal arena, one at a time",
        "NumPy memcpy",
        "multiprocessing.Queue",
    ),
    ("stub spin budget", "round trip p50 (µs)", "stub CPU (share of a core)"),
)
MESSAGE_ROWS = (
    ("tiny round trip p50 (µs)", "roundtrip_p50_us", "{:.1f}"),
    ("tiny round trip p99 (µs)", "roundtrip_p99_us", "{:.1f}"),
    ("one-way rate, busy consumer (msgs/s)", "oneway_msgs_per_s", "{:,.0f}"),
)


def table(r: dict[str, float]) -> str:
    kinds = ("", "pipe_", "socketpair_")
    copies = ("handoff", "handoff_serial", "memcpy", "mpqueue")
    bodies = (
        [[label, *(fmt.format(r[f"{k}{key}"]) for k in kinds)] for label, key, fmt in MESSAGE_ROWS],
        [[f"{n} MiB", *(f"{r[f'{k}_{n}mib_gbps']:.2f}" for k in copies)] for n in (4, 64)],
        [
            [f"{s} µs", f"{r[f'spin{s}_roundtrip_p50_us']:.1f}", f"{r[f'spin{s}_stub_cpu']:.0%}"]
            for s in (50, 0)
        ],
    )
    lines: list[str] = []
    for header, rows in zip(HEADERS, bodies, strict=True):
        lines += ["", "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ipc", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (seconds)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, spec = args.child
        {"shoal": _child_shoal, "socket": _child_socket}[mode](json.loads(spec))
        return
    results = asyncio.run(run(QUICK if args.quick else FULL))
    print(table(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
