"""Channels, arenas and fd passing between two real processes (tests/unit/ipc/peer.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from shoal.ipc.arena import ArenaMap, Block, OwnedArena, Segment
from shoal.ipc.dtypes import DATATYPES
from shoal.ipc.fdpass import recv_fds, send_fds
from shoal.ipc.queue import Channel, PeerGone
from shoal.ipc.tensor import TensorDesc, buffer_to_numpy, numpy_to_buffer_size, write_numpy

from .test_tensor import same_bits, sample

PEER = Path(__file__).with_name("peer.py")
ROOT = Path(__file__).parents[3]
MESSAGES = int(os.environ.get("SHOAL_IPC_TEST_MESSAGES", "1000000"))


@contextmanager
def peer(mode: str, channel: Channel, fds: tuple[int, ...] = (), **spec: Any) -> Iterator[Any]:
    """Run peer.py in ``mode``; on exit close the channel and reap the process."""
    spec["channel"] = channel.child_fds()
    # Prepended, not replaced: the dependencies may live on PYTHONPATH too (a GPU machine's).
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    process = subprocess.Popen(
        [sys.executable, str(PEER), mode, json.dumps(spec)],
        pass_fds=[*channel.child_fds(), *fds],
        env=env,
    )
    try:
        yield process
    finally:
        channel.close()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Inbox:
    """Up messages delivered by watch_up into an asyncio queue, as the supervisor does."""

    def __init__(self, channel: Channel, on_message: Callable[[bytes], None] | None = None):
        self._channel = channel
        self._on_message = on_message
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        channel.watch_up(asyncio.get_running_loop(), self._drain)

    def _drain(self) -> None:
        while (message := self._channel.recv_up_nowait()) is not None:
            if self._on_message is None:
                self.queue.put_nowait(message)
            else:
                self._on_message(message)

    async def get(self, timeout: float = 30) -> bytes:
        return await asyncio.wait_for(self.queue.get(), timeout)


async def send_all(channel: Channel, count: int, pad: bytes = b"") -> bool:
    """Send 0..count-1; True when the ring was ever full (the sender had to wait)."""
    waited = False
    for index in range(count):
        message = index.to_bytes(8, "little") + pad
        if not channel.send_down_nowait(message):
            waited = True
            await channel.send_down(message)
    return waited


@pytest.mark.timeout(120)
def test_down_ordering_over_many_messages() -> None:
    channel = Channel.create(1 << 16)
    with peer("sink", channel, count=MESSAGES):

        async def scenario() -> bytes:
            inbox = Inbox(channel)
            await send_all(channel, MESSAGES)
            return await inbox.get(60)

        assert asyncio.run(scenario()) == f"ok {MESSAGES}".encode()


@pytest.mark.timeout(120)
def test_up_ordering_over_many_messages() -> None:
    channel = Channel.create(1 << 16)
    with peer("source", channel, count=MESSAGES):

        async def scenario() -> int:
            received = 0
            done = asyncio.get_running_loop().create_future()

            def check(message: bytes) -> None:
                nonlocal received
                assert int.from_bytes(message, "little") == received
                received += 1
                if received == MESSAGES:
                    done.set_result(None)

            Inbox(channel, check)
            await asyncio.wait_for(done, 60)
            return received

        assert asyncio.run(scenario()) == MESSAGES


def test_back_pressure_with_a_slow_consumer() -> None:
    channel = Channel.create(4096)
    count = 3000
    with peer("sink", channel, count=count, slow=300):

        async def scenario() -> tuple[bool, bytes]:
            inbox = Inbox(channel)
            waited = await send_all(channel, count, pad=bytes(200))
            return waited, await inbox.get()

        waited, result = asyncio.run(scenario())
    assert waited, "a 4 KiB ring cannot hold 3000 messages of 208 bytes"
    assert result == f"ok {count}".encode()


def test_up_back_pressure_when_the_supervisor_reads_late() -> None:
    channel = Channel.create(4096)
    count = 2000  # ~100 ring-fulls: the stub blocks in send_up until we drain
    with peer("source", channel, count=count, pad=200):

        async def scenario() -> list[int]:
            inbox = Inbox(channel)
            received = []
            for _ in range(count):
                received.append(int.from_bytes((await inbox.get())[:8], "little"))
                if len(received) % 200 == 0:
                    await asyncio.sleep(0.01)  # a slow consumer, not a readiness wait
            return received

        assert asyncio.run(scenario()) == list(range(count))


class SupervisorSide:
    """Our input arena, announced to the peer over the socket, and the peer's output arena."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.announced: list[Segment] = []
        self.arena = OwnedArena(
            1,
            initial_bytes=1 << 16,
            growth_bytes=1 << 20,
            limit_bytes=1 << 26,
            on_new_segment=self.announced.append,
        )
        self.outputs = ArenaMap()

    def send_tensor(self, channel: Channel, desc_array: tuple[str, np.ndarray]) -> None:
        datatype, array = desc_array
        block = self.arena.allocate(numpy_to_buffer_size(array, datatype))
        write_numpy(array, datatype, self.arena.view(block))
        new = [[s.arena_id, s.index, s.size] for s in self.announced]
        for segment in self.announced:
            assert segment.fd is not None
            send_fds(
                self.sock,
                msgpack.packb([segment.arena_id, segment.index, segment.size]),
                [segment.fd],
            )
        self.announced.clear()
        desc = TensorDesc(f"T_{datatype}", datatype, array.shape, block)
        message = {"tensor": desc.to_wire(), "new_segments": new}
        assert channel.send_down_nowait(msgpack.packb(message))

    def receive_tensor(self, reply: bytes) -> np.ndarray:
        answer = msgpack.unpackb(reply)
        self.arena.free(TensorDesc.from_wire(answer["release"]).location)  # type: ignore[arg-type]
        desc = TensorDesc.from_wire(answer["tensor"])
        assert isinstance(desc.location, Block)
        while not self.outputs.has(desc.location.arena_id, desc.location.segment):
            header, fds = recv_fds(self.sock)
            index, size = msgpack.unpackb(header)
            self.outputs.add_fd(desc.location.arena_id, index, fds[0], size)
        return buffer_to_numpy(desc.datatype, desc.shape, self.outputs.view(desc.location))

    def close(self) -> None:
        self.outputs.close()
        self.arena.close()
        self.sock.close()


