"""A stub's channel: two SPSC byte rings in one shared control segment, with eventfd doorbells.

The supervisor end comes from :meth:`Channel.create`, the stub end from :meth:`Channel.attach`.
"down" carries supervisor -> stub messages, "up" stub -> supervisor. A consumer that finds its
ring empty marks itself asleep and sleeps on a doorbell; a producer rings that doorbell only when
the mark is set, so a busy pipeline makes no system call per message. docs/ipc.md has the layout
and the argument for why no wake-up is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Final

from shoal.ipc import busy_poll
from shoal.ipc._bell import (
    BACKSTOP_S,
    AsyncSleeper,
    Backstop,
    BlockingSleeper,
    Deadline,
    Spinner,
    drain_bell,
    new_bell,
    ring_bell,
)
from shoal.ipc._errors import PeerGone, RingCorrupted
from shoal.ipc._ring import HEADER_BYTES, Ring

__all__ = ["DEFAULT_RING_BYTES", "Channel", "PeerGone", "RingCorrupted"]

DEFAULT_RING_BYTES: Final = 1 << 20
#: Longest the stub spins on an empty down ring before sleeping; adapted per channel (see
#: ``Spinner``). 0 disables spinning.
DEFAULT_SPIN_US: Final = 50.0

_MAGIC: Final = int.from_bytes(b"shoalch1", "little")
_DATA_START: Final = 4096
# Word indexes in the control segment: magic, ring size, then each side's "closed" flag and the
# two ring headers, all on separate cache lines.
_W_MAGIC, _W_RING_BYTES = 0, 1
_W_SUPERVISOR_CLOSED, _W_STUB_CLOSED = 8, 16
_DOWN_HEADER, _UP_HEADER = HEADER_BYTES // 8, 2 * HEADER_BYTES // 8


class Channel:
    """One end of a supervisor <-> stub channel. Not shared between processes after attach."""

    def __init__(self, fds: list[int], *, supervisor: bool, peer_pidfd: int | None) -> None:
        control, self._down_bell, self._down_space, self._up_bell, self._up_space = fds
        self._fds = list(fds)
        self._peer_pidfd = peer_pidfd
        self._supervisor = supervisor
        self._mapping = mmap.mmap(control, os.fstat(control).st_size)
        self._words = memoryview(self._mapping).cast("Q")
        if self._words[_W_MAGIC] != _MAGIC:
            self._mapping.close()
            raise ValueError("fd 0 of the channel is not a shoal control segment")
        ring_bytes = self._words[_W_RING_BYTES]
        data = memoryview(self._mapping)
        self._down = Ring(self._words, _DOWN_HEADER, data[_DATA_START : _DATA_START + ring_bytes])
        self._up = Ring(self._words, _UP_HEADER, data[_DATA_START + ring_bytes :])
        data.release()
        self._own_closed = _W_SUPERVISOR_CLOSED if supervisor else _W_STUB_CLOSED
        self._peer_closed = _W_STUB_CLOSED if supervisor else _W_SUPERVISOR_CLOSED
        self._peer_dead = False
        self._closed = False
        self._send_lock: asyncio.Lock | None = None
        self._senders_waiting = 0
        self._up_lock = threading.Lock()
        self._spinner = Spinner(DEFAULT_SPIN_US)
        self._watch: tuple[asyncio.AbstractEventLoop, Callable[[], object]] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._down_sleeper = BlockingSleeper(self._down_bell, peer_pidfd)
        self._up_space_sleeper = BlockingSleeper(self._up_space, peer_pidfd)
        self._async_down = AsyncSleeper(self._down_bell, peer_pidfd)
        self._async_space = AsyncSleeper(self._down_space)

    # construction

    @classmethod
    def create(cls, ring_bytes: int = DEFAULT_RING_BYTES, down_bell: int | None = None) -> Channel:
        """The supervisor end of a new channel; pass :meth:`child_fds` to the stub.

        ``down_bell``: the stub's doorbell of another channel, shared (a copy of the fd) so that
        the stub sleeps on one fd for all its down rings (``down_set.py``)."""
        if ring_bytes < 4096 or ring_bytes & (ring_bytes - 1):
            raise ValueError(f"ring_bytes must be a power of two >= 4096, got {ring_bytes}")
        control = os.memfd_create("shoal-channel", os.MFD_CLOEXEC)
        fds = [control]
        try:
            os.ftruncate(control, _DATA_START + 2 * ring_bytes)
            with mmap.mmap(control, _DATA_START) as header:
                words = memoryview(header).cast("Q")
                words[_W_MAGIC] = _MAGIC
                words[_W_RING_BYTES] = ring_bytes
                # Both consumers start asleep (episode 1) so the first message rings the bell.
                words[_DOWN_HEADER + 2] = words[_UP_HEADER + 2] = 1
                words.release()
            fds.append(new_bell() if down_bell is None else os.dup(down_bell))
            fds += [new_bell() for _ in range(3)]
            return cls(fds, supervisor=True, peer_pidfd=None)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def child_fds(self) -> list[int]:
        """[control segment, down bell, down space bell, up bell, up space bell]: for attach()."""
        return list(self._fds)

    @classmethod
    def attach(
        cls,
        fds: list[int],
        *,
        peer_pidfd: int | None = None,
        spin_us: float = DEFAULT_SPIN_US,
    ) -> Channel:
        """The stub end, from the fds of :meth:`child_fds` (owned by the channel from now on).

        ``peer_pidfd`` (``os.pidfd_open(os.getppid())``, also owned) makes blocking waits raise
        PeerGone as soon as the supervisor dies; without it they poll the parent pid.
        """
        if len(fds) != 5:
            raise ValueError(f"a channel is attached from 5 fds, got {len(fds)}")
        channel = cls(list(fds), supervisor=False, peer_pidfd=peer_pidfd)
        channel._spinner = Spinner(spin_us)
        return channel

    @classmethod
    def adopt(cls, fds: list[int], *, peer_pidfd: int | None = None) -> Channel:
        """A supervisor end from the fds of a channel another process created (a frontend
        worker's direct channel to a stub, made by the core); owns them from now on."""
        if len(fds) != 5:
            raise ValueError(f"a channel is adopted from 5 fds, got {len(fds)}")
        return cls(list(fds), supervisor=True, peer_pidfd=peer_pidfd)

    @property
    def down_bell(self) -> int:
        """The stub's doorbell for this channel's down ring (see ``create``'s ``down_bell``)."""
        return self._down_bell

    @property
    def ring_capacity(self) -> int:
        return self._down.capacity

    @property
    def peer_closed(self) -> bool:
        """True once the other end called close() (a clean shutdown, unlike a crash)."""
        return self._closed or bool(self._words[self._peer_closed])

    # supervisor end

    def send_down_nowait(self, payload: bytes, ring: bool = True) -> bool:
        """Queue a message for the stub; False when the ring is full.

        ``ring=False`` leaves a sleeping stub asleep: for a message it will read before it
        needs it anyway. Whoever sends so owes the stub a :meth:`wake_down` later.
        """
        if self._peer_dead:
            raise PeerGone("the stub is gone")
        if not self._down.try_write(payload):
            return False
        if ring and self._down.consumer_wants_bell():
            ring_bell(self._down_bell)
        busy_poll.kick()
        return True

    def wake_down(self) -> None:
        """Ring the stub's doorbell if it sleeps on messages sent with ``ring=False``.

        The fence in ``consumer_wants_bell`` orders those messages' tail stores before its load
        of the stub's sleep word: a stub that began to sleep after them saw them.
        """
        if not self._peer_dead and not self._closed and self._down.consumer_wants_bell():
            ring_bell(self._down_bell)

    async def send_down(self, payload: bytes) -> None:
        """Queue a message, waiting (without blocking the loop) while the ring is full."""
        # Senders already waiting go first. Counted here, not asked of the lock: its
        # ``locked()`` is interpreted Python, and this runs for every batch.
        if not self._senders_waiting and self.send_down_nowait(payload):
            return
        if self._send_lock is None:
            self._send_lock = asyncio.Lock()
        self._senders_waiting += 1
        try:
            async with self._send_lock:
                while not self.send_down_nowait(payload):
                    await self._wait_down_room(len(payload))
        finally:
            self._senders_waiting -= 1

    async def _wait_down_room(self, size: int) -> None:
        # The stub rings once per wait episode, and what it had freed by then may be less than
        # this message needs: so every doorbell wake-up starts a new episode.
        while not self._down.has_room(size):
            self._down.begin_wait(size)
            try:
                backstop = Backstop()
                while not self._down.has_room(size):
                    if self._peer_dead or self.peer_closed:
                        raise PeerGone("the stub is gone")
                    if await self._async_space.sleep(backstop.timeout()):
                        break
            finally:
                self._down.end_wait()

    def recv_up_nowait(self) -> bytes | None:
        """The next message from the stub, or None; None also re-arms the doorbell."""
        message = self._up.try_read()
        if message is None:
            self._up.begin_sleep()
            message = self._up.try_read()
            if message is None:
                return None
            self._up.end_sleep()
        if self._up.producer_wants_bell():
            ring_bell(self._up_space)
        return message

    def watch_up(self, loop: asyncio.AbstractEventLoop, on_ready: Callable[[], object]) -> None:
        """Call ``on_ready`` on ``loop`` whenever up messages may be waiting.

        ``on_ready`` must drain with :meth:`recv_up_nowait` until it returns None, or return
        False after reading its share: it is then called again on the loop's next turn (no
        doorbell rings for what it left, since the ring was never found empty).
        """
        if self._watch is not None:
            self._watch[0].remove_reader(self._up_bell)
        self._watch = (loop, on_ready)
        loop.add_reader(self._up_bell, self._on_up_bell)
        # Messages sent before the watch began may have rung the bell before anyone listened.
        loop.call_soon(self._deliver)

    def _on_up_bell(self) -> None:
        drain_bell(self._up_bell)
        self._deliver()

    def _deliver(self) -> None:
        if self._watch is None or self._closed:
            return
        try:
            more = self._watch[1]()
        except BaseException:
            # The callback stopped before draining to None, so no sleep episode began and the
            # stub will not ring: look at the ring again shortly.
            if self._retry is None:
                self._retry = self._watch[0].call_later(BACKSTOP_S, self._redeliver)
            raise
        if more is False:  # it read its share: the loop's other callbacks run first
            self._watch[0].call_soon(self._deliver)

    def _redeliver(self) -> None:
        self._retry = None
        if not self._closed and not self._up.is_empty():
            self._deliver()

    def mark_peer_dead(self) -> None:
        """The stub died: pending and future sends raise PeerGone."""
        self._peer_dead = True
        self._async_space.fail_all("the stub is gone")

    # stub end

    def recv_down_nowait(self) -> bytes | None:
        message = self._down.try_read()
        if message is not None and self._down.producer_wants_bell():
            ring_bell(self._down_space)
        return message

    def begin_down_sleep(self) -> None:
        """Mark the stub asleep on the down ring (``DownSet``: one sleep over several rings);
        the caller looks at the ring once more before it sleeps."""
        self._down.begin_sleep()

    def end_down_sleep(self) -> None:
        self._down.end_sleep()

    def sleep_on_down_bell(self, timeout: float | None) -> bool:
        """Sleep on the down doorbell: True when it rang; PeerGone if the peer died."""
        return self._down_sleeper.sleep(timeout)

    def down_is_empty(self) -> bool:
        """Nothing waits in the supervisor→stub ring now (a peek: no bell, no lock)."""
        return self._down.is_empty()

    def recv_down(self, timeout: float | None = None) -> bytes:
        """The next message from the supervisor; blocks, spinning briefly first.

        Raises PeerGone once the supervisor died or closed the channel (after draining it),
        TimeoutError after ``timeout`` seconds.
        """
        message = self._down.try_read()
        if message is None:
            message = self._wait_down(timeout)
        if self._down.producer_wants_bell():
            ring_bell(self._down_space)
        return message

    def _wait_down(self, timeout: float | None) -> bytes:
        started = time.perf_counter_ns()
        message = self._spin_down(started)
        if message is None:
            message = self._sleep_down(Deadline(timeout))
            self._spinner.observe_sleep(time.perf_counter_ns() - started)
        return message

    def _spin_down(self, started: int) -> bytes | None:
        end = started + self._spinner.budget_ns
        try_read = self._down.try_read
        clock = time.perf_counter_ns
        while clock() < end:
            message = try_read()
            if message is not None:
                return message
        return None

    def _sleep_down(self, deadline: Deadline) -> bytes:
        while (message := self._down_episode(deadline)) is None:
            pass
        return message

    def _down_episode(self, deadline: Deadline) -> bytes | None:
        """One sleep episode: a message, or None once a doorbell was consumed.

        An episode must end at its first doorbell: the supervisor rings once per episode, and
        that ring may announce a message this side already took before the episode began.
        """
        self._down.begin_sleep()
        try:
            while (message := self._down.try_read()) is None:
                if self.peer_closed:
                    raise PeerGone("the supervisor closed the channel")
                if self._down_sleeper.sleep(deadline.remaining()):
                    return self._down.try_read()
            return message
        finally:
            self._down.end_sleep()

    async def recv_down_async(self) -> bytes:
        """Like :meth:`recv_down` for a stub that runs an event loop (no spinning)."""
        while (message := self._down.try_read()) is None:
            self._down.begin_sleep()
            try:
                while self._down.is_empty():
                    if self.peer_closed:
                        raise PeerGone("the supervisor closed the channel")
                    if await self._async_down.sleep(None):
                        break  # as in _down_episode: a doorbell ends the episode
            finally:
                self._down.end_sleep()
        if self._down.producer_wants_bell():
            ring_bell(self._down_space)
        return message

    def send_up(self, payload: bytes, timeout: float | None = None) -> None:
        """Queue a message for the supervisor, blocking while the ring is full. Thread-safe."""
        with self._up_lock:
            if self._words[self._peer_closed]:
                raise PeerGone("the supervisor closed the channel")
            if not self._up.try_write(payload):
                self._wait_up_room(len(payload), Deadline(timeout))
                if not self._up.try_write(payload):
                    raise RingCorrupted("up ring had room but the write failed")
            if self._up.consumer_wants_bell():
                ring_bell(self._up_bell)

    def _wait_up_room(self, size: int, deadline: Deadline) -> None:
        # As in _wait_down_room: a new wait episode after every doorbell wake-up.
        while not self._up.has_room(size):
            self._up.begin_wait(size)
            try:
                backstop = Backstop()
                while not self._up.has_room(size):
                    if self.peer_closed:
                        raise PeerGone("the supervisor closed the channel")
                    timeout = deadline.remaining(backstop.timeout())
                    if self._up_space_sleeper.sleep(timeout):
                        break
            finally:
                self._up.end_wait()

    # both ends

    def close(self) -> None:
        """Tell the peer, unmap and close every fd (the peer pidfd too); idempotent."""
        if self._closed:
            return
        self._words[self._own_closed] = 1
        # Wake whatever the peer may be sleeping on so it sees the flag now.
        peer_bells = (
            (self._down_bell, self._up_space)
            if self._supervisor
            else (self._up_bell, self._down_space)
        )
        for bell in peer_bells:
            with contextlib.suppress(OSError):
                ring_bell(bell)
        self.forget()
        if self._peer_pidfd is not None:
            os.close(self._peer_pidfd)

    def forget(self) -> None:
        """Unmap and close this process's fds without telling the peer: for a copy of a channel
        handed to others (its fds sent to both ends); :meth:`close` does this after the flag."""
        if self._closed:
            return
        self._closed = True
        self._detach_loop()
        self._down.release()
        self._up.release()
        self._words.release()
        with contextlib.suppress(BufferError):
            self._mapping.close()
        for fd in self._fds:
            os.close(fd)

    def _detach_loop(self) -> None:
        if self._watch is not None:
            self._watch[0].remove_reader(self._up_bell)
            self._watch = None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._async_space.close("the channel was closed")
        self._async_down.close("the channel was closed")

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
