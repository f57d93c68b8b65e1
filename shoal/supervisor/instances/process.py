"""One running stub process: spawn, channel, sockets, output mappings and exit watching."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgpack

from shoal.ipc import messages as msg
from shoal.ipc._alloc import split_key
from shoal.ipc.arena import ArenaMap, Block, Segment
from shoal.ipc.fdpass import PeerGone, readable_now, recv_fds, send_fds
from shoal.ipc.queue import Channel
from shoal.ipc.tensor import CudaLocation, Location
from shoal.supervisor.instances.channel import Tensors

log = logging.getLogger("shoal.stub")


@dataclass(frozen=True)
class StubLaunch:
    """What a stub process needs to start."""

    instance_name: str
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    ring_bytes: int = 1 << 20


def describe_exit(returncode: int) -> str:
    """'exit code 3' or 'signal 9 (SIGKILL)'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


def _socket_pair(channel: Channel) -> tuple[socket.socket, socket.socket]:
    """The supervisor's and the stub's ends of its socket; with no descriptor left, the
    channel's go back."""
    try:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except BaseException:
        channel.close()
        raise


class StubProcess:
    """A spawned ``python -m shoal.stub``; the owner drives it with messages (the shared-memory
    kind of :class:`~shoal.supervisor.instances.channel.StubChannel`)."""

    def __init__(self, launch: StubLaunch, output_arena_id: int) -> None:
        self.launch, self.output_arena_id = launch, output_arena_id
        self.channel = Channel.create(launch.ring_bytes)
        self.sock, self._child_sock = _socket_pair(self.channel)
        self.outputs = ArenaMap()
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._pipes: list[int] = []
        self._partial: dict[int, bytes] = {}
        self._stderr_fd = -1
        #: Segments of other arenas this stub has been given (it owns its output arena's), and
        #: CUDA pool chunks (device, chunk) whose IPC handle it has been given.
        self.announced: set[tuple[int, int]] = set()
        self.cuda_chunks: set[tuple[int, int]] = set()
        #: Duplicates of this stub's output-segment fds, kept to forward them to other stubs.
        self._segment_fds: dict[tuple[int, int], tuple[int, int]] = {}
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else -1

    @property
    def spawned(self) -> bool:
        """A process was started (spawning can fail: no descriptor or memory left)."""
        return self._proc is not None

    def announce(self, segment: Segment) -> None:
        """Hand one input-arena segment to the stub (before any message refers to it)."""
        assert segment.fd is not None
        self.announce_fd(segment.arena_id, segment.index, segment.size, segment.fd)

    def announce_fd(self, arena_id: int, index: int, size: int, fd: int) -> None:
        payload = msg.SegmentAnnounce(arena_id, index, size).encode()
        send_fds(self.sock, payload, [fd])
        self.announced.add((arena_id, index))

    def forward(self, locations: Sequence[Location], tensors: Tensors) -> None:
        """Make sure the stub can reach every tensor: the fds of segments new to it, the IPC
        handles of CUDA pool chunks new to it (client regions it maps by name)."""
        for location in locations:
            kind = type(location)
            if kind is Block:
                block: Block = location  # type: ignore[assignment]
                key = (block.arena_id, block.segment)
                if block.arena_id != self.output_arena_id and key not in self.announced:
                    fd, size = tensors.fd(*key)
                    self.announce_fd(block.arena_id, block.segment, size, fd)
            elif kind is CudaLocation:
                cuda: CudaLocation = location  # type: ignore[assignment]
                key = (cuda.device, split_key(cuda.offset)[0])
                if key not in self.cuda_chunks:
                    send_fds(self.sock, msgpack.packb(tensors.cuda_chunk(cuda).to_wire()), [])
                    self.cuda_chunks.add(key)

    def spawn(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None]) -> None:
        fds = [self._child_sock.fileno(), *self.channel.child_fds()]
        self._proc = subprocess.Popen(
            self._argv(fds),
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **self.launch.env, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self._child_sock.close()
        self._watch_exit(self._proc, loop, on_exit)
        for pipe in (self._proc.stdout, self._proc.stderr):
            assert pipe is not None
            self._forward_pipe(loop, pipe.fileno())
        assert self._proc.stderr is not None
        self._stderr_fd = self._proc.stderr.fileno()

    def _argv(self, fds: list[int]) -> list[str]:
        """``python -m shoal.stub`` with its socket and ring fds (``fds``)."""
        channel = ",".join(str(fd) for fd in fds[1:])
        return [
            *(self.launch.python, "-m", "shoal.stub", "--socket", str(fds[0])),
            *("--channel", channel, "--parent", str(os.getpid())),
            *("--instance", self.launch.instance_name),
        ]

    def _watch_exit(
        self,
        proc: subprocess.Popen[bytes],
        loop: asyncio.AbstractEventLoop,
        on_exit: Callable[[int], None],
    ) -> None:
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except BaseException:  # no descriptor left to watch it with: it must not run unwatched
            proc.kill()
            self.returncode = proc.wait()
            self.exited.set_result(self.returncode)
            raise
        loop.add_reader(self._pidfd, self._reap, loop, on_exit)

    def _forward_pipe(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        """Log what the stub prints on ``fd`` (its stdout or stderr), line by line."""
        os.set_blocking(fd, False)
        self._pipes.append(fd)
        loop.add_reader(fd, self._forward_output, fd)

    def _forward_output(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            asyncio.get_running_loop().remove_reader(fd)
            self._flush_partial(fd)
            return
        data = self._partial.pop(fd, b"") + chunk
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[fd] = rest
        for line in lines:
            self._log_line(fd, line)

    def _flush_partial(self, fd: int) -> None:
        rest = self._partial.pop(fd, b"")
        if rest:
            self._log_line(fd, rest)

    def _log_line(self, fd: int, line: bytes) -> None:
        # A Triton stub writes to the server's own stdout and stderr: its stderr stays stderr.
        extra = {"stderr": fd == self._stderr_fd}
        log.info("[%s] %s", self.launch.instance_name, line.decode(errors="replace"), extra=extra)

    def _reap(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None]) -> None:
        loop.remove_reader(self._pidfd)
        assert self._proc is not None
        # Drain what the stub printed last: it often says why it died.
        for fd in self._pipes:
            self._drain_pipe(loop, fd)
        self.returncode = self._proc.wait()
        self.channel.mark_peer_dead()
        if not self.exited.done():
            self.exited.set_result(self.returncode)
        on_exit(self.returncode)

    def _drain_pipe(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        loop.remove_reader(fd)
        while True:
            try:
                chunk = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            self._partial[fd] = self._partial.get(fd, b"") + chunk
        data = self._partial.pop(fd, b"")
        for line in data.splitlines():
            self._log_line(fd, line)

    def watch_up(self, loop: asyncio.AbstractEventLoop, ready: Callable[[], object]) -> None:
        self.channel.watch_up(loop, ready)

    def recv_up_nowait(self) -> bytes | None:
        return self.channel.recv_up_nowait()

    def send(self, message: msg.Message, ring: bool = True) -> bool:
        """Queue a message for the stub; False if the ring is full."""
        return self.channel.send_down_nowait(msg.encode(message), ring)

    def wake(self) -> None:
        self.channel.wake_down()

    async def send_async(self, message: msg.Message) -> None:
        await self.channel.send_down(msg.encode(message))

    def _receive_announcements(self, arena_id: int, index: int) -> None:
        # The stub sends a segment's fd before any message that refers to it, so it is there.
        while not self.outputs.has(arena_id, index):
            self._receive_announcement()

    def _receive_announcement(self) -> None:
        self.sock.settimeout(5.0)
        payload, fds = recv_fds(self.sock)
        announce = msg.SegmentAnnounce.decode(payload)
        key = (announce.arena_id, announce.segment)
        self._segment_fds[key] = (os.dup(fds[0]), announce.size)
        self.outputs.add_fd(announce.arena_id, announce.segment, fds[0], announce.size)

    def drop_output_segment(self, index: int) -> None:
        """The stub retired one of its output segments: close our mapping and fd of it.

        Its announcement may still be unread in the socket (the stub sent it before the
        retirement), so what the socket holds now is read first.
        """
        try:
            while readable_now(self.sock):
                self._receive_announcement()
        except PeerGone:
            pass  # the stub has exited; what it sent before is read
        key = (self.output_arena_id, index)
        kept = self._segment_fds.pop(key, None)
        if kept is not None:
            os.close(kept[0])
        self.outputs.retire(*key)

    def mapped_segment(self, arena_id: int, index: int) -> Segment:
        """The supervisor's mapping of one of this stub's output segments."""
        self._receive_announcements(arena_id, index)
        return self.outputs.segment(arena_id, index)

    def segment_fd(self, arena_id: int, index: int) -> tuple[int, int]:
        """(fd, size) of one of this stub's output segments, to hand to another stub."""
        self._receive_announcements(arena_id, index)
        return self._segment_fds[(arena_id, index)]

    def output_view(self, block: Block) -> memoryview:
        """A read-only view of a block in this stub's output arena."""
        self._receive_announcements(block.arena_id, block.segment)
        return self.outputs.view(block).toreadonly()

    def kill(self) -> None:
        if self._proc is not None and self.returncode is None:
            try:
                self._proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        if self._proc is not None and self.returncode is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Release every fd and mapping; the process must have exited."""
        for fd in self._pipes:
            loop.remove_reader(fd)
        for pipe in (self._proc.stdout, self._proc.stderr) if self._proc else ():
            if pipe is not None:
                pipe.close()
        self._pipes = []
        if self._pidfd >= 0:
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        self.channel.close()
        self.sock.close()
        for fd, _ in self._segment_fds.values():
            os.close(fd)
        self._segment_fds.clear()
        if not self._child_sock._closed:  # type: ignore[attr-defined]
            self._child_sock.close()
        self.outputs.close()