def test_tensors_of_every_datatype_round_trip_bit_exact() -> None:
    ours, theirs = socket.socketpair()
    channel = Channel.create(1 << 16)
    side = SupervisorSide(ours)
    cases = [
        (dt, sample(dt, shape, seed))
        for seed, dt in enumerate(DATATYPES)
        for shape in [(), (0,), (7, 3)]
    ]
    cases.append(("FP32", sample("FP32", (512, 1024))))  # 2 MiB: forces growth in both arenas
    try:
        with peer("tensors", channel, fds=(theirs.fileno(),), sock=theirs.fileno()):
            theirs.close()

            async def scenario() -> None:
                inbox = Inbox(channel)
                for case in cases:
                    side.send_tensor(channel, case)
                    back = side.receive_tensor(await inbox.get())
                    assert same_bits(back, case[1]), case[0]

            asyncio.run(scenario())
    finally:
        side.close()
        theirs.close()
    assert side.arena.used_bytes == 0


def held_segments(pid: int, arena_id: int) -> set[tuple[str, int]]:
    """("map" | "fd", segment) for each segment of ``arena_id`` that ``pid`` maps or holds."""
    name = re.compile(rf"memfd:shoal-arena-{arena_id}-(\d+)")
    held = set()
    with open(f"/proc/{pid}/maps") as maps:
        held |= {("map", int(m[1])) for line in maps if (m := name.search(line))}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if m := name.search(os.readlink(f"/proc/{pid}/fd/{fd}")):
                held.add(("fd", int(m[1])))
    return held


def test_peer_unmaps_and_closes_retired_segments() -> None:
    """Another process drops a retired segment: its mapping and its fd (memfd pages live while
    either does), checked in /proc/<pid>/maps and /proc/<pid>/fd."""
    ours, theirs = socket.socketpair()
    channel = Channel.create(1 << 16)
    retired: list[Segment] = []
    arena = OwnedArena(
        21,
        initial_bytes=1 << 16,
        growth_bytes=1 << 16,
        limit_bytes=1 << 20,
        retire_after=0.0,
        on_retired_segment=retired.append,
    )
    try:
        with peer("mapper", channel, fds=(theirs.fileno(),), sock=theirs.fileno()) as process:
            theirs.close()

            async def scenario() -> None:
                inbox = Inbox(channel)

                async def ask(op: str, index: int) -> None:
                    assert channel.send_down_nowait(msgpack.packb([op, 21, index]))
                    assert await inbox.get() == op.encode()

                blocks = [arena.allocate(1 << 16) for _ in range(3)]  # segments 0, 1, 2
                for segment in arena.segments:
                    assert segment.fd is not None
                    send_fds(ours, msgpack.packb(segment.size), [segment.fd])
                    await ask("add", segment.index)
                await ask("map", 0)
                await ask("map", 1)
                # (A mapping made by Python's mmap keeps its own duplicate of the fd.)
                mapped = {("map", 0), ("fd", 0), ("map", 1), ("fd", 1)}
                assert held_segments(process.pid, 21) == {*mapped, ("fd", 2)}
                arena.free(blocks[1])
                arena.free(blocks[2])
                assert [s.index for s in retired] == [1, 2]
                for segment in retired:
                    await ask("retire", segment.index)
                assert held_segments(process.pid, 21) == {("map", 0), ("fd", 0)}
                assert not {s for s in held_segments(os.getpid(), 21) if s[1] != 0}

            asyncio.run(scenario())
    finally:
        arena.close()
        ours.close()
        theirs.close()


def test_killed_stub_makes_a_blocked_send_raise_peer_gone() -> None:
    channel = Channel.create(4096)
    with peer("stall", channel) as process:
        pidfd = os.pidfd_open(process.pid)

        async def scenario() -> None:
            loop = asyncio.get_running_loop()
            inbox = Inbox(channel)
            await channel.send_down(b"first")
            assert await inbox.get() == b"stalled"
            loop.add_reader(pidfd, channel.mark_peer_dead)  # what the supervisor's watcher does
            try:
                while channel.send_down_nowait(bytes(100)):
                    pass
                blocked = asyncio.ensure_future(channel.send_down(bytes(100)))
                await asyncio.sleep(0)
                os.kill(process.pid, signal.SIGKILL)
                with pytest.raises(PeerGone):
                    await asyncio.wait_for(blocked, 10)
            finally:
                loop.remove_reader(pidfd)

        try:
            asyncio.run(scenario())
        finally:
            os.close(pidfd)


def test_killed_supervisor_makes_the_stub_raise_peer_gone() -> None:
    read_end, write_end = os.pipe()
    channel = Channel.create(4096)
    with os.fdopen(read_end) as report:
        try:
            with peer("relay", channel, fds=(write_end,), report=write_end) as relay:
                os.close(write_end)
                write_end = -1
                assert wait_line(report) == "streaming"
                os.kill(relay.pid, signal.SIGKILL)
                assert wait_line(report) == "PeerGone"
        finally:
            if write_end >= 0:
                os.close(write_end)


def wait_line(stream: Any, timeout: float = 20) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "the peer reported nothing"
    return str(stream.readline()).strip()
